//! The admin server, on its own address and never on the data port: `/metrics`
//! (OpenMetrics), `/api/v1/requests` (recent records as JSON), `/healthz`, `/readyz`.

pub mod metrics;
mod server;

pub use server::{Admin, serve};
