//! Two sinks of judged records on `/metrics` ([`super::Sink`], handed to the aggregator by
//! the wiring): the engine's own per-request timings ([`PhaseMetrics`]: one histogram per
//! part of a request's time and model, and the per-request objective headers ignored for a
//! bad value), and the OpenTelemetry GenAI conventions' latest client-inference names
//! ([`InferenceMetrics`], only under `OTEL_SEMCONV_STABILITY_OPT_IN`). Names and help texts
//! are in [`crate::metrics::names`].

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{Sink, engine::Gauges};
use crate::measure::{Outcome, RequestRecord};
use crate::metrics::{
    HistogramFamily, HistogramShape, INFERENCE_BUCKETS, ModelPhase, NativeBuckets, names,
};

/// From 100 µs (queue time of an idle engine) to 20 minutes (a reasoning run's decode):
/// every part of a request's time fits, whatever its length.
pub const PHASE_BUCKETS: [f64; 22] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
];

/// What the engine's per-request timings count.
#[derive(Clone, Debug)]
pub struct PhaseMetrics {
    /// Seconds per part and model (`phase`: `queue`, `prefill`, `decode`, `inference`,
    /// `outside_engine`); negative parts (the engine's clock ahead) count as 0.
    pub phases: HistogramFamily<ModelPhase>,
    /// Objective headers present with a value that is not a positive number.
    pub header_objectives_invalid: Counter,
}

impl PhaseMetrics {
    /// Creates the handles and registers them in `registry`, with native buckets beside
    /// the classic ones when `native` is set.
    pub fn register(registry: &mut Registry, native: Option<NativeBuckets>) -> PhaseMetrics {
        let m = PhaseMetrics {
            phases: Family::new_with_constructor(HistogramShape::latency(
                &PHASE_BUCKETS,
                &[],
                native,
            )),
            header_objectives_invalid: Counter::default(),
        };
        names::REQUEST_PHASE.register(registry, m.phases.clone());
        names::SLO_HEADER_OBJECTIVES_INVALID
            .register(registry, m.header_objectives_invalid.clone());
        m
    }
}

impl Sink for PhaseMetrics {
    fn observe(&self, record: &RequestRecord, model: &str, _gaps: &[u32]) {
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

    fn wants_gauges(&self) -> bool {
        false
    }

    fn refresh(&self, _: &Gauges<'_>) {}
}

/// `model` and `api` of a GenAI client-inference series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct InferenceLabels {
    pub model: String,
    pub api: &'static str,
}

/// The OpenTelemetry GenAI conventions' latest client-inference instruments in their
/// Prometheus forms, exported beside the older names when `OTEL_SEMCONV_STABILITY_OPT_IN`
/// contains `gen_ai_latest_experimental`: latencies measured at a proxy are the client's
/// view of inference.
#[derive(Clone, Debug)]
pub struct InferenceMetrics {
    pub duration: HistogramFamily<InferenceLabels>,
    pub time_to_first_chunk: HistogramFamily<InferenceLabels>,
    pub time_per_output_chunk: HistogramFamily<InferenceLabels>,
    pub input_tokens: Family<InferenceLabels, Counter>,
    pub output_tokens: Family<InferenceLabels, Counter>,
    pub cache_read_input_tokens: Family<InferenceLabels, Counter>,
}

impl InferenceMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> InferenceMetrics {
        let h = || -> HistogramFamily<InferenceLabels> {
            Family::new_with_constructor(HistogramShape::classic(&INFERENCE_BUCKETS))
        };
        let m = InferenceMetrics {
            duration: h(),
            time_to_first_chunk: h(),
            time_per_output_chunk: h(),
            input_tokens: Family::default(),
            output_tokens: Family::default(),
            cache_read_input_tokens: Family::default(),
        };
        names::INFERENCE_DURATION.register(registry, m.duration.clone());
        names::INFERENCE_TTFC.register(registry, m.time_to_first_chunk.clone());
        names::INFERENCE_TPOC.register(registry, m.time_per_output_chunk.clone());
        names::INFERENCE_INPUT_TOKENS.register(registry, m.input_tokens.clone());
        names::INFERENCE_OUTPUT_TOKENS.register(registry, m.output_tokens.clone());
        names::INFERENCE_CACHE_READ_TOKENS.register(registry, m.cache_read_input_tokens.clone());
        m
    }
}

impl Sink for InferenceMetrics {
    fn observe(&self, r: &RequestRecord, model: &str, _gaps: &[u32]) {
        let labels = InferenceLabels {
            model: model.to_owned(),
            api: r.api,
        };
        self.duration
            .get_or_create(&labels)
            .observe(r.e2e_ms / 1000.0);
        if r.outcome == Outcome::Ok {
            if let Some(ttft) = r.ttft_ms {
                self.time_to_first_chunk
                    .get_or_create(&labels)
                    .observe(ttft / 1000.0);
            }
            if let Some(per_chunk) = r.per_output_chunk_ms() {
                self.time_per_output_chunk
                    .get_or_create(&labels)
                    .observe(per_chunk / 1000.0);
            }
        }
        for (family, n) in [
            (&self.input_tokens, r.input_tokens),
            (&self.output_tokens, r.output_tokens),
            (&self.cache_read_input_tokens, r.cached_input_tokens),
        ] {
            if let Some(n) = n {
                family.get_or_create(&labels).inc_by(n);
            }
        }
    }

    fn wants_gauges(&self) -> bool {
        false
    }

    fn refresh(&self, _: &Gauges<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_reach_ten_minutes() {
        assert!(*INFERENCE_BUCKETS.last().unwrap() >= 600.0);
        assert!(*PHASE_BUCKETS.last().unwrap() >= 600.0);
        assert!(INFERENCE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(PHASE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
