//! The response body as the proxy forwards it: the upstream's body, unchanged, with an
//! idle timeout between chunks (which never cuts a healthy stream, however long), or a
//! small body the proxy wrote itself.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::inline::Lease;
use crate::BoxError;

/// No body bytes arrived from the upstream within the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream body idle for longer than {0:?}")]
pub struct IdleTimeout(pub Duration);

pin_project! {
    #[project = Proj]
    pub enum UpstreamBody {
        Stream {
            #[pin]
            body: Incoming,
            #[pin]
            idle: Sleep,
            timeout: Duration,
            // The upstream connection, when it is driven by this body (super::inline).
            lease: Option<Lease>,
        },
        Full { data: Option<Bytes> },
    }
}

impl UpstreamBody {
    pub fn stream(body: Incoming, timeout: Duration, lease: Option<Lease>) -> UpstreamBody {
        UpstreamBody::Stream {
            body,
            idle: tokio::time::sleep(timeout),
            timeout,
            lease,
        }
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
    body: Pin<&mut Incoming>,
    lease: &mut Option<Lease>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
    if let Some(lease) = lease {
        lease.drive(cx);
    }
    body.poll_frame(cx)
}

fn release(lease: &mut Option<Lease>, cx: &mut Context<'_>) {
    if let Some(lease) = lease.take() {
        lease.release(cx);
    }
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
                lease,
            } => match drive_then_poll(body.as_mut(), lease, cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Extending a tokio timer deadline is a lock-free update.
                    idle.as_mut().reset(Instant::now() + *timeout);
                    if body.is_end_stream() {
                        // hyper's server stops polling a body that says it has ended.
                        release(lease, cx);
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    release(lease, cx);
                    Poll::Ready(None)
                }
                Poll::Pending => match idle.poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleTimeout(*timeout))))),
                    Poll::Pending => Poll::Pending,
                },
            },
            Proj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Stream { body, .. } => body.is_end_stream(),
            UpstreamBody::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Stream { body, .. } => body.size_hint(),
            UpstreamBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
