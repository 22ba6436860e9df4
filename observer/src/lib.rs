//! observer: attributes resets, EOFs and stalls on reused TCP sockets to the
//! idle age of the socket, from the kernel.
//!
//! The tree follows the data, kernel -> diagnosis -> surfaces:
//!
//! - [`kernel`]: [`kernel::bpf`] (loading and attaching, the only aya user),
//!   [`kernel::btf`] (field offsets), [`kernel::event`] (decoding records
//!   into typed events), [`kernel::owner`] (process, container, pod of a
//!   socket);
//! - [`diagnosis`]: [`diagnosis::evidence`] (what each event proves),
//!   [`diagnosis::estimate`] (the interval and point rules),
//!   [`diagnosis::verdict`], [`diagnosis::aggregate`] (per-row state),
//!   [`diagnosis::table`] (the row, its identity and selection);
//! - [`surfaces`]: [`surfaces::http`] (the API), [`surfaces::metrics`],
//!   [`surfaces::status`], [`surfaces::report`], [`surfaces::store`] (the
//!   evidence store);
//! - beside them: [`path`] (path files and their check against what was
//!   observed), [`probe`] (a path's idle timeout measured on demand, with
//!   plain sockets), and the program: [`cli`] (arguments), [`config`] (the
//!   config file), [`commands`] (each command's body: the only place
//!   besides the daemon that knows the command line), [`daemon`] (the
//!   `run` command wiring the three);
//!   [`units`] writes durations for all of them. The pipeline benchmark is
//!   a bench target (`benches/pipeline.rs`), not part of the binary.

pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod diagnosis;
pub mod files;
pub mod kernel;
mod named;
pub mod path;
pub mod probe;
pub mod surfaces;
pub mod units;
