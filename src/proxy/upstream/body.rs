//! The response body as the proxy forwards it: the upstream's body, unchanged, with an
//! idle timeout between chunks (which never cuts a healthy stream, however long), or a
//! small body the proxy wrote itself.
//!
//! The idle timeout reads no clock per chunk: a chunk only sets a flag, and a timer
//! looks at it every eighth of the timeout. A stream is cut once a whole timeout has
//! passed since the check that last saw a chunk, so after a silence of at least the
//! timeout and at most an eighth more.

use std::{
    future::poll_fn,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::{inline::Lease, relay::RelayBody};
use crate::{BoxError, measure::IdleTimeout};

/// The upstream's response body: read by hyper's client, or by the relay.
#[expect(
    clippy::large_enum_variant,
    reason = "the relay's body is the usual one; boxing it would cost an allocation per \
              request to save a few hundred bytes per stream on hyper's path"
)]
pub enum Source {
    Hyper(Incoming),
    Relay(RelayBody),
}

impl Body for Source {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Source::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Source::Relay(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Source::Hyper(b) => b.is_end_stream(),
            Source::Relay(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Source::Hyper(b) => b.size_hint(),
            Source::Relay(b) => b.size_hint(),
        }
    }
}

pin_project! {
    #[project = Proj]
    pub enum UpstreamBody {
        Stream {
            #[pin]
            body: Source,
            #[pin]
            idle: Sleep,
            timeout: Duration,
            // A chunk arrived since the timer last looked.
            active: bool,
            // When the timer last saw a chunk (or the stream started).
            seen: Instant,
            // The upstream connection, when it is driven by this body (super::inline).
            lease: Option<Lease>,
            // A frame read before the response head was handed on (see `UpstreamBody::open`).
            first: Option<Frame<Bytes>>,
            // Trailers were handed on: they are the last frame, whether or not the body
            // says it has ended (hyper's chunked body says so only when polled again, and
            // hyper's server does not poll again).
            trailed: bool,
        },
        Full { data: Option<Bytes> },
    }
}

