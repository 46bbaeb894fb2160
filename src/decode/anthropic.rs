//! The Anthropic Messages dialect (`/v1/messages`): classifying one streamed event and
//! reading a non-streaming message body.
//!
//! A stream is `message_start`, then per content block `content_block_start`, its
//! `content_block_delta`s and `content_block_stop`, then `message_delta` (stop reason and
//! cumulative usage) and `message_stop`; `ping` and `error` may come at any point. The type
//! is in the SSE `event:` field and in the JSON `type`; the JSON wins, because some gateways
//! re-emit `data:` lines only.
//!
//! Token counts: input in `message_start` (its `output_tokens` is a placeholder and is
//! ignored), output in `message_delta`, which is cumulative, so the last one wins. Input is
//! reported as `input_tokens` plus the prompt-cache reads and writes, because Anthropic's
//! `input_tokens` leaves cached tokens out while every other dialect's prompt count
//! includes them: the profile needs the prompt's length, not its billing split.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::decode::body::BodyInfo;
use crate::decode::wire::{
    Accumulate, Folded, FromTag, Opening, Tag, foreign, lenient_object, non_empty, open_event,
    parse_object,
};
use crate::decode::{EventInfo, FinishReason, Usage};

/// Classifies one SSE event of a Messages stream (`event` is the SSE event name).
pub(crate) fn classify_event(event: &str, data: &[u8]) -> Result<EventInfo, serde_json::Error> {
    let wire: EventWire<'_> = match open_event(event, data, false)? {
        Opening::Classified(info) => return Ok(info),
        Opening::Object(wire) => wire,
    };
    let kind = match (wire.kind, event) {
        (Some(Tag(kind)), _) => kind,
        (None, "message") => return Err(foreign("Anthropic Messages")),
        (None, name) => Kind::from_tag(name),
    };
    Ok(match kind {
        Kind::MessageStart => {
            let message: Option<StartMessage<'_>> = lenient_object(wire.message);
            let raw = message.and_then(|m| m.usage);
            EventInfo {
                usage: usage(raw, false),
                cached_input_tokens: cache_read(raw),
                ..EventInfo::default()
            }
        }
        Kind::BlockStart => block_event(wire.content_block.as_ref().map(Block::output)),
        Kind::BlockDelta => block_event(wire.delta.as_ref().map(Delta::output)),
        Kind::MessageDelta => EventInfo {
            usage: usage(wire.usage, true),
            finish_reason: wire.delta.and_then(|d| d.stop_reason).map(|r| r.0),
            ..EventInfo::default()
        },
        Kind::MessageStop => EventInfo {
            terminal: true,
            ..EventInfo::default()
        },
        Kind::Error => EventInfo::failure(),
        Kind::Other => EventInfo::default(),
    })
}

/// Reads a non-streaming message body, or the `{"type":"error",...}` body of a failure.
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyInfo> {
    let wire: BodyWire<'_> = parse_object(body).ok()?;
    let blocks = wire.content.map_or_else(Output::default, |c| c.0);
    Some(BodyInfo {
        usage: usage(wire.usage, true),
        finish_reason: wire.stop_reason.map(|r| r.0),
        content: blocks.content,
        error: wire.error.is_some() || wire.kind.is_some_and(|k| k.0 == Kind::Error),
        cached_input_tokens: cache_read(wire.usage),
        engine: None,
    })
}

fn block_event(output: Option<Output>) -> EventInfo {
    let output = output.unwrap_or_default();
    EventInfo {
        content: output.content,
        answer: output.answer,
        ..EventInfo::default()
    }
}

/// Reads a usage object; `with_output` is false for `message_start`, whose output count is
/// a placeholder that must not overwrite nor pre-empt the real one.
fn usage(raw: Option<&RawValue>, with_output: bool) -> Option<Usage> {
    let wire: UsageWire = lenient_object(raw)?;
    let cached = wire
        .cache_creation_input_tokens
        .unwrap_or(0)
        .saturating_add(wire.cache_read_input_tokens.unwrap_or(0));
    let usage = Usage {
        input_tokens: wire.input_tokens.map(|n| n.saturating_add(cached)),
        output_tokens: wire.output_tokens.filter(|_| with_output),
    };
    (usage != Usage::default()).then_some(usage)
}

/// `cache_read_input_tokens`: input served from the prompt cache (cache writes are
/// prefill work, so they are not counted as cached).
fn cache_read(raw: Option<&RawValue>) -> Option<u64> {
    let wire: UsageWire = lenient_object(raw)?;
    wire.cache_read_input_tokens
}

