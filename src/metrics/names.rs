//! Every registered metric: its name (without the suffixes the library adds), help text
//! and unit, in one place; [`ALL`] in the order `/metrics` shows them.

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

pub const UPSTREAM_INFO: Spec = Spec {
    name: "goodput_upstream_info",
    help: "1 for what the upstream last said it is (engine, version, model, weights' revision; [drift] identity_interval)",
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

pub const UPSTREAM_CONNECTIONS_CLOSED: Spec = Spec {
    name: "goodput_upstream_connections_closed",
    help: "Upstream HTTP/1.1 connections the pool closed after a complete response, by reason: unsolicited_bytes (bytes arrived that no request asked for, after a response or while idle; never read as the next request's answer), closed_by_upstream (FIN or RST while idle or as the response ended), idle_timeout (upstream.pool_idle_timeout), pool_full (upstream.pool_max_idle_per_host), not_reusable (open as the response ended but unable to take another request)",
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

pub const SHADOW_REQUESTS: Spec = Spec {
    name: "goodput_shadow_requests",
    help: "Mirrored requests the candidate answered (or failed), by the outcome of their shadow record",
    unit: None,
};

pub const SHADOW_ANSWER_PAIRS: Spec = Spec {
    name: "goodput_shadow_answer_pairs",
    help: "Candidate answers compared with the primary's, by result: same, differs, or close (differs, but each first differing token is in the other's top 5)",
    unit: None,
};

pub const SHADOW_DROPPED: Spec = Spec {
    name: "goodput_shadow_dropped",
    help: "Mirrored copies not sent, or not read to their end, by reason; the client's request is never affected",
    unit: None,
};

pub const SHADOW_IN_FLIGHT: Spec = Spec {
    name: "goodput_shadow_in_flight_requests",
    help: "Mirrored copies taken whose record is not written yet and that were not dropped",
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
pub const ALL: [&Spec; 59] = [
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
    &UPSTREAM_INFO,
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
    &UPSTREAM_CONNECTIONS_CLOSED,
    &FILE_BUDGET,
    &CLOSED_FOR_ROOM,
    &ATTRIBUTION,
    &ENGINE_KV_CACHE,
    &ENGINE_WAITING,
    &ENGINE_RUNNING,
    &ENGINE_PREEMPTIONS,
    &REQUEST_PHASE,
    &SLO_HEADER_OBJECTIVES_INVALID,
    &SHADOW_REQUESTS,
    &SHADOW_ANSWER_PAIRS,
    &SHADOW_DROPPED,
    &SHADOW_IN_FLIGHT,
];
