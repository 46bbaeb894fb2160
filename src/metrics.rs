//! Every exported metric's name, help text and unit in one place ([`names`]), and the label
//! sets they carry. Each subsystem owns the struct of its handles and registers it with
//! [`Spec::register`], in one registry that the wiring (`run`) creates and passes down (no
//! globals): `measure::RequestMetrics`, `stats::WindowMetrics`, `profile::ProfileMetrics`,
//! `calibrate::CalibrationMetrics`, `otlp::OtlpMetrics`, `proxy::LimitMetrics`,
//! `tokenize::Fallbacks`, `admin::AdminMetrics` and `run::ReloadMetrics`. Names follow
//! `<namespace>_<name>_<unit>[_total]`; the unit and `_total` suffixes are added by
//! prometheus-client from the registration. Where the OpenTelemetry GenAI semantic
//! conventions define a metric, its name is used. docs/METRICS.md lists every name.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, histogram::Histogram},
    registry::{Metric, Registry, Unit},
};

/// The unit a metric is registered with (its name then ends in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricUnit {
    Seconds,
    Ratio,
}

/// One exported metric: its name (without the suffixes the library adds), help text and
/// unit.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub name: &'static str,
    pub help: &'static str,
    pub unit: Option<MetricUnit>,
}

impl Spec {
    /// Registers `metric` under this name, help text and unit.
    pub fn register(&self, registry: &mut Registry, metric: impl Metric) {
        match self.unit {
            None => registry.register(self.name, self.help, metric),
            Some(MetricUnit::Seconds) => {
                registry.register_with_unit(self.name, self.help, Unit::Seconds, metric)
            }
            Some(MetricUnit::Ratio) => registry.register_with_unit(
                self.name,
                self.help,
                Unit::Other("ratio".into()),
                metric,
            ),
        }
    }
}

/// Boundaries of the client-inference latencies (`gen_ai.client.inference.*`, on `/metrics`
/// and over OTLP): 1 ms to 20 minutes, because reasoning calls run for many minutes.
pub const INFERENCE_BUCKETS: [f64; 20] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68, 655.36, 1200.0,
];

/// A family of histograms that all share one set of buckets.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every registered metric.
pub mod names {
    use super::{MetricUnit, Spec};

    pub const TTFT: Spec = Spec {
        name: "gen_ai_server_time_to_first_token",
        help: "Time from request arrival to the first content-bearing event",
        unit: Some(MetricUnit::Seconds),
    };

    pub const TPOT: Spec = Spec {
        name: "gen_ai_server_time_per_output_token",
        help: "Time per output token after the first: (t_last - t_first) / (output_tokens - 1)",
        unit: Some(MetricUnit::Seconds),
    };

    pub const DURATION: Spec = Spec {
        name: "gen_ai_server_request_duration",
        help: "Time from request arrival to the end of the response",
        unit: Some(MetricUnit::Seconds),
    };

    pub const ITL: Spec = Spec {
        name: "goodput_inter_token_latency",
        help: "Gaps between consecutive content-bearing events",
        unit: Some(MetricUnit::Seconds),
    };

    pub const TOKEN_USAGE: Spec = Spec {
        name: "gen_ai_client_token_usage",
        help: "Input and output tokens per request",
        unit: None,
    };

    pub const REQUESTS: Spec = Spec {
        name: "goodput_requests",
        help: "Finished requests by outcome",
        unit: None,
    };

    pub const PASSTHROUGH: Spec = Spec {
        name: "goodput_passthrough_requests",
        help: "Finished requests that are no generation (metrics scrapes, health probes, model lists, embeddings), passed through and kept out of SLO classes, goodput, capacity, drift and profiles",
        unit: None,
    };

    pub const SLO_MISSES: Spec = Spec {
        name: "goodput_slo_misses",
        help: "Requests that missed their SLO, by why: the latency target broken or the failed outcome",
        unit: None,
    };

    pub const FINISH_REASONS: Spec = Spec {
        name: "goodput_finish_reasons",
        help: "Judged requests by the finish reason the upstream reported (length = truncated)",
        unit: None,
    };

    pub const IN_FLIGHT: Spec = Spec {
        name: "goodput_in_flight_requests",
        help: "Generation requests being served now (passthrough requests are not counted)",
        unit: None,
    };

    pub const DROPPED: Spec = Spec {
        name: "goodput_measurement_dropped",
        help: "Measurements dropped because the aggregator queue was full",
        unit: None,
    };

