//! The client's request body on its way upstream, bounded in time and watched for the
//! client's own failures.
//!
//! A body that fails (the client went away mid-upload, broken chunked framing, an HTTP/2
//! body shorter or longer than its `content-length`) or that is not complete within
//! `server.request_body_timeout` makes the upstream request fail too. Seen from the
//! forwarder that looks like an upstream failure; the [`BodyFault`] kept here says whose it
//! was, so the client gets a 400 or 408 and the record says `client_error`, not
//! `upstream_error` or `timeout`.
//!
//! The same shared state starts the upstream's clock: `upstream.response_header_timeout`
//! runs from the end of the request body (or from the upstream's first response byte, if
//! it answers before the body is complete), never from the request head, so that a slow
//! upload is not booked as the upstream's delay.

use std::{
    future::Future,
    pin::Pin,
    pin::pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::{
    sync::Notify,
    time::{Instant, Sleep},
};

use super::error::ProxyError;
use crate::BoxError;

/// What went wrong with a request body, if anything, and whether the upstream's clock has
/// started; shared by the body, the upstream connection and the forwarder.
#[derive(Clone, Default)]
pub struct BodyFault(Arc<Shared>);

#[derive(Default)]
struct Shared {
    fault: Mutex<Option<Fault>>,
    /// The body is complete, or the upstream began to answer.
    started: AtomicBool,
    /// The body has been asked for (the upstream is reading it).
    read: AtomicBool,
    start: Notify,
}

enum Fault {
    TimedOut(Duration),
    Failed(BoxError),
}

impl BodyFault {
    fn set(&self, fault: Fault) {
        let mut slot = self.0.fault.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(fault);
        }
    }

    /// The client's fault as the error the client is answered with, if the body failed.
    pub fn take(&self) -> Option<ProxyError> {
        let fault = self
            .0
            .fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        Some(match fault {
            Fault::TimedOut(after) => ProxyError::BodyTimeout(after),
            Fault::Failed(e) => ProxyError::BadBody(e),
        })
    }
}

impl BodyFault {
    /// The upstream's clock starts now: the body is complete, or the upstream has begun
    /// to answer. Once; later calls cost a load.
    pub fn start_upstream_clock(&self) {
        if !self.0.started.load(Ordering::Relaxed) && !self.0.started.swap(true, Ordering::AcqRel) {
            self.0.start.notify_waiters();
        }
    }

    /// Whether the body has been asked for: its upload is under way, and if it is still
    /// incomplete at its deadline, that is the client's doing (before, the request waits
    /// for an upstream connection).
    pub fn being_read(&self) -> bool {
        self.0.read.load(Ordering::Acquire)
    }

    /// Resolves once the upstream's clock has started (at once if it has).
    pub async fn upstream_clock_started(&self) {
        let mut started = pin!(self.0.start.notified());
        // Listening before looking, so that a start in between is not missed.
        started.as_mut().enable();
        if self.0.started.load(Ordering::Acquire) {
            return;
        }
        started.await;
    }
}

/// The error the upstream client sees in place of the client's; the cause is in the
/// [`BodyFault`].
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed or timed out")]
pub struct ClientBodyFailed;

pin_project! {
    pub struct ClientBody<B> {
        #[pin]
        inner: B,
        deadline: Instant,
        timeout: Duration,
        // Armed the first time the body has to wait for the client: a body that arrived
        // with its head (most requests) never sets a timer.
        sleep: Option<Pin<Box<Sleep>>>,
        fault: BodyFault,
        failed: bool,
        // Whether `fault` has been told the body is being read (told once).
        read: bool,
    }
}

impl<B: Body> ClientBody<B> {
    /// The body must have ended `timeout` from now.
    pub fn new(inner: B, timeout: Duration) -> (ClientBody<B>, BodyFault) {
        let fault = BodyFault::default();
        if inner.is_end_stream() {
            // No body (or an empty one): the request is complete with its head.
            fault.start_upstream_clock();
        }
        let body = ClientBody {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
            fault: fault.clone(),
            failed: false,
            read: false,
        };
        (body, fault)
    }
}

impl<B> Body for ClientBody<B>
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
        if *this.failed {
            return Poll::Ready(None);
        }
        if !*this.read {
            *this.read = true;
            this.fault.0.read.store(true, Ordering::Release);
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                *this.failed = true;
                this.fault.set(Fault::Failed(e.into()));
                Poll::Ready(Some(Err(Box::new(ClientBodyFailed))))
            }
            Poll::Ready(None) => {
                this.fault.start_upstream_clock();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.inner.is_end_stream() {
                    this.fault.start_upstream_clock();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let deadline = *this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *this.failed = true;
                *this.sleep = None;
                this.fault.set(Fault::TimedOut(*this.timeout));
                Poll::Ready(Some(Err(Box::new(ClientBodyFailed))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt;

    use super::*;

    /// A body that sends one chunk, then nothing more, ever (a slow client).
    struct Stalled(Option<Bytes>);

    impl Body for Stalled {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.0.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_incomplete_at_the_deadline_fails_as_a_timeout() {
        let (mut body, fault) = ClientBody::new(
            Stalled(Some(Bytes::from_static(b"{"))),
            Duration::from_secs(60),
        );
        let start = Instant::now();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "{");
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert!(matches!(fault.take(), Some(ProxyError::BodyTimeout(_))));
        assert!(body.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_arrives_in_time_is_untouched() {
        let full = http_body_util::Full::new(Bytes::from_static(b"{}"));
        let (body, fault) = ClientBody::new(full, Duration::from_secs(60));
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
        assert!(fault.take().is_none());
    }

    /// A body whose client broke it (bad framing, gone mid-upload).
    struct Broken;

    impl Body for Broken {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(Some(Err(std::io::Error::other("invalid chunk size"))))
        }
    }

    /// A body fed by a channel: it ends when the sender is dropped.
    struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_upstream_clock_starts_when_the_body_is_complete() {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (mut body, fault) = ClientBody::new(Channel(rx), Duration::from_secs(60));
        let start = Instant::now();
        let started = tokio::spawn({
            let fault = fault.clone();
            async move {
                fault.upstream_clock_started().await;
                Instant::now()
            }
        });
        let reader = tokio::spawn(async move {
            while let Some(frame) = body.frame().await {
                frame.unwrap();
            }
        });
        tokio::time::sleep(Duration::from_secs(4)).await;
        tx.send(Bytes::from_static(b"{}")).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!started.is_finished(), "not before the body's end");
        drop(tx);
        reader.await.unwrap();
        assert_eq!(started.await.unwrap() - start, Duration::from_secs(4));
        assert!(fault.take().is_none());
    }

    #[tokio::test]
    async fn a_request_without_a_body_starts_the_upstream_clock_at_once() {
        let empty = http_body_util::Empty::<Bytes>::new();
        let (_body, fault) = ClientBody::new(empty, Duration::from_secs(60));
        fault.upstream_clock_started().await;
    }

    #[tokio::test]
    async fn a_failing_body_is_the_clients_fault() {
        let (mut body, fault) = ClientBody::new(Broken, Duration::from_secs(60));
        assert!(body.frame().await.unwrap().is_err());
        assert!(body.frame().await.is_none(), "nothing after the failure");
        assert!(matches!(fault.take(), Some(ProxyError::BadBody(_))));
    }
}
