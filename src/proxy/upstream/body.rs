//! The response body as the proxy forwards it: the upstream's body, unchanged, with an
//! idle timeout between chunks (which never cuts a healthy stream, however long), or a
//! small body the proxy wrote itself.
//!
//! The idle timeout reads no clock per chunk: a chunk only sets a flag, and a timer
//! looks at it every eighth of the timeout. A stream is cut once a whole timeout has
//! passed since the check that last saw a chunk, so after a silence of at least the
//! timeout and at most an eighth more.
//!
//! `upstream.min_body_rate` (off by default) rides on the same timer: a chunk adds its
//! length to a sum, and when a window has passed the sum is compared with the rate times
//! the window; a body that trickled less is cut ([`SlowBody`]) and counted.

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

use prometheus_client::metrics::counter::Counter;

use super::{inline::Lease, relay::RelayBody};
use crate::{
    BoxError,
    measure::{IdleTimeout, SlowBody},
};

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
            // `upstream.min_body_rate`, when set.
            rate: Option<Box<Rate>>,
            // Trailers were handed on: they are the last frame, whether or not the body
            // says it has ended (hyper's chunked body says so only when polled again, and
            // hyper's server does not poll again).
            trailed: bool,
        },
        Full { data: Option<Bytes> },
    }
}

/// `upstream.min_body_rate` on one body: the bytes of the window under way.
pub struct Rate {
    min: u64,
    window: Duration,
    since: Instant,
    bytes: u64,
    /// `goodput_limit_rejections_total{limit="upstream.min_body_rate"}`.
    cut: Counter,
}

impl Rate {
    /// `min` bytes per second over each `window` from now on; `cut` counts a body cut.
    pub fn new(min: u64, window: Duration, cut: Counter) -> Rate {
        Rate {
            min,
            window,
            since: Instant::now(),
            bytes: 0,
            cut,
        }
    }

    /// At a timer check: the error when a whole window passed with too few bytes, else
    /// the window starts again (when one has passed) and `None`.
    fn check(&mut self, now: Instant) -> Option<SlowBody> {
        if now.saturating_duration_since(self.since) < self.window {
            return None;
        }
        let wanted = (self.min as f64 * self.window.as_secs_f64()) as u64;
        if self.bytes < wanted {
            self.cut.inc();
            return Some(SlowBody {
                rate: self.min,
                window: self.window,
                got: self.bytes,
            });
        }
        self.since = now;
        self.bytes = 0;
        None
    }

    fn window_end(&self) -> Instant {
        self.since + self.window
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
        rate: Option<Rate>,
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
        let mut rate = rate.map(Box::new);
        if let (Some(rate), Some(data)) = (rate.as_mut(), first.as_ref().and_then(Frame::data_ref))
        {
            rate.bytes += data.len() as u64;
        }
        let first_check = rate.as_ref().map_or(now + check_every(timeout), |r| {
            (now + check_every(timeout)).min(r.window_end())
        });
        Ok(UpstreamBody::Stream {
            body,
            idle: tokio::time::sleep_until(first_check),
            timeout,
            active: false,
            seen: now,
            lease,
            first,
            rate,
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
#[cfg(test)]
fn idle_for_too_long(
    idle: Pin<&mut Sleep>,
    timeout: Duration,
    active: &mut bool,
    seen: &mut Instant,
) -> bool {
    matches!(check(idle, timeout, active, seen, None), Some(Cut::Idle))
}

/// Why a stream is cut at a timer check.
enum Cut {
    Idle,
    Slow(SlowBody),
}

/// The timer fired: the idle timeout, then the rate; otherwise the timer is set for the
/// next check (an eighth of the timeout, or the window's end if sooner).
fn check(
    mut idle: Pin<&mut Sleep>,
    timeout: Duration,
    active: &mut bool,
    seen: &mut Instant,
    rate: Option<&mut Rate>,
) -> Option<Cut> {
    let now = Instant::now();
    if std::mem::take(active) {
        *seen = now;
    }
    if now.saturating_duration_since(*seen) >= timeout {
        return Some(Cut::Idle);
    }
    let mut next = (now + check_every(timeout)).min(*seen + timeout);
    if let Some(rate) = rate {
        if let Some(slow) = rate.check(now) {
            return Some(Cut::Slow(slow));
        }
        next = next.min(rate.window_end());
    }
    idle.as_mut().reset(next);
    None
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
                rate,
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
                    if let (Some(rate), Some(data)) = (rate.as_mut(), frame.data_ref()) {
                        rate.bytes += data.len() as u64;
                    }
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
                            match check(idle.as_mut(), *timeout, active, seen, rate.as_deref_mut())
                            {
                                None => {}
                                Some(Cut::Idle) => {
                                    break Poll::Ready(Some(Err(Box::new(IdleTimeout(*timeout)))));
                                }
                                Some(Cut::Slow(slow)) => {
                                    break Poll::Ready(Some(Err(Box::new(slow))));
                                }
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

    /// Feeds `per_second` bytes each second to the checks as the body does, for at most
    /// `horizon`; when the rate cut the stream, after how long.
    async fn slow_cut_after(per_second: u64, horizon: Duration) -> Option<Duration> {
        let timeout = Duration::from_secs(300);
        let start = Instant::now();
        let mut rate = Rate::new(100, Duration::from_secs(10), Counter::default());
        let mut idle = Box::pin(tokio::time::sleep_until(
            (start + check_every(timeout)).min(rate.window_end()),
        ));
        let (mut active, mut seen) = (false, start);
        let mut next_byte = start + Duration::from_secs(1);
        while Instant::now() - start < horizon {
            if next_byte <= idle.deadline() {
                tokio::time::sleep_until(next_byte).await;
                rate.bytes += per_second;
                active = true;
                next_byte += Duration::from_secs(1);
                continue;
            }
            idle.as_mut().await;
            if let Some(cut) = check(
                idle.as_mut(),
                timeout,
                &mut active,
                &mut seen,
                Some(&mut rate),
            ) {
                assert!(
                    matches!(cut, Cut::Slow(_)),
                    "the idle timeout cut a busy stream"
                );
                return Some(Instant::now() - start);
            }
        }
        None
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_under_the_rate_is_cut_at_the_window_and_a_stream_over_it_never() {
        // One byte a second against 100 bytes/s over 10 s: cut at the first window's end.
        assert_eq!(
            slow_cut_after(1, Duration::from_secs(120)).await,
            Some(Duration::from_secs(10))
        );
        // 99 bytes/s: still under.
        assert_eq!(
            slow_cut_after(99, Duration::from_secs(120)).await,
            Some(Duration::from_secs(10))
        );
        // At the rate and over it: never, however long.
        assert_eq!(slow_cut_after(100, Duration::from_secs(600)).await, None);
        assert_eq!(slow_cut_after(5000, Duration::from_secs(600)).await, None);
        let mut rate = Rate::new(100, Duration::from_secs(10), Counter::default());
        let counted = rate.cut.clone();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(rate.check(Instant::now()).is_some());
        assert_eq!(counted.get(), 1);
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
