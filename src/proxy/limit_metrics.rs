//! What the proxy's resource bounds count ([`LimitMetrics`]). Names and help texts are in
//! [`crate::metrics::names`].

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::{LimitLabel, ReasonLabel, ShareLabel, WaitingLabel, names};

/// What the proxy's resource bounds count (docs/CONFIG.md "Limits").
#[derive(Clone, Debug, Default)]
pub struct LimitMetrics {
    pub rejections: Family<LimitLabel, Counter>,
    pub client_connections: Gauge,
    pub accept_errors: Counter,
    /// Requests sent while every HTTP/2 upstream connection carried its most streams.
    pub http2_saturated: Counter,
    /// How the open-files limit is divided (`proxy::fds`), by share.
    pub file_budget: Family<ShareLabel, Gauge>,
    /// Client connections closed at `server.max_connections` to admit new ones, by what
    /// they were waiting for.
    pub closed_for_room: Family<WaitingLabel, Counter>,
    /// Upstream connections the pool closed after a complete response, by why.
    pub upstream_closed: Family<ReasonLabel, Counter>,
}

/// Every `reason` of `goodput_upstream_connections_closed_total` (the pool's `Closed`).
pub const UPSTREAM_CLOSED_REASONS: [&str; 5] = [
    "unsolicited_bytes",
    "closed_by_upstream",
    "idle_timeout",
    "pool_full",
    "not_reusable",
];

/// Every `limit` label value, exported from the start (at 0) so that a rate over them is
/// defined before the first rejection.
pub const LIMITS: [&str; 7] = [
    "server.max_connections",
    "server.http2_max_control_frames_per_second",
    "server.max_request_header_bytes",
    "server.request_body_timeout",
    "upstream.max_connections",
    "upstream.max_response_header_bytes",
    "upstream.min_body_rate",
];

impl LimitMetrics {
    /// One more piece of work turned away by `limit` (a config key, one of [`LIMITS`]).
    pub fn rejected(&self, limit: &'static str) {
        self.rejections.get_or_create(&LimitLabel { limit }).inc();
    }

    /// One more upstream connection closed by the pool, for `reason` (one of
    /// [`UPSTREAM_CLOSED_REASONS`]).
    pub fn upstream_closed(&self, reason: &'static str) {
        self.upstream_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
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
        names::FILE_BUDGET.register(registry, m.file_budget.clone());
        for waiting in ["first_request", "next_request"] {
            let _ = m.closed_for_room.get_or_create(&WaitingLabel { waiting });
        }
        names::CLOSED_FOR_ROOM.register(registry, m.closed_for_room.clone());
        for reason in UPSTREAM_CLOSED_REASONS {
            let _ = m.upstream_closed.get_or_create(&ReasonLabel { reason });
        }
        names::UPSTREAM_CONNECTIONS_CLOSED.register(registry, m.upstream_closed.clone());
        m
    }
}
