//! Placeholder library target: `observer/build.rs` has a build-dependency on
//! this crate so cargo rebuilds the daemon when the probes change; the probes
//! themselves are the `observer` binary target in `src/main.rs`.
#![no_std]
