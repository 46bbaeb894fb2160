//! The connection's read side, shared by the connection (request heads, a client's
//! close between requests) and the request body it is reading (decoded with the relay's
//! framing grammar, hyper's: [`crate::proxy::Framing`]). Only one of them reads at a
//! time: the connection reads again only once the body has ended. A body read hands on
//! the payload of each read as it came, as slices of the read buffer, never copied.

use std::{
    ops::Range,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll, Waker, ready},
};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

use super::head::BodyLength;
use crate::{
    BoxError,
    proxy::{Delimiter, Framing},
};

/// Room a read offers at least (reads are small: a head, a JSON body).
pub const READ_ROOM: usize = 4096;
/// Room a read offers at most: a read that fills its room doubles the next one's, so a
/// large upload is read in few calls (hyper's adaptive read buffer does the same).
const MAX_READ_ROOM: usize = 64 << 10;
/// Room a read watching the client offers when the buffer has none left.
const WATCH_ROOM: usize = 512;

/// What `Expect: 100-continue` is answered with when the body is first asked for.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The connection's I/O and read buffer, with the state of the body being read.
pub struct Shared<IO> {
    /// `None` once handed over to hyper's server.
    pub io: Option<IO>,
    pub buf: BytesMut,
    /// Room the next read offers.
    room: usize,
    framing: Option<Framing>,
    /// What is left of a `Content-Length` body (for the size hint).
    remaining: Option<u64>,
    /// The body has ended (or there was none).
    pub body_done: bool,
    /// The body broke (bad framing, the client left): the connection cannot be reused.
    pub body_broken: bool,
    /// How much of [`CONTINUE`] is written, while it is owed.
    continue_at: Option<usize>,
    /// The body is waiting for the connection to write [`CONTINUE`]: as hyper's, the
    /// connection writes it only when its response is not ready in the same poll.
    continue_wanted: Option<Waker>,
    /// The connection's task while it waits for a response owing [`CONTINUE`].
    connection: Option<Waker>,
    /// The last read's bytes, and the payload ranges within them not yet handed on.
    held: Bytes,
    ranges: Vec<Range<usize>>,
    next: usize,
}

pub type Conn<IO> = Arc<Mutex<Shared<IO>>>;

pub fn lock<IO>(conn: &Conn<IO>) -> std::sync::MutexGuard<'_, Shared<IO>> {
    conn.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<IO> Shared<IO> {
    pub fn new(io: IO) -> Shared<IO> {
        Shared {
            io: Some(io),
            buf: BytesMut::new(),
            room: READ_ROOM,
            framing: None,
            remaining: None,
            body_done: true,
            body_broken: false,
            continue_at: None,
            continue_wanted: None,
            connection: None,
            held: Bytes::new(),
            ranges: Vec::new(),
            next: 0,
        }
    }

    /// Between requests: reads start small again.
    pub fn idle(&mut self) {
        self.room = READ_ROOM;
    }

    /// A new request's body begins.
    pub fn begin(&mut self, length: Option<BodyLength>, expect_continue: bool) {
        self.held = Bytes::new();
        self.ranges.clear();
        self.next = 0;
        self.body_broken = false;
        let delimiter = match length {
            None => {
                self.framing = None;
                self.remaining = None;
                self.body_done = true;
                self.continue_at = None;
                return;
            }
            Some(BodyLength::Length(n)) => {
                self.remaining = Some(n);
                Delimiter::Length(n)
            }
            Some(BodyLength::Chunked) => {
                self.remaining = None;
                Delimiter::Chunked
            }
        };
        self.framing = Some(Framing::new(delimiter));
        self.body_done = false;
        self.continue_at = expect_continue.then_some(0);
        self.continue_wanted = None;
        self.connection = None;
    }

    /// Whether the body waits for [`CONTINUE`]; notes the connection's task to wake
    /// when it comes to wait for it.
    pub fn continue_owed(&mut self, cx: &Context<'_>) -> bool {
        if self.continue_at.is_none() {
            return false;
        }
        if !self
            .connection
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            self.connection = Some(cx.waker().clone());
        }
        self.continue_wanted.is_some()
    }

    /// The response is on its way: [`CONTINUE`] is no longer owed (and the body's reader
    /// is woken to read, or to be drained).
    pub fn forgo_continue(&mut self) {
        self.continue_at = None;
        self.connection = None;
        if let Some(body) = self.continue_wanted.take() {
            body.wake();
        }
    }
}

