//! Usage injection (opt-in, `[usage_injection]`): for an OpenAI-style streaming request
//! that did not ask for usage, add `stream_options.include_usage: true` on its way
//! upstream, so the upstream reports exact token counts; [`UsageFilter`] then removes the
//! usage-only chunk this adds from what the client receives.
//!
//! Deciding needs the body, so for a request the measurement layer marked as a candidate
//! ([`InjectPlan`]: enabled, OpenAI chat/completions API, configured path) the forwarder
//! reads the body ahead, up to the request inspection limit, before sending it. The JSON is
//! edited textually (a key inserted before a closing brace, or a `false` replaced by
//! `true`), so every other byte and the key order stay as the client sent them, and
//! `Content-Length` is set to the new length. Anything unexpected (over the limit, not
//! JSON, duplicate keys, odd `stream_options`, trailers, a read error) forwards the body
//! untouched.

mod strip;

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, header::CONTENT_LENGTH};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use serde::Deserialize;
use serde_json::value::RawValue;

pub use strip::UsageFilter;

use crate::slo::glob;

/// Put in a request's extensions by the measurement layer: this request may get usage
/// injected, if its body says it streams without usage and names a configured model.
#[derive(Debug, Clone)]
pub struct InjectPlan {
    pub models: Arc<[String]>,
    /// Bodies longer than this are forwarded untouched (the request inspection limit).
    pub limit: usize,
}

/// Put in a response's extensions by the forwarder: how usage was asked for upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageRequest {
    /// The proxy added `include_usage`: the usage-only chunk must be removed.
    Injected,
    /// The client asked for usage itself: it gets it untouched.
    ClientAsked,
}

/// What the body reader decided for one request body.
#[derive(Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// The new body, with `include_usage: true`.
    Inject(Vec<u8>),
    /// A streaming request that already asks for usage.
    ClientAsked,
    /// Not a candidate (not streaming, another model, not JSON, ...): forward as is.
    Untouched,
}

/// Decides from a complete request body; `models` are globs the `model` must match (an
/// absent model matches only `*`).
pub fn rewrite(body: &[u8], models: &[String]) -> Rewrite {
    let trimmed_end = body.trim_ascii_end().len();
    if !body.trim_ascii_start().starts_with(b"{")
        || body.get(trimmed_end.wrapping_sub(1)) != Some(&b'}')
    {
        return Rewrite::Untouched;
    }
    // Duplicate keys fail this parse, so a body whose meaning depends on the parser is
    // never edited.
    let Ok(wire) = serde_json::from_slice::<RequestWire<'_>>(body) else {
        return Rewrite::Untouched;
    };
    if wire.stream.0.map(RawValue::get) != Some("true") {
        return Rewrite::Untouched;
    }
    let model = match wire.model.0 {
        None => String::new(),
        Some(raw) => match serde_json::from_str::<String>(raw.get()) {
            Ok(model) => model,
            Err(_) => return Rewrite::Untouched,
        },
    };
    if !models.iter().any(|m| glob(m, &model)) {
        return Rewrite::Untouched;
    }
    let Some(options) = wire.stream_options.0 else {
        // No `stream_options`: add it as the last key of the object.
        let at = trimmed_end - 1;
        return Rewrite::Inject(splice(
            body,
            at,
            at,
            br#","stream_options":{"include_usage":true}"#,
        ));
    };
    let Some(span) = span_of(body, options) else {
        return Rewrite::Untouched;
    };
    match options.get().as_bytes().first() {
        Some(b'n') => Rewrite::Inject(splice(body, span.0, span.1, br#"{"include_usage":true}"#)),
        Some(b'{') => {
            let Ok(inner) = serde_json::from_str::<OptionsWire<'_>>(options.get()) else {
                return Rewrite::Untouched;
            };
            match inner.include_usage.0 {
                Some(raw) if raw.get() == "true" => Rewrite::ClientAsked,
                Some(raw) if matches!(raw.get(), "false" | "null") => match span_of(body, raw) {
                    Some((from, to)) => Rewrite::Inject(splice(body, from, to, b"true")),
                    None => Rewrite::Untouched,
                },
                Some(_) => Rewrite::Untouched,
                None => {
                    // Insert before the object's closing brace, with a comma unless empty.
                    let close = span.1 - 1;
                    let inside = options.get().get(1..options.get().len().saturating_sub(1));
                    let empty = inside.is_none_or(|s| s.trim().is_empty());
                    let key: &[u8] = if empty {
                        br#""include_usage":true"#
                    } else {
                        br#","include_usage":true"#
                    };
                    Rewrite::Inject(splice(body, close, close, key))
                }
            }
        }
        _ => Rewrite::Untouched,
    }
}

#[derive(Deserialize)]
struct RequestWire<'a> {
    #[serde(borrow, default)]
    model: Present<'a>,
    #[serde(borrow, default)]
    stream: Present<'a>,
    #[serde(borrow, default)]
    stream_options: Present<'a>,
}

