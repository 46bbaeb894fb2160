//! The Text Generation Inference native dialect (`/generate_stream`, `/generate`):
//! classifying one streamed event and reading a non-streaming body.
//!
//! Every streamed `data:` object carries one generated `token`; the last one also carries
//! `generated_text` and `details` (finish reason, generated token count). A special token
//! (end of sequence) is not output. TGI streams raw tokens, so it does not separate
//! reasoning: all its output is answer.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::decode::body::BodyInfo;
use crate::decode::wire::{
    Count, Folded, Opening, Tag, foreign, lenient_object, non_empty, open_event, parse_object,
};
use crate::decode::{EngineTiming, EventInfo, FinishReason, Usage};

/// Classifies one SSE event of a `generate_stream` response.
pub(crate) fn classify_event(event: &str, data: &[u8]) -> Result<EventInfo, serde_json::Error> {
    let wire: Wire<'_> = match open_event(event, data, false)? {
        Opening::Classified(info) => return Ok(info),
        Opening::Object(wire) => wire,
    };
    if wire.error.is_some() {
        return Ok(EventInfo::failure());
    }
    if wire.token.is_none() && wire.generated_text.is_none() && wire.details.is_none() {
        // SGLang's native `/generate` (`{"text": ..., "meta_info": ...}`) lands here too.
        return Err(foreign("TGI"));
    }
    let content = wire.token.as_ref().is_some_and(Token::is_output);
    Ok(EventInfo {
        content,
        answer: content,
        usage: wire.details.as_ref().and_then(Details::usage),
        finish_reason: wire.details.as_ref().and_then(Details::finish_reason),
        terminal: wire.generated_text.is_some() || wire.details.is_some(),
        error: false,
        cached_input_tokens: None,
        engine: None,
    })
}

/// Reads a `/generate` body (`details` only when the request asked for them).
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyInfo> {
    let wire: Wire<'_> = parse_object(body).ok()?;
    if wire.error.is_some() {
        return Some(BodyInfo {
            error: true,
            ..BodyInfo::default()
        });
    }
    let Some(text) = wire.generated_text else {
        return sglang_body(&wire);
    };
    Some(BodyInfo {
        usage: wire.details.as_ref().and_then(Details::usage),
        finish_reason: wire.details.as_ref().and_then(Details::finish_reason),
        content: non_empty(Some(text)),
        error: false,
        cached_input_tokens: None,
        engine: None,
    })
}

/// SGLang's native `/generate` body, which shares TGI's path: `{"text": ..., "meta_info":
/// {...}}`, with the counts and the engine's own timings in `meta_info`.
fn sglang_body(wire: &Wire<'_>) -> Option<BodyInfo> {
    let (text, meta) = (wire.text?, wire.meta_info?);
    let counts: SglangCounts = lenient_object(Some(meta)).unwrap_or_default();
    let usage = Usage {
        input_tokens: counts.prompt_tokens,
        output_tokens: counts.completion_tokens,
    };
    Some(BodyInfo {
        usage: (usage != Usage::default()).then_some(usage),
        finish_reason: counts.finish_reason.and_then(|f| f.kind).map(|t| t.0),
        content: non_empty(Some(text)),
        error: false,
        cached_input_tokens: counts.cached_tokens,
        engine: EngineTiming::from_sglang(Some(meta)),
    })
}

/// The counts in SGLang's `meta_info`.
#[derive(Default, Deserialize)]
struct SglangCounts {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    finish_reason: Option<SglangFinish>,
}

/// `meta_info.finish_reason`: `{"type": "stop", ...}`.
#[derive(Deserialize)]
struct SglangFinish {
    #[serde(rename = "type", default)]
    kind: Option<Tag<FinishReason>>,
}

/// A streamed event or a `/generate` body.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    token: Option<Token<'a>>,
    /// Non-null only on the last streamed event; the whole text in a body.
    #[serde(borrow, default)]
    generated_text: Option<&'a RawValue>,
    #[serde(default)]
    details: Option<Details>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    /// SGLang's `/generate` body: its text and its `meta_info`.
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    meta_info: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Token<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(default)]
    special: Option<bool>,
}

impl Token<'_> {
    fn is_output(&self) -> bool {
        self.special != Some(true) && non_empty(self.text)
    }
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    finish_reason: Option<Tag<FinishReason>>,
    #[serde(default)]
    generated_tokens: Option<u64>,
    /// The prompt length, in the stream details of recent TGI versions.
    #[serde(default)]
    input_length: Option<u64>,
    /// The same under the name some TGI-compatible servers use.
    #[serde(default)]
    prompt_tokens: Option<u64>,
    /// One entry per prompt token when the request set `decoder_input_details`.
    #[serde(default)]
    prefill: Option<Folded<Count>>,
}

impl Details {
    fn usage(&self) -> Option<Usage> {
        let prefill = self.prefill.as_ref().map(|p| p.0.0).filter(|&n| n > 0);
        let usage = Usage {
            input_tokens: self.input_length.or(self.prompt_tokens).or(prefill),
            output_tokens: self.generated_tokens,
        };
        (usage != Usage::default()).then_some(usage)
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        self.finish_reason.as_ref().map(|r| r.0)
    }
}

#[cfg(test)]
mod tests;
