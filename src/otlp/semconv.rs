//! Names from the OpenTelemetry semantic conventions (GenAI metrics and spans, `server.*`,
//! `error.type`) and goodput's own, in one place, with the recommended bucket boundaries
//! and the mapping from a record's API dialect to `gen_ai.operation.name` and
//! `gen_ai.provider.name`.

pub const SCOPE: &str = "goodput";

// Metric names.
pub const CLIENT_TOKEN_USAGE: &str = "gen_ai.client.token.usage";
pub const CLIENT_OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
pub const SERVER_REQUEST_DURATION: &str = "gen_ai.server.request.duration";
pub const SERVER_TTFT: &str = "gen_ai.server.time_to_first_token";
pub const SERVER_TPOT: &str = "gen_ai.server.time_per_output_token";
// The latest experimental client-inference names (OTEL_SEMCONV_STABILITY_OPT_IN).
pub const INFERENCE_DURATION: &str = "gen_ai.client.inference.duration";
pub const INFERENCE_TTFC: &str = "gen_ai.client.inference.time_to_first_chunk";
pub const INFERENCE_TPOC: &str = "gen_ai.client.inference.time_per_output_chunk";
pub const INFERENCE_INPUT_TOKENS: &str = "gen_ai.client.inference.usage.input_tokens";
pub const INFERENCE_OUTPUT_TOKENS: &str = "gen_ai.client.inference.usage.output_tokens";
pub const INFERENCE_CACHE_READ_TOKENS: &str =
    "gen_ai.client.inference.usage.cache_read.input_tokens";
pub const OPERATION_COST: &str = "gen_ai.client.operation.cost";
pub const REQUESTS: &str = "goodput.requests";
pub const ITL: &str = "goodput.inter_token_latency";
pub const REQUEST_PHASE: &str = "goodput.request.phase";
pub const OUTPUT_TOKENS: &str = "goodput.output_tokens";
pub const ATTAINMENT: &str = "goodput.slo.attainment";
pub const EFFECTIVE_TPS: &str = "goodput.effective_output_tokens_per_second";
pub const RAW_TPS: &str = "goodput.raw_output_tokens_per_second";
pub const REQUEST_GOODPUT: &str = "goodput.request_goodput_per_second";

// Attribute keys.
pub const OPERATION_NAME: &str = "gen_ai.operation.name";
pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
pub const TOKEN_TYPE: &str = "gen_ai.token.type";
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub const RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
pub const USAGE_COST_SOURCE: &str = "gen_ai.usage.cost.source";
pub const G_COST_CURRENCY: &str = "goodput.cost.currency";
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const ERROR_TYPE: &str = "error.type";
pub const HTTP_STATUS: &str = "http.response.status_code";
pub const G_REQUEST_ID: &str = "goodput.request.id";
pub const G_API: &str = "goodput.api";
pub const G_STREAM: &str = "goodput.stream";
pub const G_OUTCOME: &str = "goodput.outcome";
pub const G_CLASS: &str = "goodput.slo.class";
pub const G_PHASE: &str = "goodput.phase";
pub const G_VERDICT: &str = "goodput.slo.verdict";
pub const G_MISS_REASON: &str = "goodput.slo.miss_reason";
pub const G_WINDOW: &str = "goodput.window";
pub const G_TTFT_MS: &str = "goodput.ttft_ms";
pub const G_TTFO_MS: &str = "goodput.ttfo_ms";
pub const G_TPOT_MS: &str = "goodput.tpot_ms";
pub const G_E2E_MS: &str = "goodput.e2e_ms";
pub const G_ITL_P50_MS: &str = "goodput.itl.p50_ms";
pub const G_ITL_P95_MS: &str = "goodput.itl.p95_ms";
pub const G_INPUT_SOURCE: &str = "goodput.input_tokens.source";
pub const G_OUTPUT_SOURCE: &str = "goodput.output_tokens.source";
pub const G_EVENTS: &str = "goodput.events";
pub const G_BYTES_OUT: &str = "goodput.bytes_out";
pub const G_ENGINE_QUEUE_MS: &str = "goodput.engine.queue_ms";
pub const G_ENGINE_PREFILL_MS: &str = "goodput.engine.prefill_ms";
pub const G_ENGINE_DECODE_MS: &str = "goodput.engine.decode_ms";
pub const G_OUTSIDE_ENGINE_MS: &str = "goodput.engine.outside_ms";

/// The conventions' recommended boundaries for token counts, as they are: collectors and
/// dashboards built for the conventions expect them. (The latency instruments are
/// exponential histograms instead: `instruments::Precision`.)
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// Whether `OTEL_SEMCONV_STABILITY_OPT_IN` (comma-separated) asks for the latest
/// experimental GenAI conventions.
pub fn latest_genai(opt_in: Option<&str>) -> bool {
    opt_in.is_some_and(|v| {
        v.split(',')
            .any(|s| s.trim() == "gen_ai_latest_experimental")
    })
}

/// `gen_ai.operation.name` of a record's `api` label (the conventions' well-known values;
/// the API label itself for anything else).
pub fn operation_name(api: &'static str) -> &'static str {
    match api {
        "chat_completions" | "responses" | "messages" | "ollama_chat" => "chat",
        "completions" | "tgi_generate" | "llamacpp_completion" | "ollama_generate" => {
            "text_completion"
        }
        "embeddings" => "embeddings",
        other => other,
    }
}

/// `gen_ai.provider.name` by the API dialect spoken (the conventions let instrumentation go
/// by its best knowledge: an OpenAI-compatible engine speaks as `openai`); `[otlp]
/// provider_name` replaces it.
pub fn provider_name(api: &'static str) -> &'static str {
    match api {
        "messages" => "anthropic",
        "tgi_generate" => "huggingface.tgi",
        "llamacpp_completion" => "llama.cpp",
        "ollama_chat" | "ollama_generate" => "ollama",
        _ => "openai",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generation_api_has_a_well_known_operation() {
        for api in [
            "chat_completions",
            "completions",
            "responses",
            "messages",
            "tgi_generate",
            "llamacpp_completion",
            "ollama_chat",
            "ollama_generate",
            "embeddings",
        ] {
            assert!(
                ["chat", "text_completion", "embeddings"].contains(&operation_name(api)),
                "{api}"
            );
        }
        assert_eq!(provider_name("messages"), "anthropic");
        assert_eq!(provider_name("chat_completions"), "openai");
    }

    #[test]
    fn buckets_are_increasing() {
        assert!(TOKEN_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}

#[cfg(test)]
mod latest_tests {
    use super::latest_genai;

    #[test]
    fn the_opt_in_is_one_of_a_comma_separated_list() {
        assert!(latest_genai(Some("gen_ai_latest_experimental")));
        assert!(latest_genai(Some("http, gen_ai_latest_experimental")));
        assert!(!latest_genai(Some("http")));
        assert!(!latest_genai(Some("gen_ai_latest_experimental_not")));
        assert!(!latest_genai(None));
    }
}
