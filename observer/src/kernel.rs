//! The kernel side, as userspace sees it: [`bpf`] loads and attaches the
//! probes (the only aya user) and reads their maps, [`btf`] resolves the
//! field offsets they load with, [`event`] decodes their records into typed
//! events, and [`owner`] names the process, container and pod of a socket.
//! Everything downstream works on [`event::SockEvent`], live or recorded.

pub mod bpf;
pub mod btf;
pub mod event;
pub mod first_bytes;
pub mod owner;
pub mod runtime;
