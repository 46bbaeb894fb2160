//! Reading the few request fields measurement needs (model, stream flag, usage opt-in,
//! requested max tokens) from an OpenAI-style request body.
//!
//! Request bodies can be megabytes of prompt, so the prompt and messages are skipped by the
//! parser, never materialised; and a field of an unexpected type loses only that field, so
//! one odd client parameter does not cost the whole request its labels.

use serde::de::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// What a request asks for, as far as measurement cares.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub model: Option<String>,
    pub stream: bool,
    /// `stream_options.include_usage == true`: the final chunk will carry token counts.
    pub include_usage: bool,
    /// `max_tokens`, else `max_completion_tokens`.
    pub max_tokens: Option<u64>,
}

/// Inspects a request body; `None` when it is not a JSON object.
pub fn inspect_request(body: &[u8]) -> Option<RequestInfo> {
    let body = body.trim_ascii();
    if !body.starts_with(b"{") {
        return None;
    }
    let wire: RequestWire = serde_json::from_slice(body).ok()?;
    Some(RequestInfo {
        model: wire.model.0,
        stream: wire.stream.0.unwrap_or(false),
        include_usage: wire
            .stream_options
            .0
            .and_then(|o| o.include_usage.0)
            .unwrap_or(false),
        max_tokens: wire.max_tokens.0.or(wire.max_completion_tokens.0),
    })
}

/// Unknown keys (`messages`, `prompt`, `tools`, ...) are skipped by serde's derive.
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
}

#[derive(serde::Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Lenient<bool>,
}

/// A field that reads as `None` when it is null or of another type, instead of failing.
/// These fields are small, so capturing the raw text and parsing it again costs little.
struct Lenient<T>(Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(deserializer)?;
        Ok(Lenient(serde_json::from_str(raw.get()).ok()))
    }
}
