//! What the proxy's resource bounds count ([`LimitMetrics`]). Names and help texts are in
//! [`crate::metrics::names`].

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::{LimitLabel, names};

/// What the proxy's resource bounds count (docs/CONFIG.md "Limits").
#[derive(Clone, Debug, Default)]
pub struct LimitMetrics {
    pub rejections: Family<LimitLabel, Counter>,
    pub client_connections: Gauge,
    pub accept_errors: Counter,
    /// Requests sent while every HTTP/2 upstream connection carried its most streams.
    pub http2_saturated: Counter,
}

/// Every `limit` label value, exported from the start (at 0) so that a rate over them is
/// defined before the first rejection.
pub const LIMITS: [&str; 5] = [
    "server.max_connections",
    "server.http2_max_control_frames_per_second",
    "server.max_request_header_bytes",
    "server.request_body_timeout",
    "upstream.max_connections",
];

impl LimitMetrics {
    /// One more piece of work turned away by `limit` (a config key, one of [`LIMITS`]).
    pub fn rejected(&self, limit: &'static str) {
        self.rejections.get_or_create(&LimitLabel { limit }).inc();
    }

    /// Creates the handles and registers them in `registry`; every `limit` label of
    /// [`LIMITS`] is exported from the start, at 0.
    pub fn register(registry: &mut Registry) -> LimitMetrics {
        let m = LimitMetrics::default();
        for limit in LIMITS {
            let _ = m.rejections.get_or_create(&LimitLabel { limit });
        }
        names::LIMIT_REJECTIONS.register(registry, m.rejections.clone());
        names::CLIENT_CONNECTIONS.register(registry, m.client_connections.clone());
        names::ACCEPT_ERRORS.register(registry, m.accept_errors.clone());
        names::UPSTREAM_HTTP2_SATURATED.register(registry, m.http2_saturated.clone());
        m
    }
}
