//! Body wrappers of the measurement path. Both pass every frame through unchanged,
//! forward `is_end_stream` and `size_hint`, and add a timestamp (one `Instant::now()`, or the
//! time of the upstream read that brought the frame) plus a few integer updates per frame:
//! no copies of body bytes (a captured chunk is a refcounted `Bytes`).
//! With usage injection, the response body also passes, after the tap has seen each frame,
//! through the [`UsageFilter`] that removes the usage-only chunk the client did not ask for.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Instant,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::tap::{IdleTimeout, SlowBody};
use super::{
    clock::{Clock, ReadClock},
    delivery::{Delivery, Mark},
    tap::{Delivered, Ending, Tap},
};
use crate::{BoxError, usage_injection::UsageFilter};

pin_project! {
    /// The upstream response body as the client receives it, timestamped frame by frame.
    ///
    /// It also follows what reached the client ([`Delivery`]): an upstream failure is held
    /// back until the connection has flushed every byte handed over before it (hyper would
    /// otherwise drop what it still buffers), and the record counts the bytes a flush
    /// carried and whether the dialect's terminal event was among them.
    pub struct MeasuredBody<B>
    where
        B: Body,
    {
        #[pin]
        inner: B,
        tap: Tap,
        strip: Option<Strip>,
        // The upstream connection's read times, when it keeps them: a frame is stamped
        // with its read's time instead of reading the clock.
        reads: Option<Arc<ReadClock>>,
        sent: Sent,
    }

    impl<B> PinnedDrop for MeasuredBody<B>
    where
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.tap.is_finished() {
                return;
            }
            // A body hyper stopped polling because it knew it was complete (empty bodies,
            // Content-Length reached) ended normally; one that failed upstream ends as
            // that failure; anything else is an abort (the client went away, or the drain
            // deadline cut it).
            let now = Instant::now();
            let (at, ending) = if this.inner.is_end_stream() {
                this.sent.all_delivered();
                (now, Ending::Complete)
            } else if let Some(failed) = this.sent.failed.take() {
                this.sent.settle();
                (failed.at, failed.ending)
            } else {
                this.sent.settle();
                (now, this.tap.dropped_ending())
            };
            this.tap.delivered(this.sent.delivered());
            this.tap.finish(at, ending);
        }
    }
}

/// What the body has handed to the server and what of it is known to have left.
#[derive(Debug)]
struct Sent {
    /// The client connection's flushes; `None` outside a server (all handed counts as sent).
    delivery: Option<Arc<Delivery>>,
    /// The response goes out on HTTP/2 (see [`Delivery`] for why it matters).
    http2: bool,
    /// Body bytes handed to the server.
    handed: u64,
    /// Something (the head, at first) was handed over since the last mark.
    unmarked: bool,
    /// Token events in what was handed over.
    handed_events: u64,
    /// The latest mark, and the bytes and token events handed over before it.
    mark: Option<(Mark, u64, u64)>,
    /// Bytes and token events a flush has carried.
    delivered: u64,
    delivered_events: u64,
    /// Bytes handed over up to and including the dialect's terminal event.
    terminal_at: Option<u64>,
    /// An upstream failure waiting for the flush of what came before it.
    failed: Option<Failed>,
}

#[derive(Debug)]
struct Failed {
    error: BoxError,
    ending: Ending,
    at: Instant,
}

impl Sent {
    fn new() -> Sent {
        Sent {
            delivery: None,
            http2: false,
            handed: 0,
            unmarked: true,
            handed_events: 0,
            mark: None,
            delivered: 0,
            delivered_events: 0,
            terminal_at: None,
            failed: None,
        }
    }

    /// Called as the body is polled: what was handed over before is now queued by the
    /// server, so a mark taken now is passed by the flush that carries it.
    fn poll_begins(&mut self) {
        self.settle();
        if std::mem::take(&mut self.unmarked)
            && let Some(delivery) = &self.delivery
        {
            self.mark = Some((delivery.mark(self.http2), self.handed, self.handed_events));
        }
    }

