//! The request body's tap: it passes the client's body through unchanged, keeps its
//! chunks (up to the inspection limit, as refcounted `Bytes`) for the aggregator, times its
//! end for `upload_ms`, and hands a complete body to a mirror ticket (`[shadow]`).

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

use super::super::{
    clock::ReadClock,
    mirror::{MirrorTicket, Unmirrored},
};
use crate::BoxError;

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
        // A copy of the body is wanted once it is complete (the shadow).
        mirror: Option<Box<dyn MirrorTicket>>,
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
            send(this.tx, this.capture, this.mirror);
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

fn send(
    tx: &mut Option<oneshot::Sender<RequestCapture>>,
    capture: &mut RequestCapture,
    mirror: &mut Option<Box<dyn MirrorTicket>>,
) {
    if let Some(tx) = tx.take() {
        capture.compact();
        if let Some(ticket) = mirror.take() {
            if capture.overflow {
                ticket.abandon(Unmirrored::TooLarge);
            } else if capture.complete && !capture.failed {
                ticket.body_complete(&capture.chunks);
            } else {
                ticket.abandon(Unmirrored::Incomplete);
            }
        }
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
            mirror: None,
            reads,
        };
        (tap, rx)
    }

    /// Hands the body to `ticket` once it is complete (or tells it why not).
    pub fn mirror_to(mut self, ticket: Option<Box<dyn MirrorTicket>>) -> RequestTap<B> {
        self.mirror = ticket;
        self
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
                    send(this.tx, this.capture, this.mirror);
                }
            }
            Some(Err(_)) => {
                this.capture.failed = true;
                send(this.tx, this.capture, this.mirror);
            }
            None => {
                complete(this.capture, this.reads.as_deref());
                send(this.tx, this.capture, this.mirror);
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
