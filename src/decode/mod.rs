//! Turning the bytes of an LLM request and response into what measurement needs.
//!
//! The data path hands every response chunk to a [`StreamDecoder`] right after forwarding
//! it; the decoder frames the stream ([`sse`] or [`ndjson`]), classifies each event with the
//! dialect's rules and reports one [`EventInfo`] per complete event, which the measurement
//! layer timestamps (first content-bearing event = TTFT, first answer event = TTFO, gaps =
//! ITL, usage = token counts). Non-streaming bodies go through [`parse_response_body`] and
//! request bodies through [`inspect_request`], both off the per-event path.
//!
//! One file per dialect, each with its streamed-event classifier and its body reader:
//! [`openai`] (chat completions, completions), `responses` (OpenAI Responses API),
//! `anthropic` (Messages), `tgi` (`generate_stream`), `llamacpp` (native `/completion`),
//! `ollama` (`/api/chat`, `/api/generate`); `wire` holds their shared borrowed-JSON pieces.
//!
//! [`text`] gathers the generated text (content, reasoning, tool calls) of a response whose
//! tokens must be counted because the upstream reports no usage.
//!
//! The dialect is never assumed: [`Api::from_path`] and [`StreamKind::from_content_type`]
//! pick it, and anything this module cannot decode is a flag ([`StreamDecoder::is_broken`]),
//! never an error that could stop bytes.

mod anthropic;
mod body;
mod engine;
mod llamacpp;
pub mod ndjson;
mod ollama;
pub mod openai;
mod request;
mod responses;
pub mod sse;
mod stream;
pub mod text;
mod tgi;
mod wire;

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod robustness_tests;
#[cfg(test)]
mod tests;

pub use body::{BodyInfo, parse_response_body, response_body_text};
pub use engine::EngineTiming;
pub use ndjson::NdjsonFramer;
pub use request::{RequestInfo, inspect_request};
pub use sse::{SseEvent, SseFramer};
pub use stream::{StreamDecoder, answer_text};
pub use text::TextBuf;

/// Which inference API a request targets, decided from its path alone.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI chat completions (`/chat/completions`), as most engines and gateways speak it.
    ChatCompletions,
    /// OpenAI legacy completions (`/completions`).
    Completions,
    /// OpenAI Responses API (`/responses`).
    Responses,
    /// Anthropic Messages (`/v1/messages`).
    Messages,
    /// Text Generation Inference native `/generate` and `/generate_stream`. The two share one
    /// label; `stream_endpoint` remembers which path it was, because `/generate_stream`
    /// always streams whatever the request body says.
    TgiGenerate { stream_endpoint: bool },
    /// llama.cpp server native `/completion` (singular; `/completions` is OpenAI's).
    LlamaCppCompletion,
    /// Ollama `/api/chat`.
    OllamaChat,
    /// Ollama `/api/generate`.
    OllamaGenerate,
    /// OpenAI embeddings (`/embeddings`): measured (e2e, input tokens) but not a
    /// generation, so never judged unless a class opts in and never part of goodput.
    Embeddings,
    /// No known dialect (`/metrics`, `/health`, `/v1/models`, ...): passed through, kept
    /// as a record, never judged unless a class opts in.
    Unknown,
}

impl Api {
    /// Classifies a request path (without query string).
    ///
    /// Matching is by suffix so that gateways mounting the API under a prefix
    /// (`/openai/v1/chat/completions`, Azure's `/openai/deployments/{name}/chat/completions`)
    /// are recognised; trailing slashes are ignored. Anthropic is matched on `/v1/messages`
    /// rather than `/messages` so that OpenAI's Assistants `/threads/{id}/messages` is not
    /// taken for it.
    pub fn from_path(path: &str) -> Api {
        const SUFFIXES: &[(&str, Api)] = &[
            ("/chat/completions", Api::ChatCompletions),
            ("/completions", Api::Completions),
            ("/completion", Api::LlamaCppCompletion),
            ("/responses", Api::Responses),
            ("/v1/messages", Api::Messages),
            ("/embeddings", Api::Embeddings),
            // Before TGI's `/generate`, which it also ends with.
            ("/api/generate", Api::OllamaGenerate),
            ("/api/chat", Api::OllamaChat),
            (
                "/generate_stream",
                Api::TgiGenerate {
                    stream_endpoint: true,
                },
            ),
            (
                "/generate",
                Api::TgiGenerate {
                    stream_endpoint: false,
                },
            ),
        ];
        let path = path.trim_end_matches('/');
        SUFFIXES
            .iter()
            .find(|(suffix, _)| path.ends_with(suffix))
            .map_or(Api::Unknown, |&(_, api)| api)
    }

