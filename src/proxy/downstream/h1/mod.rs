//! goodput's own HTTP/1.1 server connection for plaintext clients (`server.http1_own`):
//! request heads parsed with hyper's rules and limits ([`head`]), request bodies read by
//! the upstream side straight from the connection's read buffer ([`body`]), responses
//! written by [`write`]'s head and the body's own frames, flushed frame by frame.
//!
//! Requests are served in order, as hyper does: the next head is read only once the
//! previous response is written and its body has ended. While a request is served, a
//! client that closes its side cancels it (unless `server.http1_half_close`). A request
//! asking for an upgrade hands the connection, with the bytes already read, over to
//! hyper's server for the rest of its life ([`rewind`]).
//!
//! Memory: an idle connection holds its read buffer only; the head is written from a
//! buffer that lives while it is written (with the first frames when they are ready
//! together).

mod body;
mod head;
mod respond;
mod rewind;
mod write;

use std::{
    future::{Future, poll_fn},
    io::IoSlice,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncRead, AsyncWrite};

pub use head::Reject;
pub use rewind::Rewind;

use self::{
    body::{Conn, RequestBody, Shared, lock},
    respond::respond,
    write::{Encoder, Exchange},
};
use crate::{BoxError, proxy::ClientSide};

/// What the connection is configured with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub header_read_timeout: Duration,
    pub max_head_bytes: usize,
    pub half_close: bool,
}

/// Why a connection ended badly (for the debug log; the client has been told already).
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("request head refused: {0:?}")]
    Refused(Reject),
    #[error("client I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("response body failed: {0}")]
    Body(BoxError),
    #[error("the request head was not complete in time")]
    HeaderTimeout,
}

/// Serves `io` until the client leaves, the connection is shut down (`stop`, between
/// requests), or a request hands it to `upgrade`. `refused` is told of each refused head.
pub async fn serve<IO, S, B, U, UF>(
    io: IO,
    mut svc: S,
    settings: Settings,
    stop: Arc<AtomicBool>,
    refused: impl Fn(Reject),
    upgrade: U,
) -> Result<(), ConnError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<ClientSide>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    U: FnOnce(Rewind<IO>) -> UF,
    UF: Future<Output = ()>,
{
    let conn: Conn<IO> = Arc::new(Mutex::new(Shared::new(io)));
    let mut timer = Box::pin(tokio::time::sleep(settings.header_read_timeout));
    // Refusals are answered in the version of the connection's last request (hyper's).
    let mut version = http::Version::HTTP_11;
    loop {
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + settings.header_read_timeout);
        let len = match poll_fn(|cx| read_head(&conn, cx, &settings, &stop, timer.as_mut())).await {
            Ok(Some(len)) => len,
            Ok(None) => return Ok(()),
            Err(Fault::Timeout) => return Err(ConnError::HeaderTimeout),
            Err(Fault::Io(e)) => return Err(e.into()),
            Err(Fault::Reject(r)) => return refuse(&conn, r, version, &refused).await,
        };
        let (raw, head) = {
            let mut shared = lock(&conn);
            head::take(&mut shared.buf, len)
        };
        let head = match head {
            Ok(h) => h,
            Err(r) => return refuse(&conn, r, version, &refused).await,
        };
        if head.wants_upgrade {
            // hyper's server takes the connection over: it reads this head again.
            let (rest, io) = {
                let mut shared = lock(&conn);
                (std::mem::take(&mut shared.buf), shared.io.take())
            };
            let Some(io) = io else {
                return Ok(());
            };
            let mut prefix = BytesMut::with_capacity(raw.len() + rest.len());
            prefix.extend_from_slice(&raw);
            prefix.extend_from_slice(&rest);
            // Boxed: hyper's connection is large, and only an upgrade needs one; in place,
            // every connection's task would be as large as it.
            Box::pin(upgrade(Rewind::new(prefix.freeze(), io))).await;
            return Ok(());
        }
        // The head's bytes are needed only for a hand-off; held on, they would keep the
        // read buffer shared (a read while the response streams would take a new one).
        drop(raw);
        version = head.version;
        let method = head.method.clone();
        let mut keep_alive = head.keep_alive;
        let expect_continue = head.expect_continue && version == http::Version::HTTP_11;
        {
            lock(&conn).begin(head.body, expect_continue);
        }
        let body = match head.body {
            None => ClientSide::Own(Empty::new().map_err(|e| match e {}).boxed_unsync()),
            Some(length) => {
                ClientSide::Own(RequestBody::new(Arc::clone(&conn), length).boxed_unsync())
            }
        };
        let mut req = Request::new(body);
        *req.method_mut() = head.method;
        *req.uri_mut() = head.uri;
        *req.version_mut() = version;
        *req.headers_mut() = head.headers;

        let mut eof = false;
        // The call's future and the body boxed, the response in a block of its own: an
        // async fn keeps a moved-from local's room until its scope ends, so the call's
        // future, the response and the body (about 3 KiB each) would otherwise all stay in
        // this future's state, which every connection holds from its first byte to its
        // last, idle or not. Boxed, the call's future is freed once the response arrives.
        let (mut parts, body) = {
            let mut call = Box::pin(svc.call(req));
            let resp = poll_fn(|cx| {
                if let Poll::Ready(r) = call.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if expect_continue {
                    let mut shared = lock(&conn);
                    if shared.continue_owed(cx) {
                        // The body asked, and the answer is not ready: the client may send it.
                        match shared.poll_continue(cx) {
                            Poll::Ready(Ok(())) => {
                                drop(shared);
                                cx.waker().wake_by_ref();
                                return Poll::Pending;
                            }
                            Poll::Ready(Err(_)) => return Poll::Ready(None),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                }
                if client_gone(&conn, cx, &mut eof, settings.half_close) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            let Some(resp) = resp else {
                // The client left: dropping the call cancels the request.
                return Ok(());
            };
            let (parts, body) = match resp {
                Ok(r) => r.into_parts(),
                Err(e) => return Err(ConnError::Body(e.into())),
            };
            (parts, Box::pin(body))
        };
        if expect_continue {
            lock(&conn).forgo_continue();
        }
        if stop.load(Ordering::Acquire) || eof {
            keep_alive = false;
        }
        let len = if body.is_end_stream() {
            None
        } else {
            Some(body.size_hint().exact())
        };
        let mut out = Vec::with_capacity(256);
        let (encoder, keep) = write::encode(
            parts.status,
            &mut parts.headers,
            len,
            &Exchange {
                method: &method,
                version,
                keep_alive,
            },
            &mut out,
        );
        let written = respond(&conn, out, encoder, body, &mut eof, settings.half_close).await;
        match written {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => return Err(e),
        }
        // A body nobody read to its end is drained from what has arrived, as hyper
        // does; one still arriving closes the connection.
        let reusable = poll_fn(|cx| Poll::Ready(lock(&conn).drain(cx))).await;
        if !(keep && reusable) || eof || stop.load(Ordering::Acquire) {
            return shut(&conn).await;
        }
        {
            let mut shared = lock(&conn);
            shared.idle();
            if shared.buf.is_empty() && shared.buf.capacity() > 2 * body::READ_ROOM {
                // Idle: the buffer a large head or body needed goes back.
                shared.buf = BytesMut::new();
            }
        }
    }
}

enum Fault {
    Timeout,
    Io(std::io::Error),
    Reject(Reject),
}

/// Reads until a complete head is in the buffer: its length; `None` when the client
/// closed (or the connection is shut down) before one began.
fn read_head<IO: AsyncRead + AsyncWrite + Unpin>(
    conn: &Conn<IO>,
    cx: &mut Context<'_>,
    settings: &Settings,
    stop: &AtomicBool,
    timer: Pin<&mut tokio::time::Sleep>,
) -> Poll<Result<Option<usize>, Fault>> {
    let mut shared = lock(conn);
    loop {
        if !shared.buf.is_empty() {
            match head::complete(&shared.buf, settings.max_head_bytes) {
                Ok(Some(len)) => return Poll::Ready(Ok(Some(len))),
                Ok(None) => {}
                Err(r) => return Poll::Ready(Err(Fault::Reject(r))),
            }
        } else if stop.load(Ordering::Acquire) {
            return Poll::Ready(Ok(None));
        }
        match shared.poll_read(cx) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Ok(None)),
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(Fault::Io(e))),
            Poll::Pending => {
                if timer.poll(cx).is_ready() {
                    return Poll::Ready(Err(Fault::Timeout));
                }
                return Poll::Pending;
            }
        }
    }
}

