//! Body wrappers of the measurement path. Both pass every frame through unchanged,
//! forward `is_end_stream` and `size_hint`, and add one `Instant::now()` plus a few integer
//! updates per frame: no copies of body bytes (a captured chunk is a refcounted `Bytes`).

use std::{
    pin::Pin,
    task::{Context, Poll, ready},
    time::Instant,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;

use super::tap::{Ending, Tap};
use crate::{BoxError, proxy::IdleTimeout};

pin_project! {
    /// The upstream response body as the client receives it, timestamped frame by frame.
    pub struct MeasuredBody<B>
    where
        B: Body,
    {
        #[pin]
        inner: B,
        tap: Tap,
    }

    impl<B> PinnedDrop for MeasuredBody<B>
    where
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // A body hyper stopped polling because it knew it was complete (empty bodies,
            // Content-Length reached) ended normally; anything else is an abort, which the
            // tap's own drop records.
            if !this.tap.is_finished() && this.inner.is_end_stream() {
                this.tap.finish(Instant::now(), Ending::Complete);
            }
        }
    }
}

impl<B: Body> MeasuredBody<B> {
    pub fn new(inner: B, tap: Tap) -> MeasuredBody<B> {
        MeasuredBody { inner, tap }
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
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = ready!(this.inner.as_mut().poll_frame(cx));
        let now = Instant::now();
        match polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.tap.on_data(now, data);
                }
                if this.inner.is_end_stream() {
                    this.tap.finish(now, Ending::Complete);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                let err: BoxError = e.into();
                let ending = if err.is::<IdleTimeout>() {
                    Ending::IdleTimeout
                } else {
                    Ending::UpstreamFailed
                };
                this.tap.finish(now, ending);
                Poll::Ready(Some(Err(err)))
            }
            None => {
                this.tap.finish(now, Ending::Complete);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
}

pin_project! {
    /// The client's request body on its way upstream. Chunks are streamed on as they come;
    /// handles to them are kept (up to the inspection limit) so the aggregator can read the
    /// model, stream flag and max_tokens without the request ever being buffered.
    pub struct RequestTap<B>
    where
        B: Body,
    {
        #[pin]
        inner: B,
        capture: RequestCapture,
        captured: usize,
        limit: usize,
        tx: Option<oneshot::Sender<RequestCapture>>,
    }

    impl<B> PinnedDrop for RequestTap<B>
    where
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.inner.is_end_stream() {
                this.capture.complete = true;
            }
            send(this.tx, this.capture);
        }
    }
}

fn send(tx: &mut Option<oneshot::Sender<RequestCapture>>, capture: &mut RequestCapture) {
    if let Some(tx) = tx.take() {
        // The receiver may be gone (measurement already emitted); nothing to do then.
        let _ = tx.send(std::mem::take(capture));
    }
}

impl<B: Body> RequestTap<B> {
    pub fn new(inner: B, limit: usize) -> (RequestTap<B>, oneshot::Receiver<RequestCapture>) {
        let (tx, rx) = oneshot::channel();
        let tap = RequestTap {
            inner,
            capture: RequestCapture::default(),
            captured: 0,
            limit,
            tx: Some(tx),
        };
        (tap, rx)
    }
}

impl<B> Body for RequestTap<B>
where
    B: Body<Data = Bytes>,
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
                    this.capture.complete = true;
                    send(this.tx, this.capture);
                }
            }
            Some(Err(_)) => send(this.tx, this.capture),
            None => {
                this.capture.complete = true;
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
