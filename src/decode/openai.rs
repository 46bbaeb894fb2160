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

use crate::decode::wire::{Accumulate, Folded, Tag, lenient_object, non_empty_raw, parse_object};
use crate::decode::{EngineTiming, EventInfo, FinishReason, Usage};

/// Kept at their old paths: the body reader now covers every dialect.
pub use crate::decode::body::{BodyInfo, parse_response_body};

/// Classifies the `data` of one streamed event.
///
/// `[DONE]` is the terminal marker; blank data (a keep-alive some servers send) is an empty
/// event. Anything else must be a JSON object, otherwise the error says the stream is not
/// decodable as this dialect.
pub fn classify_chunk(data: &[u8]) -> Result<EventInfo, serde_json::Error> {
    classify_chunk_text(data).map(|(info, _)| info)
}

/// The generated text of one streamed event, as far as classification already saw it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum EventText<'a> {
    /// No text at the collected paths.
    #[default]
    None,
    /// One plain string (no escapes) is the whole text: the usual token chunk.
    One(&'a str),
    /// Several strings, escapes, tool calls or odd values: walk the event with
    /// `text::collect` to get it right.
    Other,
}

impl<'a> EventText<'a> {
    fn and(self, other: EventText<'a>) -> EventText<'a> {
        match (self, other) {
            (EventText::None, x) | (x, EventText::None) => x,
            _ => EventText::Other,
        }
    }

    /// The text of a raw value at a collected path.
    fn of_raw(raw: Option<&'a str>) -> EventText<'a> {
        let Some(raw) = raw else {
            return EventText::None;
        };
        if raw == "null" {
            return EventText::None;
        }
        match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            Some("") => EventText::None,
            Some(inner) if !inner.contains('\\') => EventText::One(inner),
            _ => EventText::Other,
        }
    }
}

/// As [`classify_chunk`], also telling the event's text when classification already found
/// it (`text::collect` then need not parse the event a second time; docs/PERFORMANCE.md).
/// The text paths are those of `text::paths::OPENAI_EVENT`.
pub fn classify_chunk_text(data: &[u8]) -> Result<(EventInfo, EventText<'_>), serde_json::Error> {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        let info = EventInfo {
            terminal: true,
            ..EventInfo::default()
        };
        return Ok((info, EventText::None));
    }
    if trimmed.is_empty() {
        return Ok((EventInfo::default(), EventText::None));
    }
    if let Some(scanned) = scan::classify(trimmed) {
        return Ok(scanned);
    }
    classify_with_serde(trimmed)
}

/// The general path: every chunk [`scan`] leaves alone.
fn classify_with_serde(trimmed: &[u8]) -> Result<(EventInfo, EventText<'_>), serde_json::Error> {
    let wire: Wire<'_> = parse_object(trimmed)?;
    let choices = wire.choices();
    let info = EventInfo {
        content: choices.content,
        answer: choices.answer,
        usage: wire.usage(),
        finish_reason: choices.finish_reason,
        terminal: false,
        error: wire.is_error(),
        cached_input_tokens: wire.cached_input_tokens(),
        engine: wire.engine(),
    };
    Ok((info, choices.text))
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
        cached_input_tokens: wire.cached_input_tokens(),
        engine: wire.engine(),
    })
}

/// A chunk or a response body; both share the `choices` / `usage` / `error` shape.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    choices: Option<Folded<Choices<'a>>>,
    /// Raw so that an odd `usage` (null, or not an object) never fails the whole chunk.
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    /// Older vLLM error bodies are `{"object": "error", "message": ...}`.
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    /// vLLM's per-request timings (`--enable-per-request-metrics`).
    #[serde(borrow, default)]
    metrics: Option<&'a RawValue>,
    /// SGLang's request metadata, timings included.
    #[serde(borrow, default)]
    meta_info: Option<&'a RawValue>,
}

impl<'a> Wire<'a> {
    fn choices(&self) -> Choices<'a> {
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

    /// The engine's own timings: vLLM's `metrics`, else SGLang's `meta_info`.
    fn engine(&self) -> Option<EngineTiming> {
        EngineTiming::from_vllm(self.metrics).or_else(|| EngineTiming::from_sglang(self.meta_info))
    }

    /// `usage.prompt_tokens_details.cached_tokens` (vLLM with prefix caching, OpenAI).
    fn cached_input_tokens(&self) -> Option<u64> {
        let wire: UsageWire = lenient_object(self.usage)?;
        wire.prompt_tokens_details?.cached_tokens
    }
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<CachedDetails>,
}

/// `prompt_tokens_details` (chat completions) or `input_tokens_details` (Responses).
#[derive(Deserialize)]
pub(super) struct CachedDetails {
    #[serde(default)]
    pub(super) cached_tokens: Option<u64>,
}

