//! The Ollama native dialect (`/api/chat`, `/api/generate`): classifying one NDJSON line
//! and reading a non-streaming body.
//!
//! Chat lines carry `message.content` / `message.thinking` / `message.tool_calls`, generate
//! lines carry `response` / `thinking`; both end with a `"done": true` line holding the
//! counts (`prompt_eval_count`, `eval_count`) and `done_reason`. One reader serves both,
//! since the field sets do not overlap. `thinking` is content but not answer.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::decode::body::BodyInfo;
use crate::decode::wire::{Tag, foreign, non_empty, parse_object};
use crate::decode::{EventInfo, FinishReason, Usage};

/// Classifies one line of an Ollama NDJSON stream.
pub(crate) fn classify_line(line: &[u8]) -> Result<EventInfo, serde_json::Error> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(EventInfo::default());
    }
    let wire: Wire<'_> = parse_object(line)?;
    if wire.error.is_some() {
        // `{"error": "..."}`: Ollama ends the stream with it.
        return Ok(EventInfo {
            error: true,
            terminal: true,
            ..EventInfo::default()
        });
    }
    let Some(done) = wire.done else {
        return Err(foreign("Ollama"));
    };
    let (content, answer) = wire.output();
    Ok(EventInfo {
        content,
        answer,
        usage: if done { wire.usage() } else { None },
        finish_reason: if done { wire.finish_reason() } else { None },
        terminal: done,
        error: false,
        cached_input_tokens: None,
        engine: None,
    })
}

/// Reads a non-streaming (`"stream": false`) chat or generate body.
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyInfo> {
    let wire: Wire<'_> = parse_object(body).ok()?;
    if wire.error.is_some() {
        return Some(BodyInfo {
            error: true,
            ..BodyInfo::default()
        });
    }
    wire.done?;
    Some(BodyInfo {
        usage: wire.usage(),
        finish_reason: wire.finish_reason(),
        content: wire.output().0,
        error: false,
        cached_input_tokens: None,
        engine: None,
    })
}

/// A chat or generate line (or body). The generate `context` array is skipped unread.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(default)]
    done: Option<bool>,
    #[serde(default)]
    done_reason: Option<Tag<FinishReason>>,
    #[serde(default)]
    prompt_eval_count: Option<u64>,
    #[serde(default)]
    eval_count: Option<u64>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

impl Wire<'_> {
    /// (content, answer).
    fn output(&self) -> (bool, bool) {
        let message = self.message.as_ref();
        let answer = non_empty(self.response)
            || message.is_some_and(|m| non_empty(m.content) || non_empty(m.tool_calls));
        let thinking = non_empty(self.thinking) || message.is_some_and(|m| non_empty(m.thinking));
        (answer || thinking, answer)
    }

    fn usage(&self) -> Option<Usage> {
        let usage = Usage {
            input_tokens: self.prompt_eval_count,
            output_tokens: self.eval_count,
        };
        (usage != Usage::default()).then_some(usage)
    }

    /// `stop` and `length`; `load` / `unload` (a model load, no generation) become `Other`.
    fn finish_reason(&self) -> Option<FinishReason> {
        self.done_reason.as_ref().map(|r| r.0)
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests;