    /// The label value used in metrics and profiles.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat_completions",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
            Api::TgiGenerate { .. } => "tgi_generate",
            Api::LlamaCppCompletion => "llamacpp_completion",
            Api::OllamaChat => "ollama_chat",
            Api::OllamaGenerate => "ollama_generate",
            Api::Embeddings => "embeddings",
            Api::Unknown => "unknown",
        }
    }

    /// The API a label ([`Api::as_str`]) names; `None` for any other text (such as
    /// `upgrade`, the label of tunnelled connections). Both TGI endpoints share one label,
    /// read back as `/generate`.
    pub fn from_label(label: &str) -> Option<Api> {
        const ALL: [Api; 10] = [
            Api::ChatCompletions,
            Api::Completions,
            Api::Responses,
            Api::Messages,
            Api::TgiGenerate {
                stream_endpoint: false,
            },
            Api::LlamaCppCompletion,
            Api::OllamaChat,
            Api::OllamaGenerate,
            Api::Embeddings,
            Api::Unknown,
        ];
        ALL.into_iter().find(|a| a.as_str() == label)
    }

    /// Whether the API generates output. Only generation traffic is judged against SLO
    /// classes, profiled and replayed (docs/DESIGN.md); the rest passes through.
    pub fn is_generation(self) -> bool {
        !matches!(self, Api::Embeddings | Api::Unknown)
    }
}

/// [`Api::is_generation`] for an `api` label as records and profiles carry it (`upgrade`
/// for tunnelled connections is not a generation either).
pub fn is_generation_label(api: &str) -> bool {
    !matches!(api, "unknown" | "embeddings" | "upgrade")
}

/// Why generation stopped, normalized across dialects so truncation and filtering rates
/// compare between engines.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Other,
}

impl FinishReason {
    pub const ALL: [FinishReason; 5] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::ToolCalls,
        FinishReason::ContentFilter,
        FinishReason::Other,
    ];

    /// Normalizes a wire value from any supported dialect. Case is ignored because some
    /// engines (Gemini-style gateways) upper-case these.
    pub fn from_wire(s: &str) -> FinishReason {
        const TABLE: &[(&str, FinishReason)] = &[
            ("stop", FinishReason::Stop),
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("eos_token", FinishReason::Stop),
            ("length", FinishReason::Length),
            ("max_tokens", FinishReason::Length),
            ("max_output_tokens", FinishReason::Length),
            // Anthropic: the context window, not `max_tokens`, cut the reply.
            ("model_context_window_exceeded", FinishReason::Length),
            ("tool_calls", FinishReason::ToolCalls),
            ("function_call", FinishReason::ToolCalls),
            ("tool_use", FinishReason::ToolCalls),
            ("content_filter", FinishReason::ContentFilter),
            // Anthropic's streaming safety classifier stopping the reply.
            ("refusal", FinishReason::ContentFilter),
        ];
        TABLE
            .iter()
            .find(|(wire, _)| wire.eq_ignore_ascii_case(s))
            .map_or(FinishReason::Other, |&(_, reason)| reason)
    }

    /// The label value used in metrics and profiles.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other => "other",
        }
    }
}

/// Token counts as reported by the upstream; either side may be missing.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct Usage {
    /// The prompt's length, cached tokens included in every dialect (for Anthropic that is
    /// `input_tokens` plus the cache reads and writes it reports apart).
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// What one decoded stream event tells the measurement.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct EventInfo {
    /// The event carries generated output (text, reasoning, tool call or refusal delta):
    /// the first one is TTFT.
    pub content: bool,
    /// The event carries answer output: content that is not reasoning-only (text, tool call,
    /// refusal). The first one is TTFO; always `content` too.
    pub answer: bool,
    /// Token counts, when this event carries them (usually the last chunk). A stream may
    /// report them in parts (Anthropic: input in `message_start`, output in `message_delta`)
    /// or repeatedly (cumulative counts): merge each side, a later value replacing an earlier.
    pub usage: Option<Usage>,
    /// Set on the event where a choice reports why it stopped.
    pub finish_reason: Option<FinishReason>,
    /// The dialect's end-of-stream marker; a stream ending without one was cut short. Also
    /// set on an error event after which the dialect ends the stream (all but OpenAI's).
    pub terminal: bool,
    /// The stream carried an error object instead of (or in the middle of) output.
    pub error: bool,
    /// Input tokens the upstream served from its prefix cache, where its usage says
    /// (OpenAI `usage.prompt_tokens_details.cached_tokens`, Responses
    /// `usage.input_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`).
    pub cached_input_tokens: Option<u64>,
    /// The engine's own timing of the request, where this event carries it (vLLM's
    /// `metrics` on the final usage chunk).
    pub engine: Option<EngineTiming>,
}

impl EventInfo {
    /// An error event after which the dialect ends the stream.
    pub(crate) fn failure() -> EventInfo {
        EventInfo {
            error: true,
            terminal: true,
            ..EventInfo::default()
        }
    }
}

/// The framing of a response body, decided from its `Content-Type`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    Sse,
    Ndjson,
    Json,
    Other,
}

impl StreamKind {
    /// Classifies a `Content-Type` header value; parameters and case are ignored.
    pub fn from_content_type(ct: Option<&str>) -> StreamKind {
        let Some(ct) = ct else {
            return StreamKind::Other;
        };
        let essence = ct.split(';').next().unwrap_or_default().trim();
        let is = |name: &str| essence.eq_ignore_ascii_case(name);
        if is("text/event-stream") {
            StreamKind::Sse
        } else if is("application/x-ndjson") || is("application/ndjson") || is("application/jsonl")
        {
            StreamKind::Ndjson
        } else if is("application/json") || ends_with_ignore_case(essence, "+json") {
            StreamKind::Json
        } else {
            StreamKind::Other
        }
    }
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    s.len()
        .checked_sub(suffix.len())
        .and_then(|start| s.as_bytes().get(start..))
        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix.as_bytes()))
}
