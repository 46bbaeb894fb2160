//! The OpenAI Responses API dialect (`/v1/responses`): classifying one streamed event and
//! reading a non-streaming response object.
//!
//! A stream is typed events (`response.created`, `response.output_text.delta`, ...,
//! `response.completed`); the type is in the SSE `event:` field and in the JSON `type`, and
//! the JSON wins because some gateways re-emit `data:` lines only. Text, refusal and
//! tool-argument deltas are answer output; reasoning deltas are content but not answer.
//! Token counts arrive once, in the terminal event's `response.usage`.
//!
//! Per-token events are read with borrowed fields only; the terminal event's `response`
//! object (which repeats the whole output) is captured raw and parsed once, at the end.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::decode::body::BodyInfo;
use crate::decode::wire::{
    Accumulate, Folded, FromTag, Opening, Tag, foreign, lenient_object, non_empty, open_event,
    parse_object,
};
use crate::decode::{EventInfo, FinishReason, Usage};

/// Classifies one SSE event of a Responses stream (`event` is the SSE event name).
pub(crate) fn classify_event(event: &str, data: &[u8]) -> Result<EventInfo, serde_json::Error> {
    // `[DONE]` is not in OpenAI's stream, but some compatible gateways end every stream with it.
    let wire: EventWire<'_> = match open_event(event, data, true)? {
        Opening::Classified(info) => return Ok(info),
        Opening::Object(wire) => wire,
    };
    let kind = match (wire.kind, event) {
        (Some(Tag(kind)), _) => kind,
        (None, "message") => return Err(foreign("Responses API")),
        (None, name) => Kind::from_tag(name),
    };
    Ok(match kind {
        Kind::AnswerDelta => {
            let content = non_empty(wire.delta);
            EventInfo {
                content,
                answer: content,
                ..EventInfo::default()
            }
        }
        Kind::ReasoningDelta => EventInfo {
            content: non_empty(wire.delta),
            ..EventInfo::default()
        },
        Kind::Completed | Kind::Incomplete | Kind::Failed => {
            let response: ResponseWire<'_> = lenient_object(wire.response).unwrap_or_default();
            let fallback = match kind {
                Kind::Completed => Status::Completed,
                Kind::Incomplete => Status::Incomplete,
                _ => Status::Failed,
            };
            EventInfo {
                usage: response.usage(),
                cached_input_tokens: response.cached_input_tokens(),
                finish_reason: response.finish_reason(fallback),
                terminal: true,
                error: kind == Kind::Failed || response.error.is_some(),
                ..EventInfo::default()
            }
        }
        Kind::Error => EventInfo::failure(),
        Kind::Other => EventInfo::default(),
    })
}

/// Reads a non-streaming response object (or an `{"error": ...}` body).
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyInfo> {
    let wire: ResponseWire<'_> = parse_object(body).ok()?;
    let output = wire.output();
    let status = wire.status.as_ref().map(|s| s.0);
    Some(BodyInfo {
        usage: wire.usage(),
        finish_reason: status.and_then(|s| wire.finish_reason(s)),
        content: output.content,
        error: wire.error.is_some() || status == Some(Status::Failed),
        cached_input_tokens: wire.cached_input_tokens(),
        engine: None,
    })
}

#[derive(Deserialize)]
struct EventWire<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Tag<Kind>>,
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    AnswerDelta,
    ReasoningDelta,
    Completed,
    Incomplete,
    Failed,
    Error,
    Other,
}

