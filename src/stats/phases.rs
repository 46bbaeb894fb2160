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

use crate::otlp::semconv::{INFERENCE_BUCKETS, per_output_chunk_ms};

/// `model` and `api` of a GenAI client-inference series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct InferenceLabels {
    pub model: String,
    pub api: &'static str,
}

/// The OpenTelemetry GenAI conventions' latest client-inference instruments in their
/// Prometheus forms, exported beside the older names when
/// `OTEL_SEMCONV_STABILITY_OPT_IN` contains `gen_ai_latest_experimental`: latencies measured
/// at a proxy are the client's view of inference.
#[derive(Clone, Debug)]
pub struct InferenceMetrics {
    pub duration: HistogramFamily<InferenceLabels>,
    pub time_to_first_chunk: HistogramFamily<InferenceLabels>,
    pub time_per_output_chunk: HistogramFamily<InferenceLabels>,
    pub input_tokens: Family<InferenceLabels, Counter>,
    pub output_tokens: Family<InferenceLabels, Counter>,
    pub cache_read_input_tokens: Family<InferenceLabels, Counter>,
}

impl Default for InferenceMetrics {
    fn default() -> Self {
        let h = || -> HistogramFamily<InferenceLabels> {
            Family::new_with_constructor(|| Histogram::new(INFERENCE_BUCKETS))
        };
        InferenceMetrics {
            duration: h(),
            time_to_first_chunk: h(),
            time_per_output_chunk: h(),
            input_tokens: Family::default(),
            output_tokens: Family::default(),
            cache_read_input_tokens: Family::default(),
        }
    }
}

impl InferenceMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let seconds = [
            (
                names::INFERENCE_DURATION,
                "GenAI client inference duration: arrival to the end of the response",
                &self.duration,
            ),
            (
                names::INFERENCE_TTFC,
                "GenAI client inference time to the first output chunk (streamed, successful)",
                &self.time_to_first_chunk,
            ),
            (
                names::INFERENCE_TPOC,
                "GenAI client inference time per output chunk after the first (streamed, successful)",
                &self.time_per_output_chunk,
            ),
        ];
        for (name, help, family) in seconds {
            registry.register_with_unit(name, help, Unit::Seconds, family.clone());
        }
        let tokens = [
            (
                names::INFERENCE_INPUT_TOKENS,
                "Input tokens of GenAI client inferences",
                &self.input_tokens,
            ),
            (
                names::INFERENCE_OUTPUT_TOKENS,
                "Output tokens of GenAI client inferences",
                &self.output_tokens,
            ),
            (
                names::INFERENCE_CACHE_READ_TOKENS,
                "Input tokens served from the engine's prefix cache",
                &self.cache_read_input_tokens,
            ),
        ];
        for (name, help, family) in tokens {
            registry.register(name, help, family.clone());
        }
    }

    /// Counts one finished request under its `model` label.
    pub fn observe(&self, r: &RequestRecord, model: &str) {
        let labels = InferenceLabels {
            model: model.to_owned(),
            api: r.api,
        };
        self.duration
            .get_or_create(&labels)
            .observe(r.e2e_ms / 1000.0);
        if r.outcome == crate::measure::Outcome::Ok {
            if let Some(ttft) = r.ttft_ms {
                self.time_to_first_chunk
                    .get_or_create(&labels)
                    .observe(ttft / 1000.0);
            }
            if let Some(per_chunk) = per_output_chunk_ms(r) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opt_in_is_one_of_a_comma_separated_list() {
        use crate::otlp::semconv::latest_genai;
        assert!(latest_genai(Some("gen_ai_latest_experimental")));
        assert!(latest_genai(Some("http, gen_ai_latest_experimental")));
        assert!(!latest_genai(Some("http")));
        assert!(!latest_genai(Some("gen_ai_latest_experimental_not")));
        assert!(!latest_genai(None));
    }

    #[test]
    fn buckets_reach_ten_minutes() {
        assert!(*INFERENCE_BUCKETS.last().unwrap() >= 600.0);
        assert!(*PHASE_BUCKETS.last().unwrap() >= 600.0);
        assert!(INFERENCE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(PHASE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
