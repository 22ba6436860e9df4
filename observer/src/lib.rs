//! observer: attributes resets, EOFs and stalls on reused TCP sockets to the
//! idle age of the socket, from the kernel.
//!
//! The data flows kernel -> diagnosis -> surfaces:
//!
//! - kernel: [`bpf`] (loading and attaching, the only aya user), [`btf`]
//!   (field offsets), [`event`] (decoding records into typed events),
//!   [`owner`] (process, container, pod of a socket);
//! - diagnosis: [`evidence`] (what each event proves), [`estimate`] (the
//!   interval and point rules), [`verdict`], [`aggregate`] (per-row state),
//!   [`table`] (the row, its identity and selection);
//! - surfaces: [`http`] (the API), [`metrics`], [`status`], [`report`],
//!   [`store`] (the evidence store), [`path`] (path files and their check);
//! - the program: [`cli`] (arguments), [`config`] (the config file),
//!   [`daemon`] (the `run` command), [`bench`] (benchmark helpers).

pub mod aggregate;
pub mod bench;
pub mod bpf;
pub mod btf;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod estimate;
pub mod event;
pub mod evidence;
pub mod http;
pub mod metrics;
mod names;
pub mod owner;
pub mod path;
pub mod report;
pub mod status;
pub mod store;
pub mod table;
pub mod verdict;