    /// Counts as delivered what the latest mark covers, if a flush has passed it.
    fn settle(&mut self) {
        match (&self.delivery, self.mark) {
            (None, _) => self.all_delivered(),
            (Some(delivery), Some((mark, bytes, events))) if delivery.flushed_since(mark) => {
                self.delivered = self.delivered.max(bytes);
                self.delivered_events = self.delivered_events.max(events);
            }
            _ => {}
        }
    }

    /// A frame of `bytes` went to the server; `events` token events have been read so far.
    fn handed(&mut self, bytes: usize, events: u64, terminal: bool) {
        self.handed += bytes as u64;
        self.handed_events = events;
        self.unmarked = true;
        if terminal && self.terminal_at.is_none() {
            self.terminal_at = Some(self.handed);
        }
    }

    /// Ready once everything handed over (the response head included) has been flushed
    /// to the client.
    fn poll_all_flushed(&mut self, cx: &Context<'_>) -> Poll<()> {
        if let (Some(delivery), Some((mark, ..))) = (&self.delivery, self.mark) {
            let flushed = delivery.poll_flushed_since(cx, mark);
            // HTTP/2: each time, so that a flush that missed this arming is followed by
            // another (see [`Delivery`]); it ends once a poll begun after the mark has
            // flushed, or waits for the socket. HTTP/1 flushes in this very task.
            if flushed.is_pending() && self.http2 {
                delivery.nudge();
            }
            ready!(flushed);
        }
        self.all_delivered();
        Poll::Ready(())
    }

    fn all_delivered(&mut self) {
        self.delivered = self.handed;
        self.delivered_events = self.handed_events;
    }

    fn delivered(&self) -> Delivered {
        Delivered {
            bytes: self.delivered,
            events: self.delivered_events,
            terminal: self.terminal_at.is_some_and(|t| self.delivered >= t),
        }
    }
}

impl<B: Body> MeasuredBody<B> {
    pub fn new(inner: B, tap: Tap) -> MeasuredBody<B> {
        MeasuredBody {
            inner,
            tap,
            strip: None,
            reads: None,
            sent: Sent::new(),
        }
    }

    /// Frames are stamped with the time of the upstream read that brought them.
    pub fn with_reads(mut self, reads: Option<Arc<ReadClock>>) -> MeasuredBody<B> {
        self.reads = reads;
        self
    }

    /// What the body hands over is delivered as the client connection (`http2` or not)
    /// flushes it.
    pub fn with_delivery(
        mut self,
        delivery: Option<Arc<Delivery>>,
        http2: bool,
    ) -> MeasuredBody<B> {
        self.sent.delivery = delivery;
        self.sent.http2 = http2;
        self
    }

    /// As [`MeasuredBody::new`], removing the usage-only chunk from what the client gets
    /// (the tap still sees it).
    pub fn stripping(inner: B, tap: Tap, filter: UsageFilter) -> MeasuredBody<B> {
        let strip = Some(Strip {
            filter,
            after: None,
        });
        MeasuredBody {
            inner,
            tap,
            strip,
            reads: None,
            sent: Sent::new(),
        }
    }
}

type Polled = Option<Result<Frame<Bytes>, BoxError>>;

/// The usage filter and what must follow the bytes it still held when the body ended.
struct Strip {
    filter: UsageFilter,
    after: Option<Polled>,
}

impl Strip {
    /// What to hand on for what the inner body gave; `None` when nothing is due yet.
    fn pass(&mut self, polled: Polled, ended: bool) -> Option<Polled> {
        let frame = match polled {
            Some(Ok(frame)) => frame,
            other => return Some(self.flush_then(other)),
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(trailers) => return Some(self.flush_then(Some(Ok(trailers)))),
        };
        let mut out = self.filter.push(data);
        if ended && self.filter.holds() {
            let mut joined = out.to_vec();
            joined.extend_from_slice(&self.filter.finish());
            out = Bytes::from(joined);
        }
        match (out.is_empty(), ended) {
            (false, _) => Some(Some(Ok(Frame::data(out)))),
            (true, true) => Some(None),
            (true, false) => None,
        }
    }