    pub const DECODE_FAILURES: Spec = Spec {
        name: "goodput_decode_failures",
        help: "Responses whose stream could not be decoded (bytes passed unchanged)",
        unit: None,
    };

    pub const OUTPUT_TOKENS: Spec = Spec {
        name: "goodput_output_tokens",
        help: "Output tokens by SLO class and verdict (met tokens are the effective ones)",
        unit: None,
    };

    pub const ATTAINMENT: Spec = Spec {
        name: "goodput_slo_attainment",
        help: "Share of requests meeting their SLO over the window (met / (met + missed))",
        unit: Some(MetricUnit::Ratio),
    };

    pub const ATTAINMENT_TARGET: Spec = Spec {
        name: "goodput_slo_attainment_target",
        help: "The class's configured attainment target",
        unit: Some(MetricUnit::Ratio),
    };

    pub const EFFECTIVE_TPS: Spec = Spec {
        name: "goodput_effective_output_tokens_per_second",
        help: "Output tokens per second of requests that met their SLO, over the window",
        unit: None,
    };

    pub const RAW_TPS: Spec = Spec {
        name: "goodput_raw_output_tokens_per_second",
        help: "Output tokens per second of all requests, over the window",
        unit: None,
    };

    pub const REQUEST_GOODPUT: Spec = Spec {
        name: "goodput_request_goodput_per_second",
        help: "Requests per second that met their SLO, over the window",
        unit: None,
    };

    pub const MAX_STABLE: Spec = Spec {
        name: "goodput_max_stable_concurrency",
        help: "Highest in-flight concurrency at which the class still meets its attainment target",
        unit: None,
    };

    pub const KNEE: Spec = Spec {
        name: "goodput_knee_concurrency",
        help: "Concurrency where the throughput-latency curve stops paying: the last level before the marginal throughput gain falls below half the initial slope or a percentile target breaks",
        unit: None,
    };

    pub const COST_PER_M_EFFECTIVE: Spec = Spec {
        name: "goodput_cost_per_million_effective_tokens",
        help: "Configured serving cost over the window per million effective output tokens",
        unit: None,
    };

    pub const COST_PER_HOUR: Spec = Spec {
        name: "goodput_cost_per_hour",
        help: "Configured cost per hour of the serving system this instance fronts",
        unit: None,
    };

    pub const RELOAD_FAILURES: Spec = Spec {
        name: "goodput_config_reload_failures",
        help: "Config reloads rejected (the previous config kept running)",
        unit: None,
    };

    pub const RELOADS: Spec = Spec {
        name: "goodput_config_reloads",
        help: "Config reloads applied",
        unit: None,
    };

    pub const ADMIN_UNAUTHORIZED: Spec = Spec {
        name: "goodput_admin_unauthorized",
        help: "Admin requests refused for a missing or wrong bearer token",
        unit: None,
    };

    pub const OTLP_EXPORTS: Spec = Spec {
        name: "goodput_otlp_exports",
        help: "OTLP export requests the collector accepted, by signal",
        unit: None,
    };

    pub const OTLP_EXPORT_FAILURES: Spec = Spec {
        name: "goodput_otlp_export_failures",
        help: "OTLP export requests that failed (refused, timed out, non-2xx), by signal",
        unit: None,
    };

    pub const OTLP_SPANS_DROPPED: Spec = Spec {
        name: "goodput_otlp_spans_dropped",
        help: "Request spans not delivered: queue_full (export queue full), export_failed",
        unit: None,
    };

    pub const TOKENIZER_FALLBACK: Spec = Spec {
        name: "goodput_tokenizer_fallback",
        help: "Token counts that fell back from the configured tokenizer (queue full, error, text limit)",
        unit: None,
    };

    pub const PROFILE_RECORDS: Spec = Spec {
        name: "goodput_profile_records",
        help: "Requests written to profile files",
        unit: None,
    };

    pub const PROFILE_DROPPED: Spec = Spec {
        name: "goodput_profile_records_dropped",
        help: "Requests not written to profile files (queue full, disk error, recorder closed); traffic is unaffected",
        unit: None,
    };

    pub const REACCEPTANCE: Spec = Spec {
        name: "goodput_reacceptance_required",
        help: "1 while live traffic has drifted from the accepted baseline profile on this dimension",
        unit: None,
    };

