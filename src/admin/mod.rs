//! The admin server, on its own address and never on the data port: `/metrics`
//! (OpenMetrics text, or the Prometheus protobuf exposition with the native histograms
//! when the scraper asks: [`exposition`]), `/api/v1/*` (recent records, summary, timeline, capacity, drift,
//! calibration as JSON), the live dashboard at `/` ([`dashboard`]), `/healthz`, `/readyz`;
//! optionally behind a bearer token ([`auth`]) and TLS.

mod auth;
mod dashboard;
pub mod exposition;
mod server;

pub use dashboard::url as dashboard_url;
pub use server::{Admin, serve};

use prometheus_client::{metrics::counter::Counter, registry::Registry};

/// The admin server's own metrics.
#[derive(Clone, Debug, Default)]
pub struct AdminMetrics {
    /// Admin requests refused for a missing or wrong bearer token.
    pub unauthorized: Counter,
}

impl AdminMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> AdminMetrics {
        let m = AdminMetrics::default();
        crate::metrics::names::ADMIN_UNAUTHORIZED.register(registry, m.unauthorized.clone());
        m
    }
}
