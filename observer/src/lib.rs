//! observer: attributes resets, EOFs and stalls on reused TCP sockets to the
//! idle age of the socket, from the kernel.
//!
//! Modules: [`bpf`] (the only aya user), [`event`] (typed events),
//! [`daemon`] (the `run` command), [`cli`] (arguments).

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
pub mod owner;
pub mod path;
pub mod report;
pub mod status;
pub mod store;
pub mod table;
pub mod verdict;
