//! Which row of one destination a command means (`report` and `path
//! check`'s `--role` and `--netns`), and the error that lists the
//! candidates when none or several match.

use crate::{diagnosis::key::Netns, diagnosis::table::DestinationRow, kernel::event::Role};

/// Which row of one destination a command means (`report` and `path
/// check`'s `--role` and `--netns`): the one that matches, or an error
/// that lists the candidates. `netns` is an inode as the sockets carry
/// it; the host's namespace (rows with `netns: null`) matches its own
/// inode and 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Select {
    pub role: Option<Role>,
    pub netns: Option<u32>,
}

/// No single row matched a [`Select`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("no evidence for {destination}{wanted}{seen}")]
    NoRow { destination: String, wanted: String, seen: String },
    #[error("{destination} was seen as {} rows: {}; choose one with {flags}", .candidates.len(), .candidates.join("; "))]
    Ambiguous { destination: String, candidates: Vec<String>, flags: &'static str },
}

/// A row's role and namespace as the flags that choose it.
#[must_use]
pub fn describe(role: Role, netns: Netns, with_role: bool) -> String {
    let role = if with_role { format!("--role {} ", role.as_str()) } else { String::new() };
    match netns.inode() {
        Some(n) => format!("{role}--netns {n}"),
        None => format!("{role}--netns 0 (the host's namespace)"),
    }
}

impl Select {
    /// Does a row of this role and namespace match? `host_netns` is the
    /// inode rows show as null (0 when unknown).
    #[must_use]
    pub fn matches(&self, role: Role, netns: Netns, host_netns: u32) -> bool {
        self.role.is_none_or(|r| r == role)
            && self.netns.is_none_or(|want| match netns.inode() {
                Some(n) => n == want,
                None => want == 0 || want == host_netns,
            })
    }

    /// The one row of `destination` that matches.
    pub fn pick<'a>(
        &self,
        rows: &'a [DestinationRow],
        destination: &str,
        host_netns: u32,
    ) -> Result<&'a DestinationRow, SelectError> {
        let mine: Vec<&DestinationRow> = rows.iter().filter(|r| r.id.destination == destination).collect();
        let fit: Vec<&DestinationRow> =
            mine.iter().copied().filter(|r| self.matches(r.id.role, r.id.netns, host_netns)).collect();
        match fit.as_slice() {
            [one] => Ok(one),
            [] => Err(SelectError::NoRow {
                destination: destination.to_owned(),
                wanted: match (self.role, self.netns) {
                    (None, None) => String::new(),
                    (r, n) => format!(
                        " with{}{}",
                        r.map(|r| format!(" --role {}", r.as_str())).unwrap_or_default(),
                        n.map(|n| format!(" --netns {n}")).unwrap_or_default()
                    ),
                },
                seen: if mine.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; it was seen as: {}",
                        mine.iter().map(|r| describe(r.id.role, r.id.netns, true)).collect::<Vec<_>>().join("; ")
                    )
                },
            }),
            many => {
                // Roles named only where they tell the rows apart.
                let roles = many.iter().any(|r| r.id.role != many[0].id.role);
                Err(SelectError::Ambiguous {
                    destination: destination.to_owned(),
                    candidates: many.iter().map(|r| describe(r.id.role, r.id.netns, roles)).collect(),
                    flags: if roles { "--role and --netns" } else { "--netns" },
                })
            }
        }
    }
}
