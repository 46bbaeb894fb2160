//! Every exported metric, named in one place and registered once in one registry that is
//! passed down (no globals). Names follow `<namespace>_<name>_<unit>[_total]`; the unit
//! and `_total` suffixes are added by prometheus-client from the registration. Where the
//! OpenTelemetry GenAI semantic conventions define a metric, its name is used.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::measure::{RequestRecord, record::status_class, slo::MissCause};

/// Registered names (without the suffixes the library adds).
pub mod names {
    pub const TTFT: &str = "gen_ai_server_time_to_first_token";
    pub const TPOT: &str = "gen_ai_server_time_per_output_token";
    pub const DURATION: &str = "gen_ai_server_request_duration";
    pub const ITL: &str = "goodput_inter_token_latency";
    pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage";
    pub const REQUESTS: &str = "goodput_requests";
    pub const PASSTHROUGH: &str = "goodput_passthrough_requests";
    pub const SLO_MISSES: &str = "goodput_slo_misses";
    pub const FINISH_REASONS: &str = "goodput_finish_reasons";
    pub const IN_FLIGHT: &str = "goodput_in_flight_requests";
    pub const DROPPED: &str = "goodput_measurement_dropped";
    pub const DECODE_FAILURES: &str = "goodput_decode_failures";
    pub const OUTPUT_TOKENS: &str = "goodput_output_tokens";
    pub const ATTAINMENT: &str = "goodput_slo_attainment";
    pub const ATTAINMENT_TARGET: &str = "goodput_slo_attainment_target";
    pub const EFFECTIVE_TPS: &str = "goodput_effective_output_tokens_per_second";
    pub const RAW_TPS: &str = "goodput_raw_output_tokens_per_second";
    pub const REQUEST_GOODPUT: &str = "goodput_request_goodput_per_second";
    pub const MAX_STABLE: &str = "goodput_max_stable_concurrency";
    pub const KNEE: &str = "goodput_knee_concurrency";
    pub const COST_PER_M_EFFECTIVE: &str = "goodput_cost_per_million_effective_tokens";
    pub const COST_PER_HOUR: &str = "goodput_cost_per_hour";
    pub const RELOAD_FAILURES: &str = "goodput_config_reload_failures";
    pub const RELOADS: &str = "goodput_config_reloads";
    pub const ADMIN_UNAUTHORIZED: &str = "goodput_admin_unauthorized";
    pub const TOKENIZER_FALLBACK: &str = "goodput_tokenizer_fallback";
    pub const PROFILE_RECORDS: &str = "goodput_profile_records";
    pub const PROFILE_DROPPED: &str = "goodput_profile_records_dropped";
    pub const REACCEPTANCE: &str = "goodput_reacceptance_required";
    pub const PROFILE_DRIFT: &str = "goodput_profile_drift";
    pub const CALIBRATION_ENGINE: &str = "goodput_calibration_engine";
    pub const CALIBRATION_PROXY: &str = "goodput_calibration_proxy";
    pub const CALIBRATION_DIFFERENCE: &str = "goodput_calibration_difference";
    pub const CALIBRATION_SAMPLES: &str = "goodput_calibration_samples";
    pub const CALIBRATION_SCRAPES: &str = "goodput_calibration_scrapes";
    pub const CALIBRATION_RESETS: &str = "goodput_calibration_engine_resets";
    pub const CALIBRATION_UP: &str = "goodput_calibration_up";
    pub const LIMIT_REJECTIONS: &str = "goodput_limit_rejections";
    pub const CLIENT_CONNECTIONS: &str = "goodput_client_connections";
    pub const ACCEPT_ERRORS: &str = "goodput_accept_errors";
    pub const UPSTREAM_HTTP2_SATURATED: &str = "goodput_upstream_http2_saturated";
    pub const FILE_BUDGET: &str = "goodput_file_budget";
    pub const CLOSED_FOR_ROOM: &str = "goodput_client_connections_closed_for_room";
    pub const ATTRIBUTION: &str = "goodput_attribution";
    pub const ENGINE_KV_CACHE: &str = "goodput_engine_kv_cache_usage";
    pub const ENGINE_WAITING: &str = "goodput_engine_requests_waiting";
    pub const ENGINE_RUNNING: &str = "goodput_engine_requests_running";
    pub const ENGINE_PREEMPTIONS: &str = "goodput_engine_preemptions";
    pub const OTLP_EXPORTS: &str = "goodput_otlp_exports";
    pub const OTLP_EXPORT_FAILURES: &str = "goodput_otlp_export_failures";
    pub const OTLP_SPANS_DROPPED: &str = "goodput_otlp_spans_dropped";
    pub const REQUEST_PHASE: &str = "goodput_request_phase";
    pub const SLO_HEADER_OBJECTIVES_INVALID: &str = "goodput_slo_header_objectives_invalid";
    // The GenAI conventions' latest client-inference names (OTEL_SEMCONV_STABILITY_OPT_IN).
    pub const INFERENCE_DURATION: &str = "gen_ai_client_inference_duration";
    pub const INFERENCE_TTFC: &str = "gen_ai_client_inference_time_to_first_chunk";
    pub const INFERENCE_TPOC: &str = "gen_ai_client_inference_time_per_output_chunk";
    pub const INFERENCE_INPUT_TOKENS: &str = "gen_ai_client_inference_usage_input_tokens";
    pub const INFERENCE_OUTPUT_TOKENS: &str = "gen_ai_client_inference_usage_output_tokens";
    pub const INFERENCE_CACHE_READ_TOKENS: &str =
        "gen_ai_client_inference_usage_cache_read_input_tokens";
}

