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
use tokio::sync::oneshot;

use super::tap::IdleTimeout;
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
                    let ending = if error.is::<IdleTimeout>() {
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

/// What the request body tap saw, delivered to the aggregator.
#[derive(Debug, Default)]
pub struct RequestCapture {
    /// The body's chunks, when the whole body fit in the inspection limit.
    pub chunks: Vec<Bytes>,
    pub complete: bool,
    pub overflow: bool,
    pub bytes: u64,
    /// The body failed on the client's side: broken framing, a length that does not
    /// match, the client gone mid-upload.
    pub failed: bool,
    /// When the body was complete: the arrival of the client read that ended it (or, on
    /// HTTP/2, the connection's latest read when its end was seen), for `upload_ms`.
    pub completed_at: Option<Instant>,
}

pin_project! {
    /// The client's request body on its way upstream. Chunks are streamed on as they come;
    /// handles to them are kept (up to the inspection limit) so the aggregator can read the
    /// model, stream flag and max_tokens without the request ever being buffered.
    pub struct RequestTap<B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        inner: B,
        capture: RequestCapture,
        captured: usize,
        limit: usize,
        tx: Option<oneshot::Sender<RequestCapture>>,
        // The client connection's reads, to time the body's end by.
        reads: Option<Arc<ReadClock>>,
    }

    impl<B> PinnedDrop for RequestTap<B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.inner.is_end_stream() {
                if !this.capture.complete {
                    this.capture.completed_at = Some(read_time(this.reads.as_deref()));
                }
                this.capture.complete = true;
            } else if this.tx.is_some() {
                // Dropped unread: h2 may have reset the stream for the client's protocol
                // error (a body longer or shorter than its content-length) before anyone
                // read the body. One look, without waiting, says so.
                let mut cx = Context::from_waker(std::task::Waker::noop());
                if let Poll::Ready(Some(Err(e))) = this.inner.as_mut().poll_frame(&mut cx) {
                    this.capture.failed = broken_by_client(&*e.into());
                }
            }
            send(this.tx, this.capture);
        }
    }
}

/// A captured body up to this size is copied into one buffer of its own when it is
/// handed over (see [`RequestCapture::compact`]).
const COMPACT_UP_TO: u64 = 16 << 10;

impl RequestCapture {
    /// The chunks of a small body are handles into hyper's 8 KiB connection read buffer,
    /// and would keep it alive, next to the one hyper reads with meanwhile, for as long as
    /// the response streams: one copy of a few KiB instead of 8 KiB per open stream. A
    /// larger body fills the buffers it holds, so it is kept as it is.
    fn compact(&mut self) {
        if self.chunks.is_empty() || self.bytes > COMPACT_UP_TO {
            return;
        }
        let mut body = Vec::with_capacity(usize::try_from(self.bytes).unwrap_or(0));
        for chunk in &self.chunks {
            body.extend_from_slice(chunk);
        }
        self.chunks = vec![Bytes::from(body)];
    }
}

/// The body has ended (the first time it is seen to, it is timed).
fn complete(capture: &mut RequestCapture, reads: Option<&ReadClock>) {
    if capture.completed_at.is_none() {
        capture.completed_at = Some(read_time(reads));
    }
    capture.complete = true;
}

/// When the bytes just read arrived: the connection's latest read, or now.
fn read_time(reads: Option<&ReadClock>) -> Instant {
    let now = Instant::now();
    reads
        .and_then(ReadClock::latest)
        .filter(|at| *at <= now)
        .unwrap_or(now)
}

fn send(tx: &mut Option<oneshot::Sender<RequestCapture>>, capture: &mut RequestCapture) {
    if let Some(tx) = tx.take() {
        capture.compact();
        // The receiver may be gone (measurement already emitted); nothing to do then.
        let _ = tx.send(std::mem::take(capture));
    }
}

/// Whether a request body's error is the client breaking the protocol on its stream, as
/// HTTP/2 finds it (a stream reset by the server's own h2 for a protocol error).
fn broken_by_client(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_reset()
                && h2.is_library()
                && h2.reason() == Some(h2::Reason::PROTOCOL_ERROR);
        }
        cur = err.source();
    }
    false
}

impl<B> RequestTap<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// `reads`: the client connection's read clock, to time the end of the body by.
    pub fn new(
        inner: B,
        limit: usize,
        reads: Option<Arc<ReadClock>>,
    ) -> (RequestTap<B>, oneshot::Receiver<RequestCapture>) {
        let (tx, rx) = oneshot::channel();
        let mut capture = RequestCapture::default();
        if inner.is_end_stream() {
            // No body: complete with the head.
            capture.completed_at = Some(read_time(reads.as_deref()));
        }
        let tap = RequestTap {
            inner,
            capture,
            captured: 0,
            limit,
            tx: Some(tx),
            reads,
        };
        (tap, rx)
    }
}

impl<B> Body for RequestTap<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let polled = ready!(this.inner.as_mut().poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let c = &mut *this.capture;
                    c.bytes += data.len() as u64;
                    *this.captured += data.len();
                    if !c.overflow {
                        if *this.captured <= *this.limit {
                            c.chunks.push(data.clone());
                        } else {
                            c.overflow = true;
                            c.chunks = Vec::new();
                        }
                    }
                }
                if this.inner.is_end_stream() {
                    complete(this.capture, this.reads.as_deref());
                    send(this.tx, this.capture);
                }
            }
            Some(Err(_)) => {
                this.capture.failed = true;
                send(this.tx, this.capture);
            }
            None => {
                complete(this.capture, this.reads.as_deref());
                send(this.tx, this.capture);
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
