//! The response body as read off an upstream connection of the relay: each read goes
//! through the framing observer ([`crate::proxy::Framing`]) and its payload is handed on
//! as one frame, a slice of the read itself when the read holds one run of payload (the
//! usual streamed event), else the runs joined. A read that breaks the framing hands on
//! the payload before the bad byte, then fails the body; the connection is closed.
//!
//! The request may still be on its way out when the response begins (an upstream that
//! answers early): the body keeps writing it, and a connection whose request was not
//! written whole is closed at the end instead of being reused.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::{Home, RawConn, RelayError, outgoing::Outgoing};
use crate::{
    BoxError,
    proxy::upstream::framing::{Delimiter, Framing},
};

pub struct RelayBody {
    /// `None` once the body has ended or failed.
    conn: Option<RawConn>,
    framing: Framing,
    /// The request, while it is still being written.
    writer: Option<Outgoing>,
    home: Arc<dyn Home>,
    keep_alive: bool,
    /// A failure found after payload that was handed on first.
    failed: Option<RelayError>,
    /// Payload bytes still to come of a `Content-Length` body.
    left: Option<u64>,
}

impl RelayBody {
    pub(super) fn new(
        conn: RawConn,
        delimiter: Delimiter,
        writer: Option<Outgoing>,
        home: Arc<dyn Home>,
        keep_alive: bool,
    ) -> RelayBody {
        let left = match delimiter {
            Delimiter::Length(n) => Some(n),
            Delimiter::Chunked | Delimiter::Close => None,
        };
        let mut body = RelayBody {
            conn: Some(conn),
            framing: Framing::new(delimiter),
            writer,
            home,
            keep_alive,
            failed: None,
            left,
        };
        if body.framing.is_done() {
            body.finish();
        }
        body
    }

    /// The body has ended: the connection goes back to the pool if it can carry another
    /// request, and is closed otherwise; closed and counted when bytes nobody asked for
    /// follow the body.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && self.writer.is_none()
        {
            if conn.buf.is_empty() {
                self.home.put_back(conn);
            } else {
                self.home.unsolicited();
            }
        }
        self.writer = None;
    }

    /// Feeds what the connection has read to the observer: the payload among it, if any.
    fn take_payload(&mut self) -> Option<Result<Bytes, RelayError>> {
        let conn = self.conn.as_mut()?;
        let buf = &conn.buf;
        let mut first: Option<std::ops::Range<usize>> = None;
        let mut joined: Option<BytesMut> = None;
        let fed = self.framing.feed(buf, |r| match (&first, &mut joined) {
            (None, _) => first = Some(r),
            (Some(f), None) => {
                let mut j = BytesMut::with_capacity(buf.len());
                j.extend_from_slice(&buf[f.clone()]);
                j.extend_from_slice(&buf[r]);
                joined = Some(j);
            }
            (Some(_), Some(j)) => j.extend_from_slice(&buf[r]),
        });
        let (used, done, broken) = match fed {
            Ok(fed) => (fed.used, fed.done, None),
            Err(b) => (b.at, false, Some(b.violation)),
        };
        let read = conn.buf.split_to(used).freeze();
        let payload = match (joined, first) {
            (Some(j), _) => Some(j.freeze()),
            (None, Some(r)) => Some(read.slice(r)),
            (None, None) => None,
        };
        if let Some(violation) = broken {
            self.conn = None;
            self.writer = None;
            self.failed = Some(RelayError::Framing(violation));
        } else if done {
            // Bytes after the body's end make it no connection to reuse (`finish`).
            self.finish();
        }
        if let (Some(left), Some(p)) = (self.left.as_mut(), payload.as_ref()) {
            *left = left.saturating_sub(p.len() as u64);
        }
        match payload {
            Some(p) => Some(Ok(p)),
            None => self.failed.take().map(Err),
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(e.into())));
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(writer) = this.writer.as_mut()
                && let Poll::Ready(written) = writer.poll_write(&mut conn.io, cx)
            {
                this.writer = None;
                if let Err(e) = written {
                    // The upstream stopped reading (it answered early) or the client's body
                    // failed: no reuse, and a failed client body fails the response too,
                    // as the upstream will not see the rest of the request.
                    this.keep_alive = false;
                    if e.is_body() {
                        this.conn = None;
                        return Poll::Ready(Some(Err(RelayError::Write(e).into())));
                    }
                }
            }
            if !conn.buf.is_empty() {
                match this.take_payload() {
                    Some(Ok(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                    None => continue,
                }
            }
            match conn.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    let ended = this.framing.eof();
                    this.keep_alive = false;
                    this.finish();
                    return match ended {
                        Ok(()) => Poll::Ready(None),
                        Err(v) => Poll::Ready(Some(Err(RelayError::Framing(v).into()))),
                    };
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    this.writer = None;
                    return Poll::Ready(Some(Err(RelayError::Io(e).into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() && self.failed.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) if self.failed.is_none() => SizeHint::with_exact(n),
            _ => SizeHint::new(),
        }
    }
}