/// Whether the client has gone while its request is served: its side closed (never
/// looked at when half-closes are answered). Reads only once the request body has ended and nothing
/// is buffered yet (a pipelined request waits in the buffer).
fn client_gone<IO: AsyncRead + AsyncWrite + Unpin>(
    conn: &Conn<IO>,
    cx: &mut Context<'_>,
    eof: &mut bool,
    half_close: bool,
) -> bool {
    if *eof {
        return !half_close;
    }
    if half_close {
        // As hyper: nothing is read while a request is served; its close is seen when the
        // next head is read.
        return false;
    }
    let mut shared = lock(conn);
    if !shared.body_done || !shared.buf.is_empty() {
        return false;
    }
    match shared.poll_read_watch(cx) {
        Poll::Ready(Ok(0)) => {
            *eof = true;
            !half_close
        }
        Poll::Ready(Err(_)) => {
            *eof = true;
            true
        }
        _ => false,
    }
}

/// Answers a refused head as hyper does, then closes.
async fn refuse<IO: AsyncRead + AsyncWrite + Unpin>(
    conn: &Conn<IO>,
    reject: Reject,
    version: http::Version,
    refused: &impl Fn(Reject),
) -> Result<(), ConnError> {
    refused(reject);
    let mut out = Vec::with_capacity(128);
    write::error_head(reject.status(), version, &mut out);
    let mut at = 0;
    poll_fn(|cx| {
        let mut shared = lock(conn);
        let Some(io) = shared.io.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        while at < out.len() {
            match std::task::ready!(Pin::new(&mut *io).poll_write(cx, &out[at..])) {
                Ok(0) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => at += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Pin::new(io).poll_flush(cx)
    })
    .await?;
    shut(conn).await?;
    Err(ConnError::Refused(reject))
}

/// Closes the write side (the client reads the end of the last response).
async fn shut<IO: AsyncWrite + Unpin>(conn: &Conn<IO>) -> Result<(), ConnError> {
    poll_fn(|cx| {
        let mut shared = lock(conn);
        match shared.io.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    })
    .await
    .or_else(|e| {
        if e.kind() == std::io::ErrorKind::NotConnected {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    Ok(())
}
