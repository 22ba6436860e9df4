//! The command bodies: each takes its clap arguments ([`crate::cli`]),
//! calls the rooms below (the diagnosis, the surfaces, the path check, the
//! probe) and writes the answer with its exit code. The only place besides
//! the daemon's wiring that knows the command line: `surfaces/`, `path/`
//! and `probe/` take plain values.

pub mod path;
pub mod probe;
pub mod report;
pub mod status;
