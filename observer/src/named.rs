//! Names from one place: an enum declared with [`named!`] gets its stable
//! name per value (`as_str`, the JSON and every label and text), `parse`,
//! `ALL`, and serde from that one list, so the spellings cannot drift.

/// Declare a unit enum with one stable name per value:
///
/// ```ignore
/// named! {
///     /// Doc.
///     pub enum Role { Client => "client", Server => "server" }
/// }
/// ```
macro_rules! named {
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
