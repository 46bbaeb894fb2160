//! The engine's own per-request timings on `/metrics`: one histogram per part of a
//! request's time (queue, prefill, decode, inference, outside the engine) and model, and
//! the per-request objective headers that were ignored for a bad value. Registered by the
//! aggregator's owner beside the other metrics; names in [`crate::metrics::names`].

use prometheus_client::{
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::measure::RequestRecord;
use crate::metrics::{ModelPhase, names};

/// From 100 µs (queue time of an idle engine) to 10 minutes (a reasoning run's decode):
/// every part of a request's time fits, whatever its length.
pub const PHASE_BUCKETS: [f64; 22] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// What the engine's per-request timings count.
#[derive(Clone, Debug)]
pub struct PhaseMetrics {
    /// Seconds per part and model (`phase`: `queue`, `prefill`, `decode`, `inference`,
    /// `outside_engine`); negative parts (the engine's clock ahead) count as 0.
    pub phases: HistogramFamily<ModelPhase>,
    /// Objective headers present with a value that is not a positive number.
    pub header_objectives_invalid: Counter,
}

impl Default for PhaseMetrics {
    fn default() -> Self {
        PhaseMetrics {
            phases: Family::new_with_constructor(|| Histogram::new(PHASE_BUCKETS)),
            header_objectives_invalid: Counter::default(),
        }
    }
}

impl PhaseMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            names::REQUEST_PHASE,
            "Where each request's time went by the engine's own per-request timings (vLLM metrics, SGLang meta_info, TGI headers): engine queue, prefill, decode, inference (prefill and decode where the engine does not split them) and outside the engine (recorded TTFT minus queue and prefill)",
            Unit::Seconds,
            self.phases.clone(),
        );
        registry.register(
            names::SLO_HEADER_OBJECTIVES_INVALID,
            "Per-request objective headers (x-llm-d-slo-ttft-ms and the like) ignored because their value is not a positive number",
            self.header_objectives_invalid.clone(),
        );
    }

    /// Counts one finished request under its `model` label.
    pub fn observe(&self, record: &RequestRecord, model: &str) {
        if record.slo_header_invalid > 0 {
            self.header_objectives_invalid
                .inc_by(u64::from(record.slo_header_invalid));
        }
        for (part, ms) in record.engine.parts() {
            if let Some(ms) = ms {
                self.phases
                    .get_or_create(&ModelPhase {
                        model: model.to_owned(),
                        phase: part.as_str(),
                    })
                    .observe(ms.max(0.0) / 1000.0);
            }
        }
    }
}
