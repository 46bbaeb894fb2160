//! The OTLP exporter's own health ([`OtlpMetrics`]). Names and help texts are in
//! [`crate::metrics::names`].

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::metrics::{DropReasonLabel, SignalLabel, names};

/// The OTLP exporter's own health (`[otlp]`).
#[derive(Clone, Debug, Default)]
pub struct OtlpMetrics {
    /// Export requests the collector accepted.
    pub exports: Family<SignalLabel, Counter>,
    /// Export requests that failed (refused, timed out, non-2xx).
    pub export_failures: Family<SignalLabel, Counter>,
    /// Spans lost: `queue_full` (the export queue was full), `export_failed`.
    pub spans_dropped: Family<DropReasonLabel, Counter>,
}

impl OtlpMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> OtlpMetrics {
        let m = OtlpMetrics::default();
        names::OTLP_EXPORTS.register(registry, m.exports.clone());
        names::OTLP_EXPORT_FAILURES.register(registry, m.export_failures.clone());
        names::OTLP_SPANS_DROPPED.register(registry, m.spans_dropped.clone());
        m
    }
}