    pub const PROFILE_DRIFT: Spec = Spec {
        name: "goodput_profile_drift",
        help: "Drift statistic of the live window against the baseline profile",
        unit: None,
    };

    pub const CALIBRATION_ENGINE: Spec = Spec {
        name: "goodput_calibration_engine",
        help: "The engine's own mean of the quantity over the latest scrape interval with requests",
        unit: Some(MetricUnit::Seconds),
    };

    pub const CALIBRATION_PROXY: Spec = Spec {
        name: "goodput_calibration_proxy",
        help: "The proxy's mean of the same quantity over the same interval",
        unit: Some(MetricUnit::Seconds),
    };

    pub const CALIBRATION_DIFFERENCE: Spec = Spec {
        name: "goodput_calibration_difference",
        help: "Proxy mean minus engine mean: time spent outside the engine (network, queues, proxy)",
        unit: Some(MetricUnit::Seconds),
    };

    pub const CALIBRATION_SAMPLES: Spec = Spec {
        name: "goodput_calibration_samples",
        help: "Observations the calibration means of the interval are made from",
        unit: None,
    };

    pub const CALIBRATION_SCRAPES: Spec = Spec {
        name: "goodput_calibration_scrapes",
        help: "Scrapes of the engine's metrics endpoint by result",
        unit: None,
    };

    pub const CALIBRATION_RESETS: Spec = Spec {
        name: "goodput_calibration_engine_resets",
        help: "Scrapes in which the engine's counters went backwards (an engine restart)",
        unit: None,
    };

    pub const CALIBRATION_UP: Spec = Spec {
        name: "goodput_calibration_up",
        help: "1 when the last scrape of the engine's metrics succeeded",
        unit: None,
    };

    pub const LIMIT_REJECTIONS: Spec = Spec {
        name: "goodput_limit_rejections",
        help: "Connections or requests turned away by a configured bound, by its config key",
        unit: None,
    };

    pub const CLIENT_CONNECTIONS: Spec = Spec {
        name: "goodput_client_connections",
        help: "Client connections open now (bounded by server.max_connections)",
        unit: None,
    };

    pub const ACCEPT_ERRORS: Spec = Spec {
        name: "goodput_accept_errors",
        help: "Failed accepts on the proxy port (e.g. out of file descriptors); the loop backs off and goes on",
        unit: None,
    };

    pub const UPSTREAM_HTTP2_SATURATED: Spec = Spec {
        name: "goodput_upstream_http2_saturated",
        help: "Requests sent to an HTTP/2 upstream while every connection (upstream.http2_max_connections) carried upstream.http2_max_streams_per_connection streams: they may wait for a stream inside the connection",
        unit: None,
    };

    pub const ATTRIBUTION: Spec = Spec {
        name: "goodput_attribution",
        help: "Where the engine's requests spent their time over the latest calibration interval: engine queue, prefill, decode (engine means) and outside the engine (proxy e2e minus engine e2e)",
        unit: Some(MetricUnit::Seconds),
    };

    pub const ENGINE_KV_CACHE: Spec = Spec {
        name: "goodput_engine_kv_cache_usage",
        help: "Share of the engine's KV cache in use at the latest calibration scrape",
        unit: Some(MetricUnit::Ratio),
    };

    pub const ENGINE_WAITING: Spec = Spec {
        name: "goodput_engine_requests_waiting",
        help: "Requests waiting in the engine's queue at the latest calibration scrape",
        unit: None,
    };

    pub const ENGINE_RUNNING: Spec = Spec {
        name: "goodput_engine_requests_running",
        help: "Requests the engine was executing at the latest calibration scrape",
        unit: None,
    };

    pub const ENGINE_PREEMPTIONS: Spec = Spec {
        name: "goodput_engine_preemptions",
        help: "Requests the engine preempted in the latest calibration scrape interval",
        unit: None,
    };

    pub const FILE_BUDGET: Spec = Spec {
        name: "goodput_file_budget",
        help: "How the open-files limit is divided, by share: open_files (the limit), client_connections, upstream_connections, reserve (listeners, admin, files)",
        unit: None,
    };

    pub const CLOSED_FOR_ROOM: Spec = Spec {
        name: "goodput_client_connections_closed_for_room",
        help: "Client connections closed at server.max_connections to admit a new one: those that never sent a complete request head (first_request) or were idle between requests (next_request), oldest first, none younger than server.min_connection_age",
        unit: None,
    };