/// OTel's TTFT boundaries, extended below 1 ms (a proxy on loopback or a cache hit answers
/// that fast) and up to 60 s (long prompts behind a queue).
const TTFT_BUCKETS: [f64; 21] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
];
/// OTel's TPOT boundaries, extended below 10 ms: small models decode a token in 1–5 ms.
const TPOT_BUCKETS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5,
];
/// OTel's request-duration boundaries, extended below 10 ms and up to 10 minutes: long
/// generations and reasoning runs last minutes.
const DURATION_BUCKETS: [f64; 22] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12,
    10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 600.0, 1200.0,
];
/// Inter-token gaps from 0.5 ms (several tokens per network read coalesce to ~0) to 10 s
/// (a stalled stream).
const ITL_BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// OTel's token-usage boundaries (powers of 4).
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

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

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The handles the proxy and the aggregator update.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub ttft: HistogramFamily<LatencyLabels>,
    pub tpot: HistogramFamily<LatencyLabels>,
    pub duration: HistogramFamily<LatencyLabels>,
    pub itl: HistogramFamily<LatencyLabels>,
    pub token_usage: HistogramFamily<TokenLabels>,
    pub requests: Family<RequestLabels, Counter>,
    pub passthrough: Family<PassthroughLabels, Counter>,
    pub slo_misses: Family<ClassReason, Counter>,
    pub finish_reasons: Family<ClassReason, Counter>,
    pub in_flight: Gauge,
    pub dropped: Counter,
    pub decode_failures: Family<ModelApi, Counter>,
    pub output_tokens: Family<ClassSlo, Counter>,
    pub attainment: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub attainment_target: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    pub effective_tps: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub raw_tps: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub request_goodput: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub max_stable: Family<ClassLabel, Gauge>,
    pub knee: Family<ClassLabel, Gauge>,
    pub cost_per_m_effective: Family<WindowCurrency, Gauge<f64, AtomicU64>>,
    pub cost_per_hour: Family<CurrencyLabel, Gauge<f64, AtomicU64>>,
    pub reload_failures: Counter,
    pub reloads: Counter,
    /// Admin requests refused for a missing or wrong bearer token.
    pub admin_unauthorized: Counter,
    pub tokenizer_fallback: Family<ReasonLabel, Counter>,
    pub profile_records: Counter,
    pub profile_dropped: Family<DropReasonLabel, Counter>,
    pub reacceptance: Family<DimensionLabel, Gauge>,
    pub profile_drift: Family<DriftLabels, Gauge<f64, AtomicU64>>,
    pub calibration_engine: Family<CalibrationLabels, Gauge<f64, AtomicU64>>,
    pub calibration_proxy: Family<CalibrationLabels, Gauge<f64, AtomicU64>>,
    pub calibration_difference: Family<CalibrationLabels, Gauge<f64, AtomicU64>>,
    pub calibration_samples: Family<CalibrationSampleLabels, Gauge>,
    pub calibration_scrapes: Family<ScrapeResultLabel, Counter>,
    pub calibration_resets: Counter,
    pub calibration_up: Gauge,
    pub limits: LimitMetrics,
    pub attribution: Family<ModelPhase, Gauge<f64, AtomicU64>>,
    pub engine_kv_cache: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub engine_waiting: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub engine_running: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub engine_preemptions: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub otlp: OtlpMetrics,
}

