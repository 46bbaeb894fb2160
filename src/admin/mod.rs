//! The admin server, on its own address and never on the data port: `/metrics`
//! (OpenMetrics), `/api/v1/*` (recent records, summary, capacity, drift, calibration as
//! JSON), `/healthz`, `/readyz`; optionally behind a bearer token ([`auth`]) and TLS.

mod auth;
pub mod metrics;
mod server;

pub use server::{Admin, serve};
