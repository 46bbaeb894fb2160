//! The OpenAI dialect (chat completions and legacy completions, as spoken by OpenAI, vLLM,
//! SGLang, llama.cpp server and most gateways): classifying one streamed `data:` payload and
//! reading a non-streaming response body.
//!
//! Streamed chunks are classified once per event on the data path, so nothing here builds a
//! `serde_json::Value` or collects vectors: `choices` is folded into flags while it is
//! parsed, fields whose only question is "empty or not" are kept as borrowed raw JSON text,
//! and everything else is skipped with `IgnoredAny` by serde's derive.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::decode::{Api, EventInfo, FinishReason, Usage};

/// What a non-streaming response body tells the measurement.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct BodyInfo {
    pub usage: Option<Usage>,
    pub finish_reason: Option<FinishReason>,
    /// Some choice produced output (text, reasoning, tool calls or a refusal).
    pub content: bool,
    /// The body is an error object rather than a completion.
    pub error: bool,
}

/// Classifies the `data` of one streamed event.
///
/// `[DONE]` is the terminal marker; blank data (a keep-alive some servers send) is an empty
/// event. Anything else must be a JSON object, otherwise the error says the stream is not
/// decodable as this dialect.
pub fn classify_chunk(data: &[u8]) -> Result<EventInfo, serde_json::Error> {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return Ok(EventInfo {
            terminal: true,
            ..EventInfo::default()
        });
    }
    if trimmed.is_empty() {
        return Ok(EventInfo::default());
    }
    let wire = parse_object(trimmed)?;
    Ok(EventInfo {
        content: wire.content(),
        usage: wire.usage(),
        finish_reason: wire.finish_reason(),
        terminal: false,
        error: wire.is_error(),
    })
}

/// Reads a non-streaming chat/completions response body; `None` when the API is not one
/// this dialect knows or the body is not a JSON object.
pub fn parse_response_body(api: Api, body: &[u8]) -> Option<BodyInfo> {
    if api == Api::Unknown {
        return None;
    }
    let wire = parse_object(body.trim_ascii()).ok()?;
    Some(BodyInfo {
        usage: wire.usage(),
        finish_reason: wire.finish_reason(),
        content: wire.content(),
        error: wire.is_error(),
    })
}

/// serde's derive would also accept a JSON array as a struct; only objects are chunks.
fn parse_object(json: &[u8]) -> Result<Wire<'_>, serde_json::Error> {
    if !json.starts_with(b"{") {
        return Err(de::Error::invalid_type(
            de::Unexpected::Other("non-object JSON"),
            &"a JSON object",
        ));
    }
    serde_json::from_slice(json)
}

/// A chunk or a response body; both share the `choices` / `usage` / `error` shape.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    choices: Option<Choices>,
    /// Raw so that an odd `usage` (null, or not an object) never fails the whole chunk.
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    /// Older vLLM error bodies are `{"object": "error", "message": ...}`.
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
}

impl Wire<'_> {
    fn content(&self) -> bool {
        self.choices.as_ref().is_some_and(|c| c.content)
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        self.choices.as_ref().and_then(|c| c.finish_reason)
    }

    fn is_error(&self) -> bool {
        self.error.is_some() || self.object.is_some_and(|o| o.get() == r#""error""#)
    }

    fn usage(&self) -> Option<Usage> {
        let raw = self.usage?.get();
        if !raw.starts_with('{') {
            return None;
        }
        let wire: UsageWire = serde_json::from_str(raw).ok()?;
        let usage = Usage {
            input_tokens: wire.prompt_tokens,
            output_tokens: wire.completion_tokens,
        };
        (usage != Usage::default()).then_some(usage)
    }
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// `choices` folded while parsing: no `Vec` of choices is ever built.
#[derive(Default)]
struct Choices {
    content: bool,
    finish_reason: Option<FinishReason>,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(ChoicesVisitor)
    }
}

struct ChoicesVisitor;

impl<'de> Visitor<'de> for ChoicesVisitor {
    type Value = Choices;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of choices")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
        let mut folded = Choices::default();
        while let Some(choice) = seq.next_element::<Choice<'de>>()? {
            folded.content |= choice.has_content();
            if let Some(WireFinish(reason)) = choice.finish_reason {
                folded.finish_reason.get_or_insert(reason);
            }
        }
        Ok(folded)
    }
}

/// One choice of a chunk (`delta`, `text`) or of a body (`message`, `text`).
#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Message<'a>>,
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(default)]
    finish_reason: Option<WireFinish>,
}

impl Choice<'_> {
    fn has_content(&self) -> bool {
        self.delta.as_ref().is_some_and(Message::has_content)
            || self.message.as_ref().is_some_and(Message::has_content)
            || non_empty(self.text)
    }
}

/// The fields of a delta or message that count as generated output.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<&'a RawValue>,
}

impl Message<'_> {
    fn has_content(&self) -> bool {
        [
            self.content,
            self.reasoning_content,
            self.reasoning,
            self.tool_calls,
            self.refusal,
        ]
        .into_iter()
        .any(non_empty)
    }
}

/// Judges emptiness on the raw JSON text, so escapes (`"\n"`, `"\u00e9"`) are non-empty
/// without being decoded. JSON `null` already arrives as `None`.
fn non_empty(raw: Option<&RawValue>) -> bool {
    let Some(raw) = raw else {
        return false;
    };
    let text = raw.get().trim();
    if text == r#""""# || text == "null" {
        return false;
    }
    match text.as_bytes() {
        [b'[' | b'{', inner @ .., _] => !inner.trim_ascii().is_empty(),
        _ => true,
    }
}

/// A `finish_reason` string, normalized while borrowed (no allocation even with escapes).
struct WireFinish(FinishReason);

impl<'de> Deserialize<'de> for WireFinish {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = WireFinish;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a finish reason string")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<WireFinish, E> {
                Ok(WireFinish(FinishReason::from_wire(s)))
            }
        }
        deserializer.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests;
