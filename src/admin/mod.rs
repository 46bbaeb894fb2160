//! The admin server, on its own address and never on the data port: `/metrics`
//! (OpenMetrics), `/api/v1/*` (recent records, summary, timeline, capacity, drift,
//! calibration as JSON), the live dashboard at `/` ([`dashboard`]), `/healthz`, `/readyz`;
//! optionally behind a bearer token ([`auth`]) and TLS.

mod auth;
mod dashboard;
mod server;

pub use dashboard::url as dashboard_url;
pub use server::{Admin, serve};