#[derive(Deserialize)]
struct EventWire<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Tag<Kind>>,
    /// `message_start` only; raw so an odd message costs only its usage.
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content_block: Option<Block<'a>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    MessageStart,
    BlockStart,
    BlockDelta,
    MessageDelta,
    MessageStop,
    Error,
    /// `ping`, `content_block_stop`, and event types added later.
    Other,
}

impl FromTag for Kind {
    fn from_tag(tag: &str) -> Kind {
        match tag {
            "message_start" => Kind::MessageStart,
            "content_block_start" => Kind::BlockStart,
            "content_block_delta" => Kind::BlockDelta,
            "message_delta" => Kind::MessageDelta,
            "message_stop" => Kind::MessageStop,
            "error" => Kind::Error,
            _ => Kind::Other,
        }
    }
}

#[derive(Deserialize)]
struct StartMessage<'a> {
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// Generated output of one event, block or body.
#[derive(Copy, Clone, Default)]
struct Output {
    content: bool,
    answer: bool,
}

impl Output {
    fn answer(yes: bool) -> Output {
        Output {
            content: yes,
            answer: yes,
        }
    }

    fn reasoning(yes: bool) -> Output {
        Output {
            content: yes,
            answer: false,
        }
    }
}

/// The `delta` of `content_block_delta` (typed) or of `message_delta` (untyped, with
/// `stop_reason`).
#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Tag<DeltaKind>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partial_json: Option<&'a RawValue>,
    #[serde(default)]
    stop_reason: Option<Tag<FinishReason>>,
}

impl Delta<'_> {
    fn output(&self) -> Output {
        match self.kind.as_ref().map(|k| k.0) {
            Some(DeltaKind::Text) => Output::answer(non_empty(self.text)),
            Some(DeltaKind::Thinking) => Output::reasoning(non_empty(self.thinking)),
            Some(DeltaKind::InputJson) => Output::answer(non_empty(self.partial_json)),
            // `signature_delta` (an integrity tag over the thinking, not generated text),
            // `citations_delta`, and later additions.
            Some(DeltaKind::Other) | None => Output::default(),
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum DeltaKind {
    Text,
    Thinking,
    InputJson,
    Other,
}

impl FromTag for DeltaKind {
    fn from_tag(tag: &str) -> DeltaKind {
        match tag {
            "text_delta" => DeltaKind::Text,
            "thinking_delta" => DeltaKind::Thinking,
            "input_json_delta" => DeltaKind::InputJson,
            _ => DeltaKind::Other,
        }
    }
}

/// A content block: `content_block` of `content_block_start`, or an element of a body's
/// `content`.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Tag<BlockKind>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

impl Block<'_> {
    fn output(&self) -> Output {
        match self.kind.as_ref().map(|k| k.0) {
            Some(BlockKind::Text) => Output::answer(non_empty(self.text)),
            Some(BlockKind::Thinking) => Output::reasoning(non_empty(self.thinking)),
            // Reasoning the API hands over encrypted, whole, with no deltas.
            Some(BlockKind::RedactedThinking) => Output::reasoning(non_empty(self.data)),
            // The model wrote the tool's name: the same first tool-call token that OpenAI's
            // first `tool_calls` chunk carries, even before any argument arrives.
            Some(BlockKind::ToolUse) => Output::answer(true),
            // Tool results and later additions are not written by the model.
            Some(BlockKind::Other) | None => Output::default(),
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum BlockKind {
    Text,
    Thinking,
    RedactedThinking,
    ToolUse,
    Other,
}

impl FromTag for BlockKind {
    fn from_tag(tag: &str) -> BlockKind {
        match tag {
            "text" => BlockKind::Text,
            "thinking" => BlockKind::Thinking,
            "redacted_thinking" => BlockKind::RedactedThinking,
            "tool_use" | "server_tool_use" | "mcp_tool_use" => BlockKind::ToolUse,
            _ => BlockKind::Other,
        }
    }
}

impl<'de> Accumulate<'de> for Output {
    type Item = Block<'de>;

    fn add(&mut self, block: Block<'de>) {
        let out = block.output();
        self.content |= out.content;
        self.answer |= out.answer;
    }
}

/// A message body, or an error body (`{"type":"error","error":{...}}`).
#[derive(Deserialize)]
struct BodyWire<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Tag<Kind>>,
    #[serde(default)]
    content: Option<Folded<Output>>,
    #[serde(default)]
    stop_reason: Option<Tag<FinishReason>>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

#[cfg(test)]
mod tests;
