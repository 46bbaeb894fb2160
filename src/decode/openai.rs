//! The OpenAI dialect (chat completions and legacy completions, as spoken by OpenAI, vLLM,
//! SGLang, llama.cpp server and most gateways): classifying one streamed `data:` payload and
//! reading a non-streaming response body.
//!
//! Streamed chunks are classified once per event on the data path, so nothing here builds a
//! `serde_json::Value` or collects vectors: `choices` is folded into flags while it is
//! parsed, fields whose only question is "empty or not" are kept as borrowed raw JSON text,
//! and everything else is skipped with `IgnoredAny` by serde's derive.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::decode::wire::{Accumulate, Folded, Tag, lenient_object, non_empty, parse_object};
use crate::decode::{EventInfo, FinishReason, Usage};

/// Kept at their old paths: the body reader now covers every dialect.
pub use crate::decode::body::{BodyInfo, parse_response_body};

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
    let wire: Wire<'_> = parse_object(trimmed)?;
    let choices = wire.choices();
    Ok(EventInfo {
        content: choices.content,
        answer: choices.answer,
        usage: wire.usage(),
        finish_reason: choices.finish_reason,
        terminal: false,
        error: wire.is_error(),
    })
}

/// Reads a non-streaming chat/completions response body; `None` when it is not a JSON object.
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyInfo> {
    let wire: Wire<'_> = parse_object(body).ok()?;
    let choices = wire.choices();
    Some(BodyInfo {
        usage: wire.usage(),
        finish_reason: choices.finish_reason,
        content: choices.content,
        error: wire.is_error(),
    })
}

/// A chunk or a response body; both share the `choices` / `usage` / `error` shape.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    choices: Option<Folded<Choices>>,
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
    fn choices(&self) -> Choices {
        self.choices.as_ref().map_or_else(Choices::default, |c| c.0)
    }

    fn is_error(&self) -> bool {
        self.error.is_some() || self.object.is_some_and(|o| o.get() == r#""error""#)
    }

    fn usage(&self) -> Option<Usage> {
        let wire: UsageWire = lenient_object(self.usage)?;
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
#[derive(Copy, Clone, Default)]
struct Choices {
    content: bool,
    answer: bool,
    finish_reason: Option<FinishReason>,
}

impl<'de> Accumulate<'de> for Choices {
    type Item = Choice<'de>;

    fn add(&mut self, choice: Choice<'de>) {
        let (content, answer) = choice.output();
        self.content |= content;
        self.answer |= answer;
        if let Some(Tag(reason)) = choice.finish_reason {
            self.finish_reason.get_or_insert(reason);
        }
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
    finish_reason: Option<Tag<FinishReason>>,
}

impl Choice<'_> {
    /// (content, answer) over the delta, the message and the completions `text`.
    fn output(&self) -> (bool, bool) {
        let text = non_empty(self.text);
        [self.delta.as_ref(), self.message.as_ref()]
            .into_iter()
            .flatten()
            .map(Message::output)
            .fold((text, text), |(c, a), (mc, ma)| (c || mc, a || ma))
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
    /// The legacy (pre-`tools`) function-calling delta: a tool call all the same.
    #[serde(borrow, default)]
    function_call: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<&'a RawValue>,
}

impl Message<'_> {
    /// (content, answer): reasoning is content but not answer, so TTFO can skip it.
    fn output(&self) -> (bool, bool) {
        let answer = [
            self.content,
            self.tool_calls,
            self.function_call,
            self.refusal,
        ]
        .into_iter()
        .any(non_empty);
        let reasoning = non_empty(self.reasoning_content) || non_empty(self.reasoning);
        (answer || reasoning, answer)
    }
}

#[cfg(test)]
mod tests;
