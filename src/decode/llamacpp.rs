//! The llama.cpp server native dialect (`/completion`, not the OpenAI-compatible
//! `/v1/completions`): classifying one streamed event and reading a non-streaming body.
//!
//! Streamed events are `{"content": "<piece>", "stop": false, ...}`; the last has
//! `"stop": true` with the final counts (`tokens_predicted`, `tokens_evaluated`, or
//! `timings.predicted_n` / `timings.prompt_n`) and why it stopped (`stop_type`, or the older
//! `stopped_eos` / `stopped_word` / `stopped_limit` flags). The native endpoint does not
//! separate reasoning, so its output is all answer.
//!
//! Known gap: older servers sent a mid-stream failure as an SSE `error:` field, which the
//! event-stream rules ignore; such a stream shows as ended without its terminal event.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::decode::body::BodyInfo;
use crate::decode::wire::{
    Accumulate, Folded, FromTag, Opening, Tag, foreign, non_empty, open_event, parse_object,
};
use crate::decode::{EventInfo, FinishReason, Usage};

/// Classifies one SSE event of a streamed `/completion` response.
pub(crate) fn classify_event(event: &str, data: &[u8]) -> Result<EventInfo, serde_json::Error> {
    // `[DONE]`: only the OpenAI-compatible routes send it; tolerated in case a build does.
    let wire: Wire<'_> = match open_event(event, data, true)? {
        Opening::Classified(info) => return Ok(info),
        Opening::Object(wire) => wire,
    };
    if wire.error.is_some() {
        return Ok(EventInfo::failure());
    }
    if wire.content.is_none() && wire.stop.is_none() {
        return Err(foreign("llama.cpp"));
    }
    let content = non_empty(wire.content);
    let stop = wire.stop == Some(true);
    Ok(EventInfo {
        content,
        answer: content,
        // Partial events may repeat running counts; only the last one is the usage report.
        usage: if stop { wire.usage() } else { None },
        finish_reason: if stop { wire.finish_reason() } else { None },
        terminal: stop,
        error: false,
        cached_input_tokens: None,
        engine: None,
    })
}

/// Reads a `/completion` body: one result object, or an array of them when the request had
/// several prompts (counts are then summed).
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyInfo> {
    if body.starts_with(b"[") {
        let all: Folded<Sum> = serde_json::from_slice(body).ok()?;
        return (all.0.results > 0).then_some(all.0.info);
    }
    let wire: Wire<'_> = parse_object(body).ok()?;
    if wire.error.is_some() {
        return Some(BodyInfo {
            error: true,
            ..BodyInfo::default()
        });
    }
    if wire.content.is_none() && wire.stop.is_none() {
        return None;
    }
    Some(wire.body_info())
}

/// A streamed event or a result body.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    stop: Option<bool>,
    #[serde(default)]
    tokens_predicted: Option<u64>,
    /// The whole prompt, cached or not (`timings.prompt_n` counts only the uncached part).
    #[serde(default)]
    tokens_evaluated: Option<u64>,
    #[serde(default)]
    timings: Option<Timings>,
    #[serde(default)]
    stop_type: Option<Tag<StopType>>,
    #[serde(default)]
    stopped_eos: Option<bool>,
    #[serde(default)]
    stopped_word: Option<bool>,
    #[serde(default)]
    stopped_limit: Option<bool>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

impl Wire<'_> {
    fn usage(&self) -> Option<Usage> {
        let timings = self.timings.as_ref();
        let usage = Usage {
            input_tokens: self.tokens_evaluated.or(timings.and_then(|t| t.prompt_n)),
            output_tokens: self
                .tokens_predicted
                .or(timings.and_then(|t| t.predicted_n)),
        };
        (usage != Usage::default()).then_some(usage)
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        match self.stop_type.as_ref().map(|t| t.0) {
            Some(StopType::Limit) => Some(FinishReason::Length),
            Some(StopType::Eos | StopType::Word) => Some(FinishReason::Stop),
            Some(StopType::None) => None,
            Some(StopType::Other) => Some(FinishReason::Other),
            // Servers older than `stop_type` set one flag instead.
            None if self.stopped_limit == Some(true) => Some(FinishReason::Length),
            None if self.stopped_eos == Some(true) || self.stopped_word == Some(true) => {
                Some(FinishReason::Stop)
            }
            None => None,
        }
    }

    fn body_info(&self) -> BodyInfo {
        BodyInfo {
            usage: self.usage(),
            finish_reason: self.finish_reason(),
            content: non_empty(self.content),
            error: self.error.is_some(),
            cached_input_tokens: None,
            engine: None,
        }
    }
}

#[derive(Deserialize)]
struct Timings {
    #[serde(default)]
    prompt_n: Option<u64>,
    #[serde(default)]
    predicted_n: Option<u64>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum StopType {
    None,
    Eos,
    Word,
    Limit,
    Other,
}

impl FromTag for StopType {
    fn from_tag(tag: &str) -> StopType {
        match tag {
            "none" => StopType::None,
            "eos" => StopType::Eos,
            "word" => StopType::Word,
            "limit" => StopType::Limit,
            _ => StopType::Other,
        }
    }
}

/// Several results summed into one body: the record is per request, not per prompt.
#[derive(Default)]
struct Sum {
    results: usize,
    info: BodyInfo,
}

impl<'de> Accumulate<'de> for Sum {
    type Item = Wire<'de>;

    fn add(&mut self, wire: Wire<'de>) {
        let one = wire.body_info();
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        let total = self.info.usage.unwrap_or_default();
        let this = one.usage.unwrap_or_default();
        let usage = Usage {
            input_tokens: add(total.input_tokens, this.input_tokens),
            output_tokens: add(total.output_tokens, this.output_tokens),
        };
        self.info.usage = (usage != Usage::default()).then_some(usage);
        self.info.finish_reason = self.info.finish_reason.or(one.finish_reason);
        self.info.content |= one.content;
        self.info.error |= one.error;
        self.results += 1;
    }
}

#[cfg(test)]
mod tests;