impl Metrics {
    /// Creates every metric and registers it in `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            ttft: Family::new_with_constructor(|| Histogram::new(TTFT_BUCKETS)),
            tpot: Family::new_with_constructor(|| Histogram::new(TPOT_BUCKETS)),
            duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            itl: Family::new_with_constructor(|| Histogram::new(ITL_BUCKETS)),
            token_usage: Family::new_with_constructor(|| Histogram::new(TOKEN_BUCKETS)),
            requests: Family::default(),
            passthrough: Family::default(),
            slo_misses: Family::default(),
            finish_reasons: Family::default(),
            in_flight: Gauge::default(),
            dropped: Counter::default(),
            decode_failures: Family::default(),
            output_tokens: Family::default(),
            attainment: Family::default(),
            attainment_target: Family::default(),
            effective_tps: Family::default(),
            raw_tps: Family::default(),
            request_goodput: Family::default(),
            max_stable: Family::default(),
            knee: Family::default(),
            cost_per_m_effective: Family::default(),
            cost_per_hour: Family::default(),
            reload_failures: Counter::default(),
            reloads: Counter::default(),
            admin_unauthorized: Counter::default(),
            tokenizer_fallback: Family::default(),
            profile_records: Counter::default(),
            profile_dropped: Family::default(),
            reacceptance: Family::default(),
            profile_drift: Family::default(),
            calibration_engine: Family::default(),
            calibration_proxy: Family::default(),
            calibration_difference: Family::default(),
            calibration_samples: Family::default(),
            calibration_scrapes: Family::default(),
            calibration_resets: Counter::default(),
            calibration_up: Gauge::default(),
            limits: LimitMetrics::default(),
            attribution: Family::default(),
            engine_kv_cache: Family::default(),
            engine_waiting: Family::default(),
            engine_running: Family::default(),
            engine_preemptions: Family::default(),
            otlp: OtlpMetrics::default(),
        };
        registry.register_with_unit(
            names::TTFT,
            "Time from request arrival to the first content-bearing event",
            Unit::Seconds,
            m.ttft.clone(),
        );
        registry.register_with_unit(
            names::TPOT,
            "Time per output token after the first: (t_last - t_first) / (output_tokens - 1)",
            Unit::Seconds,
            m.tpot.clone(),
        );
        registry.register_with_unit(
            names::DURATION,
            "Time from request arrival to the end of the response",
            Unit::Seconds,
            m.duration.clone(),
        );
        registry.register_with_unit(
            names::ITL,
            "Gaps between consecutive content-bearing events",
            Unit::Seconds,
            m.itl.clone(),
        );
        registry.register(
            names::TOKEN_USAGE,
            "Input and output tokens per request",
            m.token_usage.clone(),
        );
        registry.register(
            names::REQUESTS,
            "Finished requests by outcome",
            m.requests.clone(),
        );
        registry.register(
            names::PASSTHROUGH,
            "Finished requests that are no generation (metrics scrapes, health probes, model lists, embeddings), passed through and kept out of SLO classes, goodput, capacity, drift and profiles",
            m.passthrough.clone(),
        );
        registry.register(
            names::SLO_MISSES,
            "Requests that missed their SLO, by why: the latency target broken or the failed outcome",
            m.slo_misses.clone(),
        );
        registry.register(
            names::FINISH_REASONS,
            "Judged requests by the finish reason the upstream reported (length = truncated)",
            m.finish_reasons.clone(),
        );
        registry.register(
            names::IN_FLIGHT,
            "Generation requests being served now (passthrough requests are not counted)",
            m.in_flight.clone(),
        );
        registry.register(
            names::DROPPED,
            "Measurements dropped because the aggregator queue was full",
            m.dropped.clone(),
        );
        registry.register(
            names::DECODE_FAILURES,
            "Responses whose stream could not be decoded (bytes passed unchanged)",
            m.decode_failures.clone(),
        );
        registry.register(
            names::OUTPUT_TOKENS,
            "Output tokens by SLO class and verdict (met tokens are the effective ones)",
            m.output_tokens.clone(),
        );
        registry.register_with_unit(
            names::ATTAINMENT,
            "Share of requests meeting their SLO over the window (met / (met + missed))",
            Unit::Other("ratio".into()),
            m.attainment.clone(),
        );
        registry.register_with_unit(
            names::ATTAINMENT_TARGET,
            "The class's configured attainment target",
            Unit::Other("ratio".into()),
            m.attainment_target.clone(),
        );
        registry.register(
            names::EFFECTIVE_TPS,
            "Output tokens per second of requests that met their SLO, over the window",
            m.effective_tps.clone(),
        );
        registry.register(
            names::RAW_TPS,
            "Output tokens per second of all requests, over the window",
            m.raw_tps.clone(),
        );
        registry.register(
            names::REQUEST_GOODPUT,
            "Requests per second that met their SLO, over the window",
            m.request_goodput.clone(),
        );
        registry.register(
            names::MAX_STABLE,
            "Highest in-flight concurrency at which the class still meets its attainment target",
            m.max_stable.clone(),
        );
        registry.register(
            names::KNEE,
            "Concurrency where the throughput-latency curve stops paying: the last level before the marginal throughput gain falls below half the initial slope or a percentile target breaks",
            m.knee.clone(),
        );
        registry.register(
            names::COST_PER_M_EFFECTIVE,
            "Configured serving cost over the window per million effective output tokens",
            m.cost_per_m_effective.clone(),
        );
        registry.register(
            names::COST_PER_HOUR,
            "Configured cost per hour of the serving system this instance fronts",
            m.cost_per_hour.clone(),
        );
        registry.register(
            names::RELOAD_FAILURES,
            "Config reloads rejected (the previous config kept running)",
            m.reload_failures.clone(),
        );
        registry.register(names::RELOADS, "Config reloads applied", m.reloads.clone());
        registry.register(
            names::ADMIN_UNAUTHORIZED,
            "Admin requests refused for a missing or wrong bearer token",
            m.admin_unauthorized.clone(),
        );
        registry.register(
            names::OTLP_EXPORTS,
            "OTLP export requests the collector accepted, by signal",
            m.otlp.exports.clone(),
        );
        registry.register(
            names::OTLP_EXPORT_FAILURES,
            "OTLP export requests that failed (refused, timed out, non-2xx), by signal",
            m.otlp.export_failures.clone(),
        );
        registry.register(
            names::OTLP_SPANS_DROPPED,
            "Request spans not delivered: queue_full (export queue full), export_failed",
            m.otlp.spans_dropped.clone(),
        );
        registry.register(
            names::TOKENIZER_FALLBACK,
            "Token counts that fell back from the configured tokenizer (queue full, error, text limit)",
            m.tokenizer_fallback.clone(),
        );
        registry.register(
            names::PROFILE_RECORDS,
            "Requests written to profile files",
            m.profile_records.clone(),
        );
        registry.register(
            names::PROFILE_DROPPED,
            "Requests not written to profile files (queue full, disk error, recorder closed); traffic is unaffected",
            m.profile_dropped.clone(),
        );
        registry.register(
            names::REACCEPTANCE,
            "1 while live traffic has drifted from the accepted baseline profile on this dimension",
            m.reacceptance.clone(),
        );
        registry.register(
            names::PROFILE_DRIFT,
            "Drift statistic of the live window against the baseline profile",
            m.profile_drift.clone(),
        );
        registry.register_with_unit(
            names::CALIBRATION_ENGINE,
            "The engine's own mean of the quantity over the latest scrape interval with requests",
            Unit::Seconds,
            m.calibration_engine.clone(),
        );
        registry.register_with_unit(
            names::CALIBRATION_PROXY,
            "The proxy's mean of the same quantity over the same interval",
            Unit::Seconds,
            m.calibration_proxy.clone(),
        );
        registry.register_with_unit(
            names::CALIBRATION_DIFFERENCE,
            "Proxy mean minus engine mean: time spent outside the engine (network, queues, proxy)",
            Unit::Seconds,
            m.calibration_difference.clone(),
        );
        registry.register(
            names::CALIBRATION_SAMPLES,
            "Observations the calibration means of the interval are made from",
            m.calibration_samples.clone(),
        );
        registry.register(
            names::CALIBRATION_SCRAPES,
            "Scrapes of the engine's metrics endpoint by result",
            m.calibration_scrapes.clone(),
        );
        registry.register(
            names::CALIBRATION_RESETS,
            "Scrapes in which the engine's counters went backwards (an engine restart)",
            m.calibration_resets.clone(),
        );
        registry.register(
            names::CALIBRATION_UP,
            "1 when the last scrape of the engine's metrics succeeded",
            m.calibration_up.clone(),
        );
        for limit in LIMITS {
            let _ = m.limits.rejections.get_or_create(&LimitLabel { limit });
        }
        registry.register(
            names::LIMIT_REJECTIONS,
            "Connections or requests turned away by a configured bound, by its config key",
            m.limits.rejections.clone(),
        );
        registry.register(
            names::CLIENT_CONNECTIONS,
            "Client connections open now (bounded by server.max_connections)",
            m.limits.client_connections.clone(),
        );
        registry.register(
            names::ACCEPT_ERRORS,
            "Failed accepts on the proxy port (e.g. out of file descriptors); the loop backs off and goes on",
            m.limits.accept_errors.clone(),
        );
        registry.register(
            names::UPSTREAM_HTTP2_SATURATED,
            "Requests sent to an HTTP/2 upstream while every connection (upstream.http2_max_connections) carried upstream.http2_max_streams_per_connection streams: they may wait for a stream inside the connection",
            m.limits.http2_saturated.clone(),
        );
        registry.register(
            names::FILE_BUDGET,
            "How the open-files limit is divided, by share: open_files (the limit), client_connections, upstream_connections, reserve (listeners, admin, files)",
            m.limits.file_budget.clone(),
        );
        for waiting in ["first_request", "next_request"] {
            let _ = m
                .limits
                .closed_for_room
                .get_or_create(&WaitingLabel { waiting });
        }
        registry.register(
            names::CLOSED_FOR_ROOM,
            "Client connections closed at server.max_connections to admit a new one: those that never sent a complete request head (first_request) or were idle between requests (next_request), oldest first, none younger than server.min_connection_age",
            m.limits.closed_for_room.clone(),
        );
        registry.register_with_unit(
            names::ATTRIBUTION,
            "Where the engine's requests spent their time over the latest calibration interval: engine queue, prefill, decode (engine means) and outside the engine (proxy e2e minus engine e2e)",
            Unit::Seconds,
            m.attribution.clone(),
        );
        registry.register_with_unit(
            names::ENGINE_KV_CACHE,
            "Share of the engine's KV cache in use at the latest calibration scrape",
            Unit::Other("ratio".into()),
            m.engine_kv_cache.clone(),
        );
        registry.register(
            names::ENGINE_WAITING,
            "Requests waiting in the engine's queue at the latest calibration scrape",
            m.engine_waiting.clone(),
        );
        registry.register(
            names::ENGINE_RUNNING,
            "Requests the engine was executing at the latest calibration scrape",
            m.engine_running.clone(),
        );
        registry.register(
            names::ENGINE_PREEMPTIONS,
            "Requests the engine preempted in the latest calibration scrape interval",
            m.engine_preemptions.clone(),
        );
        m
    }

    /// Counts a judged request: its outcome and verdict, tokens, miss cause and finish
    /// reason, and its latencies (`gaps`: the inter-token gaps in microseconds) under the
    /// request's `model` label.
    pub fn observe(
        &self,
        record: &RequestRecord,
        model: &str,
        gaps: &[u32],
        miss_cause: Option<MissCause>,
    ) {
        let api = record.api;
        let class = &record.slo_class;
        let slo = match record.slo_met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "excluded",
        };
        self.requests
            .get_or_create(&RequestLabels {
                model: model.to_owned(),
                api,
                outcome: record.outcome.as_str(),
                class: class.clone(),
                slo,
                status_class: status_class(record.status),
            })
            .inc();
        if let Some(n) = record.output_tokens {
            self.output_tokens
                .get_or_create(&ClassSlo {
                    class: class.clone(),
                    slo,
                })
                .inc_by(n);
        }
        if let Some(cause) = miss_cause {
            self.slo_misses
                .get_or_create(&ClassReason {
                    class: class.clone(),
                    reason: cause.as_str(),
                })
                .inc();
        }
        if let Some(reason) = record.finish_reason {
            self.finish_reasons
                .get_or_create(&ClassReason {
                    class: class.clone(),
                    reason: reason.as_str(),
                })
                .inc();
        }
        if record.decode_failed {
            self.decode_failures
                .get_or_create(&ModelApi {
                    model: model.to_owned(),
                    api,
                })
                .inc();
        }
        let key = LatencyLabels {
            model: model.to_owned(),
            api,
            class: class.clone(),
        };
        self.duration
            .get_or_create(&key)
            .observe(record.e2e_ms / 1000.0);
        if let Some(ttft) = record.ttft_ms {
            self.ttft.get_or_create(&key).observe(ttft / 1000.0);
        }
        if let Some(tpot) = record.tpot_ms {
            self.tpot.get_or_create(&key).observe(tpot / 1000.0);
        }
        if !gaps.is_empty() {
            let itl = self.itl.get_or_create(&key);
            for &gap in gaps {
                itl.observe(f64::from(gap) / 1e6);
            }
        }
        for (kind, n) in [
            ("input", record.input_tokens),
            ("output", record.output_tokens),
        ] {
            if let Some(n) = n {
                let labels = TokenLabels {
                    model: model.to_owned(),
                    api,
                    class: class.clone(),
                    gen_ai_token_type: kind,
                };
                self.token_usage.get_or_create(&labels).observe(n as f64);
            }
        }
    }

    /// Counts a request that is not judged (no generation, and no class opted in).
    pub fn passthrough(&self, record: &RequestRecord) {
        self.passthrough
            .get_or_create(&PassthroughLabels {
                api: record.api,
                status_class: status_class(record.status),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(b: &[f64]) -> bool {
        b.windows(2).all(|w| w[0] < w[1])
    }

    #[test]
    fn buckets_ascend() {
        for b in [
            &TTFT_BUCKETS[..],
            &TPOT_BUCKETS,
            &DURATION_BUCKETS,
            &ITL_BUCKETS,
            &TOKEN_BUCKETS,
        ] {
            assert!(sorted(b), "{b:?}");
        }
        assert!(TTFT_BUCKETS[0] < 0.001 && *TTFT_BUCKETS.last().unwrap() >= 60.0);
        assert!(*DURATION_BUCKETS.last().unwrap() >= 300.0);
        assert_eq!(ITL_BUCKETS[0], 0.0005);
    }

    #[test]
    fn exposition_names_carry_units() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.requests
            .get_or_create(&RequestLabels {
                model: "m".into(),
                api: "chat_completions",
                outcome: "ok",
                class: "default".into(),
                slo: "met",
                status_class: "2xx",
            })
            .inc();
        let l = LatencyLabels {
            model: "m".into(),
            api: "chat_completions",
            class: "c".into(),
        };
        m.ttft.get_or_create(&l).observe(0.1);
        m.attainment
            .get_or_create(&ClassWindow {
                class: "c".into(),
                window: "5m".into(),
            })
            .set(0.5);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(
                "goodput_requests_total{model=\"m\",api=\"chat_completions\",outcome=\"ok\",class=\"default\",slo=\"met\",status_class=\"2xx\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains("goodput_slo_attainment_ratio{class=\"c\",window=\"5m\"} 0.5"),
            "{out}"
        );
        assert!(
            out.contains("gen_ai_server_time_to_first_token_seconds_bucket"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE goodput_in_flight_requests gauge"),
            "{out}"
        );
        assert!(out.contains("goodput_measurement_dropped_total"), "{out}");
        assert!(
            out.contains("goodput_limit_rejections_total{limit=\"upstream.max_connections\"} 0"),
            "{out}"
        );
    }
}