    /// Hands on the bytes still held (unchanged), then `next`.
    fn flush_then(&mut self, next: Polled) -> Polled {
        let held = self.filter.finish();
        if held.is_empty() {
            return next;
        }
        self.after = Some(next);
        Some(Ok(Frame::data(held)))
    }
}

impl<B> MeasuredBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// The next frame for the client, measured: the tap sees every upstream frame with
    /// its read time; `ended` is set to when the upstream body reached its end.
    fn poll_measured(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        ended: &mut Option<Instant>,
    ) -> Poll<Polled> {
        let mut this = self.project();
        loop {
            if let Some(after) = this.strip.as_mut().and_then(|s| s.after.take()) {
                return Poll::Ready(after);
            }
            let polled = ready!(this.inner.as_mut().poll_frame(cx));
            // Data and the end arrive with a read; an error (a timeout) happens now.
            let read_at = match &polled {
                Some(Err(_)) => None,
                _ => this.reads.as_ref().and_then(|r| r.latest_read()),
            };
            let now = match read_at {
                Some((at, Clock::Kernel)) => at,
                Some((at, Clock::User)) => {
                    this.tap.user_clock();
                    at
                }
                None => {
                    this.tap.user_clock();
                    Instant::now()
                }
            };
            let polled = match polled {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        this.tap.on_data(now, data);
                    }
                    if this.inner.is_end_stream() {
                        *ended = Some(now);
                    }
                    Some(Ok(frame))
                }
                Some(Err(e)) => Some(Err(e.into())),
                None => {
                    *ended = Some(now);
                    None
                }
            };
            let Some(strip) = this.strip.as_mut() else {
                return Poll::Ready(polled);
            };
            // A frame wholly held back (or removed) gives nothing yet: read on.
            if let Some(out) = strip.pass(polled, this.inner.is_end_stream()) {
                return Poll::Ready(out);
            }
        }
    }
}

impl<B> Body for MeasuredBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.as_mut().project().sent.poll_begins();
        if self.sent.failed.is_none() {
            let mut ended = None;
            let polled = ready!(self.as_mut().poll_measured(cx, &mut ended));
            let this = self.as_mut().project();
            match polled {
                Some(Ok(frame)) => {
                    let len = frame.data_ref().map_or(0, Bytes::len);
                    this.sent
                        .handed(len, this.tap.events(), this.tap.terminal_seen());
                    if let Some(at) = ended {
                        // hyper stops polling a body that says it has ended.
                        this.sent.all_delivered();
                        this.tap.delivered(this.sent.delivered());
                        this.tap.finish(at, Ending::Complete);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                None => {
                    this.sent.all_delivered();
                    this.tap.delivered(this.sent.delivered());
                    this.tap
                        .finish(ended.unwrap_or_else(Instant::now), Ending::Complete);
                    return Poll::Ready(None);
                }
                Some(Err(error)) => {
                    let ending = if error.is::<IdleTimeout>() || error.is::<SlowBody>() {
                        Ending::IdleTimeout
                    } else {
                        Ending::UpstreamFailed
                    };
                    this.sent.failed = Some(Failed {
                        error,
                        ending,
                        at: Instant::now(),
                    });
                }
            }
        }
        // Failed upstream: the client gets everything handed over before the abort.
        let this = self.project();
        ready!(this.sent.poll_all_flushed(cx));
        let Some(failed) = this.sent.failed.take() else {
            // Polled again after the error was handed on: there is nothing more.
            return Poll::Ready(None);
        };
        this.tap.delivered(this.sent.delivered());
        this.tap.finish(failed.at, failed.ending);
        Poll::Ready(Some(Err(failed.error)))
    }

    fn is_end_stream(&self) -> bool {
        self.sent.failed.is_none()
            && self.inner.is_end_stream()
            && self
                .strip
                .as_ref()
                .is_none_or(|s| s.after.is_none() && !s.filter.holds())
    }

    fn size_hint(&self) -> SizeHint {
        match self.strip {
            // Bytes are removed: the upstream's length no longer holds.
            Some(_) => SizeHint::new(),
            None => self.inner.size_hint(),
        }
    }
}

mod request;

pub use request::{RequestCapture, RequestTap};

#[cfg(test)]
mod tests;
