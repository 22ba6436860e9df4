//! Where the diagnosis is seen and kept: [`http`] (the API server and
//! client), [`metrics`] (Prometheus), [`status`] (the command line's table),
//! [`report`] (evidence reports) and [`store`] (the evidence store).

pub mod http;
pub mod metrics;
pub mod otlp;
pub mod report;
pub mod status;
pub mod store;
