//! goodput's own HTTP/1.1 client for plain upstream connections (`upstream.http1_relay`,
//! on by default), in place of hyper's client connection on the inline pool
//! ([`super::inline`]).
//!
//! hyper's client decodes a chunked body one chunk at a time: it splits a `Bytes` off its
//! read buffer for every byte of a chunk-size line and passes each chunk through a channel
//! to the response body, waking a waker in each direction. Here the connection is read
//! by the response body itself, every read goes through the strict framing observer
//! ([`super::framing`]), and its payload goes on as one frame. The request is written
//! with the head and the body's ready bytes in one vectored write.
//!
//! What the relay keeps of hyper's client, so that both paths behave alike (the
//! integration tests run both ways): the request head's bytes and framing decision
//! ([`outgoing`]), the response head's parsing rules and limits ([`head`]), a request is
//! retried on another connection only when none of it was written on a reused one, a
//! request still being written when its response begins goes on being written, and a
//! connection goes back to the pool only after a clean end with nothing left over.
//!
//! An idle upstream connection holds no read buffer: one is taken when the socket is
//! readable, sized to what reads take ([`WireStream`]), and handed on with the payload.

mod body;
mod head;
mod outgoing;
#[cfg(test)]
mod tests;

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::BytesMut;
use http::{Request, Response};
use tokio::io::{AsyncRead, ReadBuf};

pub use body::RelayBody;
pub use outgoing::{Outgoing, WriteError};

use super::{
    error::ProxyError, framing::Violation, inline::ReqBody, request_body::BodyFault, slots::Slot,
};
use crate::{
    measure::ReadClock,
    proxy::wire::{Quiet, WireStream},
};

/// Where a connection goes when its response has ended cleanly (the pool).
pub trait Home: Send + Sync {
    fn put_back(&self, conn: RawConn);
    /// A connection was closed after its response because bytes followed it that no
    /// request asked for (counted by the pool).
    fn unsolicited(&self) {}
}

/// Why a relayed response body failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("upstream body framing: {0}")]
    Framing(Violation),
    #[error("reading the upstream: {0}")]
    Io(#[source] io::Error),
    #[error(transparent)]
    Write(WriteError),
}

/// One upstream connection of the relay.
pub struct RawConn {
    io: WireStream,
    reads: Arc<ReadClock>,
    /// What has been read and not yet handed on; no capacity while idle.
    buf: BytesMut,
    /// Given back when the connection is dropped (closed).
    _slot: Slot,
}

impl RawConn {
    pub fn new(io: WireStream, reads: Arc<ReadClock>, slot: Slot) -> RawConn {
        RawConn {
            io,
            reads,
            buf: BytesMut::new(),
            _slot: slot,
        }
    }

    pub fn reads(&self) -> &Arc<ReadClock> {
        &self.reads
    }

    /// Open, idle and with nothing unread (a read attempt): [`Quiet::Silent`].
    pub fn idle_state(&self) -> Quiet {
        if self.buf.is_empty() {
            self.io.idle_state()
        } else {
            Quiet::Unsolicited
        }
    }

    /// Reads more into `buf`: the bytes read, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() == 0 {
            // Room only once there is something to read: an idle wait holds none.
            ready!(self.io.poll_read_ready(cx))?;
        }
        let len = self.buf.len();
        let want = self.io.next_read();
        self.buf.resize(len + want, 0);
        let mut room = ReadBuf::new(&mut self.buf[len..]);
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut room);
        let got = room.filled().len();
        self.buf.truncate(len + got);
        match polled {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(got)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// How sending a request failed.
pub enum SendError {
    /// Nothing of it was written: it may go on another connection.
    Unsent(Outgoing),
    Failed(ProxyError),
}

/// Writes `out` on `conn` and reads the response head. The response body reads the rest
/// and hands the connection `home` when it ends cleanly.
pub async fn send(
    conn: RawConn,
    out: Outgoing,
    fault: &BodyFault,
    home: Arc<dyn Home>,
    max_head: usize,
) -> Result<Response<RelayBody>, SendError> {
    let mut conn = Some(conn);
    let mut out = Some(out);
    let method = out.as_ref().map(|o| o.method().clone()).unwrap_or_default();
    // Set when the upstream stopped reading the request: its answer may still come.
    let mut write_failed: Option<io::Error> = None;
    let head = poll_fn(|cx| {
        let Some(c) = conn.as_mut() else {
            return Poll::Ready(Err(failed(io::ErrorKind::NotConnected.into())));
        };
        if let Some(o) = out.as_mut()
            && let Poll::Ready(written) = o.poll_write(&mut c.io, cx)
        {
            match written {
                Ok(()) => out = None,
                Err(WriteError::Io(e)) => {
                    if let Some(o) = out.take_if(|o| o.unwritten()) {
                        tracing::debug!(error = %e, "upstream connection closed before the request; retrying");
                        return Poll::Ready(Err(SendError::Unsent(o)));
                    }
                    out = None;
                    write_failed = Some(e);
                }
                Err(e) => {
                    return Poll::Ready(Err(SendError::Failed(ProxyError::UpstreamFailed(
                        Box::new(e),
                    ))));
                }
            }
        }
        loop {
            match head::parse(&mut c.buf, &method, max_head) {
                Ok(Some(head)) => return Poll::Ready(Ok(head)),
                Ok(None) => {}
                Err(head::HeadError::TooLarge(limit)) => {
                    return Poll::Ready(Err(SendError::Failed(ProxyError::HeadTooLarge(limit))));
                }
                Err(e) => {
                    return Poll::Ready(Err(SendError::Failed(ProxyError::UpstreamFailed(
                        Box::new(e),
                    ))));
                }
            }
            match ready!(c.poll_fill(cx)) {
                Ok(0) => {
                    let e = write_failed.take().unwrap_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "upstream closed the connection before a response head",
                        )
                    });
                    return Poll::Ready(Err(match out.take_if(|o| o.unwritten()) {
                        Some(o) if c.buf.is_empty() => SendError::Unsent(o),
                        _ => failed(e),
                    }));
                }
                Ok(_) => {
                    if out.is_some() {
                        // The upstream began to answer before the request body was
                        // complete: its clock starts at its first byte.
                        fault.start_upstream_clock();
                    }
                }
                Err(e) => {
                    return Poll::Ready(Err(match out.take_if(|o| o.unwritten()) {
                        Some(o) if c.buf.is_empty() => SendError::Unsent(o),
                        _ => failed(e),
                    }));
                }
            }
        }
    })
    .await;
    let head = match head {
        Ok(head) => head,
        Err(SendError::Unsent(o)) => return Err(SendError::Unsent(o)),
        Err(e) => return Err(e),
    };
    let Some(conn) = conn else {
        return Err(failed(io::ErrorKind::NotConnected.into()));
    };
    let body = RelayBody::new(conn, head.delimiter, out, home, head.keep_alive);
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = head.headers;
    Ok(resp)
}

fn failed(e: io::Error) -> SendError {
    SendError::Failed(ProxyError::UpstreamFailed(Box::new(e)))
}

/// The request as the relay writes it.
pub fn outgoing(req: Request<ReqBody>) -> Outgoing {
    let (parts, body) = req.into_parts();
    Outgoing::new(parts, body)
}
