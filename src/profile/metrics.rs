//! Profile recording and live drift detection's metrics ([`ProfileMetrics`]). Names and
//! help texts are in [`crate::metrics::names`].

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::{DimensionLabel, DriftLabels, DropReasonLabel, UpstreamInfoLabels, names};

/// Profile recording and live drift detection (`[profile]`, `[drift]`).
#[derive(Clone, Debug)]
pub struct ProfileMetrics {
    pub profile_records: Counter,
    pub profile_dropped: Family<DropReasonLabel, Counter>,
    pub reacceptance: Family<DimensionLabel, Gauge>,
    pub profile_drift: Family<DriftLabels, Gauge<f64, AtomicU64>>,
    pub upstream_info: Family<UpstreamInfoLabels, Gauge>,
}

impl ProfileMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> ProfileMetrics {
        let m = ProfileMetrics {
            profile_records: Counter::default(),
            profile_dropped: Family::default(),
            reacceptance: Family::default(),
            profile_drift: Family::default(),
            upstream_info: Family::default(),
        };
        names::PROFILE_RECORDS.register(registry, m.profile_records.clone());
        names::PROFILE_DROPPED.register(registry, m.profile_dropped.clone());
        names::REACCEPTANCE.register(registry, m.reacceptance.clone());
        names::PROFILE_DRIFT.register(registry, m.profile_drift.clone());
        names::UPSTREAM_INFO.register(registry, m.upstream_info.clone());
        m
    }
}