    pub const REQUEST_PHASE: Spec = Spec {
        name: "goodput_request_phase",
        help: "Where each request's time went by the engine's own per-request timings (vLLM metrics, SGLang meta_info, TGI headers): engine queue, prefill, decode, inference (prefill and decode where the engine does not split them) and outside the engine (TTFT minus queue and prefill)",
        unit: Some(MetricUnit::Seconds),
    };

    pub const SLO_HEADER_OBJECTIVES_INVALID: Spec = Spec {
        name: "goodput_slo_header_objectives_invalid",
        help: "Per-request objective headers (x-llm-d-slo-ttft-ms and the like) ignored because their value is not a positive number",
        unit: None,
    };

    // The GenAI conventions' latest client-inference names, exported only with
    // OTEL_SEMCONV_STABILITY_OPT_IN containing gen_ai_latest_experimental.
    pub const INFERENCE_DURATION: Spec = Spec {
        name: "gen_ai_client_inference_duration",
        help: "GenAI client inference duration: arrival to the end of the response",
        unit: Some(MetricUnit::Seconds),
    };

    pub const INFERENCE_TTFC: Spec = Spec {
        name: "gen_ai_client_inference_time_to_first_chunk",
        help: "GenAI client inference time to the first output chunk (streamed, successful)",
        unit: Some(MetricUnit::Seconds),
    };

    pub const INFERENCE_TPOC: Spec = Spec {
        name: "gen_ai_client_inference_time_per_output_chunk",
        help: "GenAI client inference time per output chunk after the first (streamed, successful)",
        unit: Some(MetricUnit::Seconds),
    };

    pub const INFERENCE_INPUT_TOKENS: Spec = Spec {
        name: "gen_ai_client_inference_usage_input_tokens",
        help: "Input tokens of GenAI client inferences",
        unit: None,
    };

    pub const INFERENCE_OUTPUT_TOKENS: Spec = Spec {
        name: "gen_ai_client_inference_usage_output_tokens",
        help: "Output tokens of GenAI client inferences",
        unit: None,
    };

    pub const INFERENCE_CACHE_READ_TOKENS: Spec = Spec {
        name: "gen_ai_client_inference_usage_cache_read_input_tokens",
        help: "Input tokens served from the engine's prefix cache",
        unit: None,
    };

    /// The latest GenAI client-inference names: registered only under the opt-in.
    pub const LATEST_GENAI: [&Spec; 6] = [
        &INFERENCE_DURATION,
        &INFERENCE_TTFC,
        &INFERENCE_TPOC,
        &INFERENCE_INPUT_TOKENS,
        &INFERENCE_OUTPUT_TOKENS,
        &INFERENCE_CACHE_READ_TOKENS,
    ];