/// `choices` folded while parsing: no `Vec` of choices is ever built.
#[derive(Copy, Clone, Default)]
struct Choices<'a> {
    content: bool,
    answer: bool,
    finish_reason: Option<FinishReason>,
    /// The text at the streamed-event text paths, in document order.
    text: EventText<'a>,
}

impl<'a> Choices<'a> {
    fn add(&mut self, choice: &ChoiceFields<'a>) {
        let (content, answer) = choice.output();
        self.content |= content;
        self.answer |= answer;
        self.text = self.text.and(choice.event_text());
        if let Some(reason) = choice.finish_reason {
            self.finish_reason.get_or_insert(reason);
        }
    }
}

impl<'de: 'a, 'a> Accumulate<'de> for Choices<'a> {
    type Item = Choice<'a>;

    fn add(&mut self, choice: Choice<'a>) {
        Choices::add(self, &choice.fields());
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

impl<'a> Choice<'a> {
    fn fields(&self) -> ChoiceFields<'a> {
        ChoiceFields {
            delta: self.delta.as_ref().map(Message::fields),
            message: self.message.as_ref().map(Message::fields),
            text: self.text.map(RawValue::get),
            finish_reason: self.finish_reason.as_ref().map(|Tag(r)| *r),
        }
    }
}

/// A choice as raw JSON text per field (absent or `null` is `None`), however it was read:
/// by serde's derive or by [`scan`].
#[derive(Copy, Clone, Default)]
struct ChoiceFields<'a> {
    delta: Option<MessageFields<'a>>,
    message: Option<MessageFields<'a>>,
    text: Option<&'a str>,
    finish_reason: Option<FinishReason>,
}

impl<'a> ChoiceFields<'a> {
    /// The text `text::paths::OPENAI_EVENT` would collect: the delta's and `text`.
    fn event_text(&self) -> EventText<'a> {
        let delta = self
            .delta
            .as_ref()
            .map_or(EventText::None, MessageFields::event_text);
        delta.and(EventText::of_raw(self.text))
    }

    /// (content, answer) over the delta, the message and the completions `text`.
    fn output(&self) -> (bool, bool) {
        let text = non_empty_raw(self.text);
        [self.delta.as_ref(), self.message.as_ref()]
            .into_iter()
            .flatten()
            .map(MessageFields::output)
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

impl<'a> Message<'a> {
    fn fields(&self) -> MessageFields<'a> {
        MessageFields {
            content: self.content.map(RawValue::get),
            reasoning_content: self.reasoning_content.map(RawValue::get),
            reasoning: self.reasoning.map(RawValue::get),
            tool_calls: self.tool_calls.map(RawValue::get),
            function_call: self.function_call.map(RawValue::get),
            refusal: self.refusal.map(RawValue::get),
        }
    }
}

/// [`Message`] as raw JSON text per field.
#[derive(Copy, Clone, Default)]
struct MessageFields<'a> {
    content: Option<&'a str>,
    reasoning_content: Option<&'a str>,
    reasoning: Option<&'a str>,
    tool_calls: Option<&'a str>,
    function_call: Option<&'a str>,
    refusal: Option<&'a str>,
}

impl<'a> MessageFields<'a> {
    /// The text of the collected fields, in the order they usually come; any tool or
    /// function call, or more than one string, needs the full walk.
    fn event_text(&self) -> EventText<'a> {
        if non_empty_raw(self.tool_calls) || non_empty_raw(self.function_call) {
            return EventText::Other;
        }
        [
            self.content,
            self.reasoning_content,
            self.reasoning,
            self.refusal,
        ]
        .into_iter()
        .map(EventText::of_raw)
        .fold(EventText::None, EventText::and)
    }

    /// (content, answer): reasoning is content but not answer, so TTFO can skip it.
    fn output(&self) -> (bool, bool) {
        let answer = [
            self.content,
            self.tool_calls,
            self.function_call,
            self.refusal,
        ]
        .into_iter()
        .any(non_empty_raw);
        let reasoning = non_empty_raw(self.reasoning_content) || non_empty_raw(self.reasoning);
        (answer || reasoning, answer)
    }
}

/// Whether [`scan`] and serde agree on `data` (or the scanner left it to serde): for the
/// fuzz target `openai_scan`, which runs it on arbitrary input.
#[doc(hidden)]
pub fn scan_agrees(data: &[u8]) -> bool {
    let trimmed = data.trim_ascii();
    match scan::classify(trimmed) {
        None => true,
        Some(scanned) => classify_with_serde(trimmed).is_ok_and(|slow| slow == scanned),
    }
}

/// Whether a [`ChunkTemplate`] fed the lines of `data` agrees with the classifier on each:
/// for the fuzz target `openai_scan`.
#[doc(hidden)]
pub fn template_agrees(data: &[u8]) -> bool {
    template::agrees(data)
}

mod scan;
mod template;

pub use template::ChunkTemplate;
#[cfg(test)]
mod tests;