#[derive(Deserialize)]
struct OptionsWire<'a> {
    #[serde(borrow, default)]
    include_usage: Present<'a>,
}

/// A field's raw JSON when the key is present, `null` included (an `Option` would read
/// `null` as absent, and `null` must be replaced, not added to).
#[derive(Default)]
struct Present<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Present<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|raw| Present(Some(raw)))
    }
}

/// Where a borrowed raw value sits in `body`, as a byte range.
fn span_of(body: &[u8], raw: &RawValue) -> Option<(usize, usize)> {
    let text = raw.get().as_bytes();
    let from = text.as_ptr().addr().checked_sub(body.as_ptr().addr())?;
    let to = from.checked_add(text.len())?;
    (body.get(from..to) == Some(text)).then_some((from, to))
}

/// `body` with `from..to` replaced by `with`.
fn splice(body: &[u8], from: usize, to: usize, with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + with.len());
    out.extend_from_slice(body.get(..from).unwrap_or_default());
    out.extend_from_slice(with);
    out.extend_from_slice(body.get(to..).unwrap_or_default());
    out
}

pin_project! {
    /// The request body as sent upstream: the client's, streamed through; or read ahead
    /// and replayed unchanged, then the rest; or rewritten.
    #[project = Proj]
    pub enum ForwardBody<B: Body> {
        Stream {
            #[pin]
            body: B,
        },
        Replay {
            head: VecDeque<Frame<Bytes>>,
            error: Option<B::Error>,
            #[pin]
            rest: B,
            ended: bool,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B: Body> ForwardBody<B> {
    pub fn stream(body: B) -> ForwardBody<B> {
        ForwardBody::Stream { body }
    }
}

impl<B: Body<Data = Bytes>> Body for ForwardBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            Proj::Stream { body } => body.poll_frame(cx),
            Proj::Replay {
                head,
                error,
                rest,
                ended,
            } => {
                if let Some(frame) = head.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(e) = error.take() {
                    *ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                if *ended {
                    return Poll::Ready(None);
                }
                rest.poll_frame(cx)
            }
            Proj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ForwardBody::Stream { body } => body.is_end_stream(),
            ForwardBody::Replay {
                head,
                error,
                rest,
                ended,
            } => head.is_empty() && error.is_none() && (*ended || rest.is_end_stream()),
            ForwardBody::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ForwardBody::Stream { body } => body.size_hint(),
            ForwardBody::Replay {
                head,
                error,
                rest,
                ended,
            } => {
                let held: u64 = head
                    .iter()
                    .filter_map(Frame::data_ref)
                    .map(|d| d.len() as u64)
                    .sum();
                if *ended && error.is_none() {
                    return SizeHint::with_exact(held);
                }
                let tail = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(held + tail.lower());
                if let Some(upper) = tail.upper() {
                    hint.set_upper(held + upper);
                }
                hint
            }
            ForwardBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// Reads the body ahead (up to `plan.limit`) and decides; returns the body to send and,
/// when usage was asked for, the marker for the response. Fixes `Content-Length` when the
/// body was rewritten.
pub async fn prepare<B>(
    plan: &InjectPlan,
    headers: &mut HeaderMap,
    mut body: B,
) -> (ForwardBody<B>, Option<UsageRequest>)
where
    B: Body<Data = Bytes> + Unpin,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > plan.limit as u64) {
        return (ForwardBody::Stream { body }, None);
    }
    let mut head = VecDeque::new();
    let mut size = 0usize;
    let replay = |head, error, rest, ended| ForwardBody::Replay {
        head,
        error,
        rest,
        ended,
    };
    while !body.is_end_stream() {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return (replay(head, Some(e), body, true), None),
            Some(Ok(frame)) => {
                let Some(data) = frame.data_ref() else {
                    // Trailers: rare on requests, and the end of the body; pass as is.
                    head.push_back(frame);
                    return (replay(head, None, body, true), None);
                };
                size += data.len();
                head.push_back(frame);
                if size > plan.limit {
                    return (replay(head, None, body, false), None);
                }
            }
        }
    }
    let mut whole = Vec::with_capacity(size);
    for frame in &head {
        if let Some(data) = frame.data_ref() {
            whole.extend_from_slice(data);
        }
    }
    match rewrite(&whole, &plan.models) {
        Rewrite::Inject(new) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(new.len()));
            let data = Some(Bytes::from(new));
            (ForwardBody::Full { data }, Some(UsageRequest::Injected))
        }
        Rewrite::ClientAsked => (
            replay(head, None, body, true),
            Some(UsageRequest::ClientAsked),
        ),
        Rewrite::Untouched => (replay(head, None, body, true), None),
    }
}

#[cfg(test)]
mod tests;