    /// Every metric, in the order `/metrics` shows them.
    pub const ALL: [&Spec; 53] = [
        &TTFT,
        &TPOT,
        &DURATION,
        &ITL,
        &TOKEN_USAGE,
        &REQUESTS,
        &PASSTHROUGH,
        &SLO_MISSES,
        &FINISH_REASONS,
        &IN_FLIGHT,
        &DROPPED,
        &DECODE_FAILURES,
        &OUTPUT_TOKENS,
        &ATTAINMENT,
        &ATTAINMENT_TARGET,
        &EFFECTIVE_TPS,
        &RAW_TPS,
        &REQUEST_GOODPUT,
        &MAX_STABLE,
        &KNEE,
        &COST_PER_M_EFFECTIVE,
        &COST_PER_HOUR,
        &RELOAD_FAILURES,
        &RELOADS,
        &ADMIN_UNAUTHORIZED,
        &OTLP_EXPORTS,
        &OTLP_EXPORT_FAILURES,
        &OTLP_SPANS_DROPPED,
        &TOKENIZER_FALLBACK,
        &PROFILE_RECORDS,
        &PROFILE_DROPPED,
        &REACCEPTANCE,
        &PROFILE_DRIFT,
        &CALIBRATION_ENGINE,
        &CALIBRATION_PROXY,
        &CALIBRATION_DIFFERENCE,
        &CALIBRATION_SAMPLES,
        &CALIBRATION_SCRAPES,
        &CALIBRATION_RESETS,
        &CALIBRATION_UP,
        &LIMIT_REJECTIONS,
        &CLIENT_CONNECTIONS,
        &ACCEPT_ERRORS,
        &UPSTREAM_HTTP2_SATURATED,
        &FILE_BUDGET,
        &CLOSED_FOR_ROOM,
        &ATTRIBUTION,
        &ENGINE_KV_CACHE,
        &ENGINE_WAITING,
        &ENGINE_RUNNING,
        &ENGINE_PREEMPTIONS,
        &REQUEST_PHASE,
        &SLO_HEADER_OBJECTIVES_INVALID,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelApi {
    pub model: String,
    pub api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub model: String,
    pub api: &'static str,
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub model: String,
    pub api: &'static str,
    pub outcome: &'static str,
    pub class: String,
    /// `met`, `missed`, or `excluded` (client aborts and client errors, not counted in
    /// attainment).
    pub slo: &'static str,
    /// The response status's class: `2xx`, `4xx`, `5xx` (`1xx`, `3xx`, or `none` when no
    /// response head was sent).
    pub status_class: &'static str,
}

/// A request that is no generation (`api` = `unknown`, `embeddings`, `upgrade`), passed
/// through unjudged; `status_class` as on [`RequestLabels`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassthroughLabels {
    pub api: &'static str,
    pub status_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model: String,
    pub api: &'static str,
    pub class: String,
    pub gen_ai_token_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassSlo {
    pub class: String,
    pub slo: &'static str,
}

/// A class and a bounded reason: a miss cause (`ttft`, `tpot`, `e2e`, `rejected`,
/// `upstream_error`, `upstream_reset`, `timeout`, `proxy_error`) or a finish reason
/// (`stop`, `length`, `tool_calls`, `content_filter`, `other`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassReason {
    pub class: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassWindow {
    pub class: String,
    pub window: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowCurrency {
    pub window: String,
    pub currency: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CurrencyLabel {
    pub currency: String,
}

/// Why a token count fell back: `queue_full`, `tokenize_error`, `text_limit`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// An OTLP signal: `metrics` or `traces`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    pub signal: &'static str,
}

/// Why a profile record was dropped: `queue_full`, `disk`, `closed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropReasonLabel {
    pub reason: &'static str,
}

/// A drift dimension (`input_length`, `output_length`, `arrival_rate`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DimensionLabel {
    pub dimension: &'static str,
}

/// A drift dimension and the statistic measuring it (`psi`, `ks`, `tvd`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    pub dimension: &'static str,
    pub statistic: &'static str,
}

/// An engine model (`model_name`, `""` when it gives none) and a calibrated quantity
/// (`ttft`, `e2e`, `tpot`, `itl`, `queue`, `prefill`, `decode`, `inference`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CalibrationLabels {
    pub model: String,
    pub metric: &'static str,
}

/// As [`CalibrationLabels`], and whose observations: `engine` or `proxy`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CalibrationSampleLabels {
    pub model: String,
    pub metric: &'static str,
    pub source: &'static str,
}

/// How a calibration scrape ended: `ok`, `unreachable`, `timeout`, `http_error`,
/// `transport_error`, `too_large`, `invalid`, `no_engine_metrics`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScrapeResultLabel {
    pub result: &'static str,
}

/// The bound that turned work away, named by its config key: `server.max_connections`,
/// `server.http2_max_control_frames_per_second`, `server.max_request_header_bytes`, `server.request_body_timeout`,
/// `upstream.max_connections`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: &'static str,
}

/// A share of the open-files budget: `open_files` (the whole), `client_connections`,
/// `upstream_connections`, `reserve`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShareLabel {
    pub share: &'static str,
}

/// What a connection closed for room was waiting for: `first_request` (it never sent a
/// complete request head) or `next_request` (idle between requests).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabel {
    pub waiting: &'static str,
}

/// An engine model (`model_name`, `""` when it gives none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineModel {
    pub model: String,
}

/// An engine model and where its requests' time went: `queue`, `prefill`, `decode`,
/// `outside_engine`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelPhase {
    pub model: String,
    pub phase: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for spec in names::ALL {
            assert!(seen.insert(spec.name), "{} twice", spec.name);
            assert!(
                spec.name.starts_with("goodput_") || spec.name.starts_with("gen_ai_"),
                "{}",
                spec.name
            );
            assert!(
                spec.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                spec.name
            );
            assert!(
                !spec.help.is_empty() && !spec.help.ends_with('.'),
                "{}",
                spec.name
            );
        }
    }
}
