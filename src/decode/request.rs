//! Reading the few request fields measurement needs (model, stream flag, usage opt-in,
//! requested max tokens) from a request body, in the dialect its path says.
//!
//! Request bodies can be megabytes of prompt, so the prompt and messages are skipped by the
//! parser, never materialised; and a field of an unexpected type loses only that field, so
//! one odd client parameter does not cost the whole request its labels.

use crate::decode::Api;
use crate::decode::wire::Lenient;

/// What a request asks for, as far as measurement cares.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub model: Option<String>,
    /// Whether the response will stream, with the dialect's default when the body is silent
    /// (Ollama streams unless told not to; TGI's `/generate_stream` always streams).
    pub stream: bool,
    /// The upstream will report token counts without the proxy's help: for OpenAI chat and
    /// completions when `stream_options.include_usage == true`; for the other dialects
    /// always, because their protocol carries the counts (TGI's `/generate` only with
    /// `parameters.details`). Usage injection must only consider requests where this is false.
    pub include_usage: bool,
    /// The dialect's output cap: `max_tokens` (else `max_completion_tokens`) for OpenAI,
    /// `max_output_tokens` for Responses, `max_tokens` for Anthropic,
    /// `parameters.max_new_tokens` for TGI, `n_predict` (else `max_tokens`) for llama.cpp,
    /// `options.num_predict` for Ollama. Negative "no limit" values read as `None`.
    pub max_tokens: Option<u64>,
}

/// Inspects a request body for the given API; `None` when it is not a JSON object. An
/// [`Api::Unknown`] body is read with the OpenAI field names, the most common ones.
pub fn inspect_request(api: Api, body: &[u8]) -> Option<RequestInfo> {
    let body = body.trim_ascii();
    if !body.starts_with(b"{") {
        return None;
    }
    let wire: RequestWire = serde_json::from_slice(body).ok()?;
    let stream = wire.stream.0;
    let (stream, include_usage, max_tokens) = match api {
        Api::ChatCompletions | Api::Completions | Api::Unknown => (
            stream.unwrap_or(false),
            wire.stream_options
                .0
                .and_then(|o| o.include_usage.0)
                .unwrap_or(false),
            wire.max_tokens.0.or(wire.max_completion_tokens.0),
        ),
        Api::Responses => (stream.unwrap_or(false), true, wire.max_output_tokens.0),
        Api::Messages => (stream.unwrap_or(false), true, wire.max_tokens.0),
        Api::TgiGenerate { stream_endpoint } => {
            let params = wire.parameters.0.unwrap_or_default();
            // The body has no stream flag; the path decides.
            let details = stream_endpoint || params.details.0.unwrap_or(false);
            (stream_endpoint, details, params.max_new_tokens.0)
        }
        Api::LlamaCppCompletion => (
            stream.unwrap_or(false),
            true,
            wire.n_predict.0.or(wire.max_tokens.0),
        ),
        Api::OllamaChat | Api::OllamaGenerate => {
            let options = wire.options.0.unwrap_or_default();
            (stream.unwrap_or(true), true, options.num_predict.0)
        }
        // Embeddings never stream and always report usage.
        Api::Embeddings => (false, true, None),
    };
    Some(RequestInfo {
        model: wire.model.0,
        stream,
        include_usage,
        max_tokens,
    })
}

/// The union of every dialect's fields; unknown keys (`messages`, `prompt`, `inputs`,
/// `tools`, ...) are skipped by serde's derive.
#[derive(serde::Deserialize)]
struct RequestWire {
    #[serde(default)]
    model: Lenient<String>,
    #[serde(default)]
    stream: Lenient<bool>,
    #[serde(default)]
    stream_options: Lenient<StreamOptions>,
    #[serde(default)]
    max_tokens: Lenient<u64>,
    #[serde(default)]
    max_completion_tokens: Lenient<u64>,
    #[serde(default)]
    max_output_tokens: Lenient<u64>,
    #[serde(default)]
    parameters: Lenient<TgiParameters>,
    #[serde(default)]
    n_predict: Lenient<u64>,
    #[serde(default)]
    options: Lenient<OllamaOptions>,
}

#[derive(serde::Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Lenient<bool>,
}

#[derive(serde::Deserialize, Default)]
struct TgiParameters {
    #[serde(default)]
    max_new_tokens: Lenient<u64>,
    #[serde(default)]
    details: Lenient<bool>,
}

#[derive(serde::Deserialize, Default)]
struct OllamaOptions {
    #[serde(default)]
    num_predict: Lenient<u64>,
}

#[cfg(test)]
mod tests;
