//! The work a tokenizer worker does for one request: read the model and the prompt from
//! the request body, pick the model's tokenizer (or the estimate), and count the prompt and
//! the generated text into the measurement, which the aggregator then finishes.

use std::panic::{AssertUnwindSafe, catch_unwind};

use bytes::Bytes;

use super::{Counter, Fallback, prompt, stage::Wants};
use crate::config::Config;

use super::Tokenizers;
use crate::decode::{self, StreamKind, TextBuf};
use crate::measure::{Pending, TokenCount, TokenSource};

/// Fills in `p.counted_input` / `p.counted_output` as `wants` asks; returns why a count
/// fell back, if one did. Never panics: a tokenizer that does is a fallback like an error.
pub(crate) fn count_tokens(
    p: &mut Pending,
    config: &Config,
    tokenizers: &Tokenizers,
    wants: Wants,
) -> Option<Fallback> {
    let request = p
        .request_capture
        .as_ref()
        .filter(|c| c.complete && !c.overflow)
        .map(|c| joined(&c.chunks));
    let body = request.as_deref().and_then(prompt::parse);
    let model = body
        .as_ref()
        .and_then(|b| b.get("model"))
        .and_then(|m| m.as_str());
    let Some(counter) = tokenizers.counter_for(model) else {
        p.output_text = None;
        return None;
    };
    let limit = config.tokenizer.text_limit;
    let text = p.output_text.take();
    let counted = catch_unwind(AssertUnwindSafe(|| {
        let input = match (&body, wants.input) {
            (Some(body), true) => count_prompt(&counter, &prompt::extract(p.api, body)).map(Some),
            _ => Ok(None),
        };
        let output = if wants.output {
            count_output(&counter, p, text, limit)
        } else {
            Ok(None)
        };
        (input, output)
    }));
    let Ok((input, output)) = counted else {
        return Some(Fallback::TokenizeError);
    };
    let source = counter.source();
    let mut fallback = None;
    match input {
        Ok(n) => p.counted_input = n.map(|n| TokenCount { n, source }),
        Err(()) => fallback = Some(Fallback::TokenizeError),
    }
    match output {
        Ok(Some((n, truncated))) => {
            // Past the text limit the count is extrapolated from the part kept.
            let source = if truncated {
                TokenSource::Estimate
            } else {
                source
            };
            p.counted_output = Some(TokenCount { n, source });
            if truncated {
                fallback = fallback.or(Some(Fallback::TextLimit));
            }
        }
        Ok(None) => {}
        Err(()) => fallback = Some(Fallback::TokenizeError),
    }
    fallback
}

fn count_prompt(counter: &Counter, prompt: &prompt::Prompt<'_>) -> Result<u64, ()> {
    let mut n = prompt.token_ids;
    for piece in &prompt.pieces {
        n += counter.count(piece).map_err(|_| ())?;
    }
    Ok(n)
}

/// The output count and whether it was extrapolated past the text limit.
fn count_output(
    counter: &Counter,
    p: &Pending,
    text: Option<TextBuf>,
    limit: usize,
) -> Result<Option<(u64, bool)>, ()> {
    let text = match text {
        Some(text) => Some(text),
        None if p.kind == StreamKind::Json && !p.body_overflow => {
            let body = joined(&p.body);
            let reported = decode::parse_response_body(p.api, &body)
                .and_then(|b| b.usage)
                .and_then(|u| u.output_tokens);
            if reported.is_some() {
                return Ok(None);
            }
            decode::response_body_text(p.api, &body, limit)
        }
        None => None,
    };
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let kept = counter.count(text.text()).map_err(|_| ())?;
    if text.dropped() == 0 {
        return Ok(Some((kept, false)));
    }
    let kept_bytes = text.text().len().max(1) as f64;
    let scale = (kept_bytes + text.dropped() as f64) / kept_bytes;
    Ok(Some(((kept as f64 * scale).round() as u64, true)))
}

fn joined(chunks: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        out.extend_from_slice(c);
    }
    out
}
