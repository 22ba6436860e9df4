//! Names from one place: an enum declared with [`named!`] gets its stable
//! name per value (`as_str`, the JSON and every label and text), `parse`,
//! `ALL`, and serde from that one list, so the spellings cannot drift. An
//! enum that crosses the kernel boundary names each value's wire constant
//! (`observer_common`) in the same list, and gets its decoder, `of_wire`.

/// Declare a unit enum with one stable name per value:
///
/// ```ignore
/// named! {
///     /// Doc.
///     pub enum Role { Client => "client", Server => "server" }
/// }
/// ```
///
/// With wire values (`enum Name: wire`), each value may name the
/// `observer_common` constant the probes write for it; `of_wire` decodes:
///
/// ```ignore
/// named! {
///     pub enum Outcome: wire { Ok = outcome::OK => "ok", Eof = outcome::EOF => "eof" }
/// }
/// ```
macro_rules! named {
    ($(#[$meta:meta])* $vis:vis enum $name:ident: wire { $( $(#[$vmeta:meta])* $variant:ident $(= $wire:path)? => $text:literal ),+ $(,)? }) => {
        named! { $(#[$meta])* $vis enum $name { $( $(#[$vmeta])* $variant => $text ),+ } }

        impl $name {
            /// The value a wire constant names (None: none, or one this
            /// daemon does not know).
            #[must_use]
            pub const fn of_wire(v: u8) -> Option<Self> {
                match v {
                    $( $( $wire => Some(Self::$variant), )? )+
                    _ => None,
                }
            }
        }
    };
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The stable name: as JSON, metric labels and text spell it.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }

            /// The value a stable name names.
            #[must_use]
            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).ok_or_else(|| serde::de::Error::unknown_variant(&s, &[$($text),+]))
            }
        }
    };
}

pub(crate) use named;

#[cfg(test)]
mod tests {
    named! {
        /// A test enum.
        pub enum Color { Red => "red", DarkBlue => "dark_blue" }
    }

    const RED: u8 = 1;

    named! {
        /// A test enum with wire values, one without.
        pub enum Shade: wire { Light = RED => "light", Dark => "dark" }
    }

    #[test]
    fn one_list_gives_the_wire_decoder() {
        assert_eq!(Shade::of_wire(RED), Some(Shade::Light));
        assert_eq!(Shade::of_wire(0), None, "a value without a wire constant is never decoded");
        assert_eq!(Shade::Dark.as_str(), "dark");
    }

    #[test]
    fn one_list_gives_the_name_the_json_and_the_parse() {
        assert_eq!(Color::DarkBlue.as_str(), "dark_blue");
        assert_eq!(serde_json::to_string(&Color::DarkBlue).unwrap(), "\"dark_blue\"");
        assert_eq!(serde_json::from_str::<Color>("\"red\"").unwrap(), Color::Red);
        assert_eq!(Color::parse("dark_blue"), Some(Color::DarkBlue));
        let e = serde_json::from_str::<Color>("\"green\"").unwrap_err().to_string();
        assert!(e.contains("green") && e.contains("dark_blue"), "{e}");
        for c in Color::ALL {
            assert_eq!(Color::parse(c.as_str()), Some(*c));
        }
    }
}