/// The upstream's body failed before any of it could be handed on.
#[derive(Debug, thiserror::Error)]
#[error("upstream body failed at its start: {0}")]
pub struct BrokenStart(#[source] pub BoxError);

impl UpstreamBody {
    /// The upstream's body, looked at once before its response head goes to the client: a
    /// body that is already known to be broken (a malformed first chunk) is an error the
    /// proxy can still answer with a 502, instead of a 200 cut short.
    pub async fn open(
        mut body: Source,
        timeout: Duration,
        mut lease: Option<Lease>,
    ) -> Result<UpstreamBody, BrokenStart> {
        let polled =
            poll_fn(|cx| Poll::Ready(drive_then_poll(Pin::new(&mut body), &mut lease, cx))).await;
        let first = match polled {
            Poll::Ready(Some(Err(e))) => return Err(BrokenStart(e)),
            Poll::Ready(Some(Ok(frame))) => Some(frame),
            Poll::Ready(None) => {
                release(&mut lease);
                return Ok(UpstreamBody::empty());
            }
            Poll::Pending => None,
        };
        let now = Instant::now();
        Ok(UpstreamBody::Stream {
            body,
            idle: tokio::time::sleep_until(now + check_every(timeout)),
            timeout,
            active: false,
            seen: now,
            lease,
            first,
            trailed: false,
        })
    }

    pub fn full(data: Bytes) -> UpstreamBody {
        UpstreamBody::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }

    pub fn empty() -> UpstreamBody {
        UpstreamBody::Full { data: None }
    }
}

/// Polls the body after letting its upstream connection, if this body drives it, read.
fn drive_then_poll(
    mut body: Pin<&mut Source>,
    lease: &mut Option<Lease>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    match lease {
        Some(lease) => lease.poll_with(cx, |cx| body.as_mut().poll_frame(cx)),
        None => body.poll_frame(cx),
    }
}

fn release(lease: &mut Option<Lease>) {
    if let Some(lease) = lease.take() {
        lease.release();
    }
}

/// How often the idle timer looks at a stream.
fn check_every(timeout: Duration) -> Duration {
    timeout / 8
}

/// Whether the stream has been idle for `timeout`; otherwise the timer is set for the
/// next check. Called when the timer fires.
fn idle_for_too_long(
    mut idle: Pin<&mut Sleep>,
    timeout: Duration,
    active: &mut bool,
    seen: &mut Instant,
) -> bool {
    let now = Instant::now();
    if std::mem::take(active) {
        *seen = now;
    }
    if now.saturating_duration_since(*seen) >= timeout {
        return true;
    }
    let next = (now + check_every(timeout)).min(*seen + timeout);
    idle.as_mut().reset(next);
    false
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            Proj::Stream {
                mut body,
                mut idle,
                timeout,
                active,
                seen,
                lease,
                first,
                trailed,
            } => match first.take().map_or_else(
                || {
                    if *trailed {
                        return Poll::Ready(None);
                    }
                    drive_then_poll(body.as_mut(), lease, cx)
                },
                |f| Poll::Ready(Some(Ok(f))),
            ) {
                Poll::Ready(Some(Ok(frame))) => {
                    *active = true;
                    *trailed = frame.is_trailers();
                    if *trailed || body.is_end_stream() {
                        // hyper's server stops polling a body that says it has ended.
                        release(lease);
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    release(lease);
                    Poll::Ready(None)
                }
                Poll::Pending => loop {
                    match idle.as_mut().poll(cx) {
                        Poll::Pending => break Poll::Pending,
                        Poll::Ready(()) => {
                            if idle_for_too_long(idle.as_mut(), *timeout, active, seen) {
                                break Poll::Ready(Some(Err(Box::new(IdleTimeout(*timeout)))));
                            }
                        }
                    }
                },
            },
            Proj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Stream {
                body,
                first,
                trailed,
                ..
            } => first.is_none() && (*trailed || body.is_end_stream()),
            UpstreamBody::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Stream { body, first, .. } => {
                let held = first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| d.len() as u64);
                let rest = body.size_hint();
                match rest.exact() {
                    Some(n) => SizeHint::with_exact(n + held),
                    None => SizeHint::new(),
                }
            }
            UpstreamBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds chunks at `chunks` (offsets from the start) to the idle check as the body
    /// does, and says how long after the last chunk the stream was cut.
    async fn silence_before_the_cut(timeout: Duration, chunks: &[Duration]) -> Duration {
        let start = Instant::now();
        let mut idle = Box::pin(tokio::time::sleep_until(start + check_every(timeout)));
        let (mut active, mut seen) = (false, start);
        let mut pending = chunks.iter().map(|&at| start + at).peekable();
        loop {
            match pending.peek().copied() {
                Some(at) if at <= idle.deadline() => {
                    tokio::time::sleep_until(at).await;
                    active = true;
                    pending.next();
                }
                _ => {
                    idle.as_mut().await;
                    if idle_for_too_long(idle.as_mut(), timeout, &mut active, &mut seen) {
                        let last = chunks.last().map_or(start, |&at| start + at);
                        return Instant::now() - last;
                    }
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_cut_comes_after_the_timeout_and_at_most_an_eighth_later() {
        let timeout = Duration::from_secs(8);
        let ms = Duration::from_millis;
        let cases: [&[Duration]; 5] = [
            &[],
            &[ms(1)],
            &[ms(999), ms(1001)],
            &[ms(500), ms(4500), ms(8400), ms(12_000), ms(16_999)],
            &[ms(7999)],
        ];
        for chunks in cases {
            let silence = silence_before_the_cut(timeout, chunks).await;
            assert!(
                silence >= timeout && silence <= timeout + timeout / 8,
                "{chunks:?}: cut after {silence:?} of silence"
            );
        }
    }
}