impl<IO: AsyncRead + Unpin> Shared<IO> {
    /// One read into the buffer, offering at least [`READ_ROOM`] bytes of room.
    pub fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.room {
            self.buf.reserve(self.room);
        }
        let offered = self.buf.capacity() - self.buf.len();
        let n = ready!(self.poll_read_room(cx))?;
        if n >= offered && self.room < MAX_READ_ROOM {
            self.room *= 2;
        }
        Poll::Ready(Ok(n))
    }

    /// A read while a response is served, to see the client leave (or a pipelined request
    /// arrive): it offers the room the buffer has left and reserves only when none is
    /// left. A full room reserved while the request's bytes are still referenced (its
    /// head, its body on the way upstream) would allocate a second buffer that an idle
    /// stream then holds for its whole life.
    pub fn poll_read_watch(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() == self.buf.len() {
            self.buf.reserve(WATCH_ROOM);
        }
        self.poll_read_room(cx)
    }

    /// One read into the room the buffer has.
    fn poll_read_room(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Shared<IO> {
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        if let Some(range) = self.ranges.get(self.next).cloned() {
            self.next += 1;
            return Poll::Ready(Some(Ok(self.held.slice(range))));
        }
        if self.body_done {
            return Poll::Ready(None);
        }
        if self.body_broken {
            return Poll::Ready(Some(Err("request body broken".into())));
        }
        if self.continue_at.is_some() {
            // The connection writes it (or forgoes it) and wakes this body then.
            self.continue_wanted = Some(cx.waker().clone());
            if let Some(connection) = &self.connection {
                connection.wake_by_ref();
            }
            return Poll::Pending;
        }
        loop {
            if !self.buf.is_empty() {
                let Some(framing) = self.framing.as_mut() else {
                    return Poll::Ready(None);
                };
                self.ranges.clear();
                self.next = 0;
                let ranges = &mut self.ranges;
                match framing.feed(&self.buf, |r| ranges.push(r)) {
                    Ok(fed) => {
                        self.held = self.buf.split_to(fed.used).freeze();
                        self.body_done = fed.done;
                        if let Some(range) = self.ranges.first().cloned() {
                            self.next = 1;
                            if let Some(left) = self.remaining.as_mut() {
                                *left -= self.ranges.iter().map(|r| r.len() as u64).sum::<u64>();
                            }
                            return Poll::Ready(Some(Ok(self.held.slice(range))));
                        }
                        if self.body_done {
                            return Poll::Ready(None);
                        }
                    }
                    Err(broken) => {
                        self.body_broken = true;
                        return Poll::Ready(Some(Err(Box::new(broken.violation))));
                    }
                }
            }
            match ready!(self.poll_read(cx)) {
                Ok(0) => {
                    self.body_broken = true;
                    let e = self
                        .framing
                        .as_mut()
                        .and_then(|f| f.eof().err())
                        .map_or_else(|| "closed".into(), |v| -> BoxError { Box::new(v) });
                    return Poll::Ready(Some(Err(e)));
                }
                Ok(_) => {}
                Err(e) => {
                    self.body_broken = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> Shared<IO> {
    /// Writes the owed [`CONTINUE`] the body waits for, then wakes the body.
    pub fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some(at) = self.continue_at {
            let Some(io) = self.io.as_mut() else { break };
            if at == CONTINUE.len() {
                ready!(Pin::new(io).poll_flush(cx))?;
                self.continue_at = None;
                break;
            }
            let n = ready!(Pin::new(io).poll_write(cx, &CONTINUE[at..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.continue_at = Some(at + n);
        }
        self.forgo_continue();
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> Shared<IO> {
    /// After the response: reads the rest of a body nobody read to its end from what is
    /// buffered and one read (hyper's `poll_drain_or_close_read`; an owed
    /// `100 Continue` is not sent). Whether the connection can take another request.
    pub fn drain(&mut self, cx: &mut Context<'_>) -> bool {
        self.forgo_continue();
        self.held = Bytes::new();
        self.ranges.clear();
        self.next = 0;
        let mut read_once = false;
        while !self.body_done && !self.body_broken {
            let Some(framing) = self.framing.as_mut() else {
                break;
            };
            if !self.buf.is_empty() {
                match framing.feed(&self.buf, |_| {}) {
                    Ok(fed) => {
                        let _ = self.buf.split_to(fed.used);
                        self.body_done = fed.done;
                        continue;
                    }
                    Err(_) => self.body_broken = true,
                }
                continue;
            }
            if read_once {
                break;
            }
            read_once = true;
            match self.poll_read(cx) {
                Poll::Ready(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        self.body_done && !self.body_broken
    }
}

/// A request body read from the connection.
pub struct RequestBody<IO> {
    conn: Conn<IO>,
    /// Known ended (without locking).
    ended: bool,
    hint: SizeHint,
}

impl<IO> RequestBody<IO> {
    pub fn new(conn: Conn<IO>, length: BodyLength) -> RequestBody<IO> {
        let hint = match length {
            BodyLength::Length(n) => SizeHint::with_exact(n),
            BodyLength::Chunked => SizeHint::default(),
        };
        RequestBody {
            conn,
            ended: false,
            hint,
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Body for RequestBody<IO> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let mut shared = lock(&this.conn);
        let polled = shared.poll_body(cx);
        if let Some(left) = shared.remaining {
            this.hint = SizeHint::with_exact(left);
        }
        if shared.body_done && shared.next >= shared.ranges.len() {
            this.ended = true;
        }
        polled.map(|o| o.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.hint.exact() == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}
