//! Reading a non-streaming response body, whichever dialect it is in.
//!
//! Runs on the aggregator, off the request's hot path, once per non-streamed response: it
//! picks the dialect's body reader from the [`Api`] and reports the same things a stream's
//! events would (usage, finish reason, whether anything was generated, error).

use crate::decode::text::{self, TextBuf, paths};
use crate::decode::{Api, FinishReason, Usage};
use crate::decode::{anthropic, llamacpp, ollama, openai, responses, tgi};

/// What a non-streaming response body tells the measurement.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct BodyInfo {
    pub usage: Option<Usage>,
    pub finish_reason: Option<FinishReason>,
    /// The body holds generated output (text, reasoning, tool calls or a refusal).
    pub content: bool,
    /// The body is an error object rather than a completion.
    pub error: bool,
    /// Input tokens served from the upstream's prefix cache, as in [`super::EventInfo`].
    pub cached_input_tokens: Option<u64>,
    /// The engine's own timing of the request, where the body carries it.
    pub engine: Option<super::EngineTiming>,
}

/// Reads a non-streaming response body; `None` when the API has no dialect here or the body
/// is not a JSON document of that dialect.
pub fn parse_response_body(api: Api, body: &[u8]) -> Option<BodyInfo> {
    let body = body.trim_ascii();
    match api {
        // An embeddings body shares the OpenAI `usage` shape (`prompt_tokens` only).
        Api::ChatCompletions | Api::Completions | Api::Embeddings => openai::parse_body(body),
        Api::Responses => responses::parse_body(body),
        Api::Messages => anthropic::parse_body(body),
        Api::TgiGenerate { .. } => tgi::parse_body(body),
        Api::LlamaCppCompletion => llamacpp::parse_body(body),
        Api::OllamaChat | Api::OllamaGenerate => ollama::parse_body(body),
        Api::Unknown => None,
    }
}

/// The generated text of a non-streaming body (up to `limit` bytes), for counting its
/// tokens when the body reports no usage; `None` when the API has no dialect here.
pub fn response_body_text(api: Api, body: &[u8], limit: usize) -> Option<TextBuf> {
    let paths = match api {
        Api::ChatCompletions | Api::Completions => paths::OPENAI_BODY,
        Api::Responses => paths::RESPONSES_BODY,
        Api::Messages => paths::ANTHROPIC_BODY,
        Api::TgiGenerate { .. } => paths::TGI_BODY,
        Api::LlamaCppCompletion => paths::LLAMACPP_BODY,
        Api::OllamaChat | Api::OllamaGenerate => paths::OLLAMA,
        Api::Embeddings | Api::Unknown => return None,
    };
    let mut buf = TextBuf::new(limit);
    text::collect(body.trim_ascii(), paths, &mut buf);
    Some(buf)
}

#[cfg(test)]
mod tests;