impl FromTag for Kind {
    fn from_tag(tag: &str) -> Kind {
        match tag {
            // Model-written output the user (or the user's tool) receives. Audio deltas are
            // left out: their transcript deltas would count the same tokens twice.
            "response.output_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta"
            | "response.custom_tool_call_input.delta"
            | "response.mcp_call_arguments.delta"
            | "response.code_interpreter_call_code.delta" => Kind::AnswerDelta,
            "response.completed" => Kind::Completed,
            "response.incomplete" => Kind::Incomplete,
            "response.failed" => Kind::Failed,
            "error" => Kind::Error,
            // `response.reasoning_text.delta`, `response.reasoning_summary_text.delta`, and
            // whatever reasoning delta comes next.
            t if t.starts_with("response.reasoning") && t.ends_with(".delta") => {
                Kind::ReasoningDelta
            }
            _ => Kind::Other,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Status {
    Completed,
    Incomplete,
    Failed,
    Other,
}

impl FromTag for Status {
    fn from_tag(tag: &str) -> Status {
        match tag {
            "completed" => Status::Completed,
            "incomplete" => Status::Incomplete,
            "failed" => Status::Failed,
            _ => Status::Other,
        }
    }
}

/// A response object: the body of a non-streamed request, and `response` in stream events.
#[derive(Deserialize, Default)]
struct ResponseWire<'a> {
    #[serde(default)]
    status: Option<Tag<Status>>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    output: Option<Folded<Output>>,
}

impl ResponseWire<'_> {
    fn output(&self) -> Output {
        self.output.as_ref().map_or_else(Output::default, |o| o.0)
    }

    fn usage(&self) -> Option<Usage> {
        let wire: UsageWire = lenient_object(self.usage)?;
        let usage = Usage {
            input_tokens: wire.input_tokens,
            output_tokens: wire.output_tokens,
        };
        (usage != Usage::default()).then_some(usage)
    }

    /// `usage.input_tokens_details.cached_tokens`.
    fn cached_input_tokens(&self) -> Option<u64> {
        let wire: UsageWire = lenient_object(self.usage)?;
        wire.input_tokens_details?.cached_tokens
    }

    /// A completed response that ends in a client-side tool call stopped for it, as
    /// chat completions' `tool_calls` does; an incomplete one says why in its details.
    fn finish_reason(&self, fallback: Status) -> Option<FinishReason> {
        match self.status.as_ref().map_or(fallback, |s| s.0) {
            Status::Completed if self.output().tool_call => Some(FinishReason::ToolCalls),
            Status::Completed => Some(FinishReason::Stop),
            Status::Incomplete => Some(
                self.incomplete_details
                    .as_ref()
                    .and_then(|d| d.reason.as_ref())
                    .map_or(FinishReason::Other, |r| r.0),
            ),
            Status::Failed | Status::Other => None,
        }
    }
}

#[derive(Deserialize)]
struct IncompleteDetails {
    /// `max_output_tokens` or `content_filter`, both in [`FinishReason::from_wire`].
    #[serde(default)]
    reason: Option<Tag<FinishReason>>,
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<super::openai::CachedDetails>,
}

/// The `output` items folded while parsed.
#[derive(Copy, Clone, Default)]
struct Output {
    content: bool,
    tool_call: bool,
}

impl<'de> Accumulate<'de> for Output {
    type Item = Item<'de>;

    fn add(&mut self, item: Item<'de>) {
        let kind = item.kind.as_ref().map_or(ItemKind::Other, |k| k.0);
        self.content |= match kind {
            ItemKind::Message | ItemKind::Reasoning => {
                lenient_parts(item.content) || lenient_parts(item.summary)
            }
            ItemKind::ToolCall => true,
            ItemKind::Other => false,
        };
        self.tool_call |= kind == ItemKind::ToolCall;
    }
}

/// One output item; `content` and `summary` stay raw because only message and reasoning
/// items give them the parts shape, and another item's odd field must not fail the rest.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Tag<ItemKind>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    summary: Option<&'a RawValue>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ItemKind {
    Message,
    Reasoning,
    /// A call the client runs: the response stopped to hand it over.
    ToolCall,
    Other,
}

impl FromTag for ItemKind {
    fn from_tag(tag: &str) -> ItemKind {
        match tag {
            "message" => ItemKind::Message,
            "reasoning" => ItemKind::Reasoning,
            "function_call" | "custom_tool_call" => ItemKind::ToolCall,
            _ => ItemKind::Other,
        }
    }
}

/// Whether an array of parts (`output_text`, `refusal`, `reasoning_text`, `summary_text`)
/// has any text.
fn lenient_parts(raw: Option<&RawValue>) -> bool {
    raw.and_then(|raw| serde_json::from_str::<Folded<AnyText>>(raw.get()).ok())
        .is_some_and(|parts| parts.0.0)
}

#[derive(Default)]
struct AnyText(bool);

impl<'de> Accumulate<'de> for AnyText {
    type Item = Part<'de>;

    fn add(&mut self, part: Part<'de>) {
        self.0 |= non_empty(part.text) || non_empty(part.refusal);
    }
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests;
