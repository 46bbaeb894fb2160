//! A misbehaving fake upstream: an HTTP/1.1 server over raw tokio TCP for integration tests.
//!
//! goodput must forward bytes unchanged and without delay, and propagate failures faithfully
//! (an upstream reset is a reset for the client; a client that goes away cancels the upstream
//! request). Testing that needs an upstream whose bytes *and socket* the test controls, which a
//! hyper server would hide: it re-frames bodies, coalesces writes and never sends an RST on
//! purpose. So this server parses requests itself and answers each one with a [`Script`]:
//! a list of [`Step`]s that write exact bytes, pause, reset, close, stall, hold until the
//! test releases them, or answer before the request body.
//!
//! - Every request is parsed (request line, headers, body by `Content-Length` or decoded
//!   chunked coding) and recorded as a [`Received`] *before* its script runs, so a test can
//!   wait for it while the response is still stalled. A request that cannot be framed is
//!   answered with a 400 (431 for a head over 64 KiB) and `connection: close`, and not
//!   recorded.
//! - A connection carries any number of keep-alive requests; each is served with the script
//!   again, as long as the previous script ran to its end without a reset, close or stall.
//! - While a script pauses, stalls or writes, the server watches for the peer going away (EOF,
//!   including a half-close, or an error) and records when it did
//!   ([`FakeUpstream::wait_client_close`]), which is how tests check that the proxy cancels
//!   the upstream request when its client aborts. The script then ends there.
//! - A test can order what happens on an idle connection: a script holds at [`Step::Hold`]
//!   until [`FakeUpstream::release`], and [`FakeUpstream::wait_scripts_ended`] says when
//!   scripts have written everything.
//! - Sockets use `TCP_NODELAY`, so each [`Step::Write`] leaves as its own segment and a
//!   dribbled stream stays dribbled.
//! - Everything listens on `127.0.0.1:0`; dropping the [`FakeUpstream`] aborts its accept task
//!   and, with it, every connection task.
//!
//! Script helpers build the common shapes: [`Script::response`], [`Script::sse_chunked`]
//! (with a [`WritePlan`] choosing the chunk boundaries), [`Script::sse_then_close`], [`Script::stall_after_head`] and [`Script::no_response`];
//! [`openai_chat_events`] makes realistic OpenAI chat-completion stream events.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Largest request head accepted; a bigger one is answered with 431 and the connection closed.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The head [`Script::sse_chunked`] and its siblings send.
pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// The last chunk of a chunked body, with no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The SSE comment [`Script::stall_after_head`] sends after the head.
pub const SSE_COMMENT: &[u8] = b": keep-alive\n\n";

/// A running fake upstream. Dropping it stops the server and all of its connections.
pub struct FakeUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// How many client closes [`FakeUpstream::wait_client_close`] has already handed out.
    closes_taken: AtomicUsize,
    accept: JoinHandle<()>,
}

/// State the connection tasks publish and the test reads.
struct Shared {
    requests: watch::Sender<Vec<Received>>,
    closes: watch::Sender<Vec<Duration>>,
    connections: AtomicUsize,
    /// Connections open now, and the most open at once.
    open: AtomicUsize,
    max_open: AtomicUsize,
    /// How many scripts have ended (run to their end, or cut short by a reset, a close,
    /// a stall that ended or the peer going away).
    finished: watch::Sender<usize>,
    /// Permits for [`Step::Hold`], one per [`FakeUpstream::release`].
    released: Semaphore,
    /// Script for the n-th request (counted over all connections); the last one repeats.
    scripts: Vec<Script>,
}

impl FakeUpstream {
    /// Starts a server on `127.0.0.1:0` that answers every request with `script`.
    ///
    /// Panics when the loopback port cannot be bound (a broken test environment).
    pub async fn start(script: Script) -> FakeUpstream {
        Self::start_sequence(vec![script]).await
    }

    /// Starts a server whose n-th request (counted from 0 over all connections, in the order
    /// requests were completely received) is answered with `scripts[n]`; once the list is
    /// used up its last script answers every further request. An empty list answers nothing
    /// (every request stalls). For retry tests: first a 503, then a stream.
    ///
    /// Panics when the loopback port cannot be bound (a broken test environment).
    #[expect(
        clippy::expect_used,
        reason = "test fixture: failing to bind 127.0.0.1:0 means the test cannot run at all"
    )]
    pub async fn start_sequence(scripts: Vec<Script>) -> FakeUpstream {
        Self::try_start_sequence(scripts)
            .await
            .expect("fake upstream: bind 127.0.0.1:0")
    }

    /// [`FakeUpstream::start_sequence`], returning the bind error instead of panicking.
    pub async fn try_start_sequence(scripts: Vec<Script>) -> io::Result<FakeUpstream> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            requests: watch::Sender::new(Vec::new()),
            closes: watch::Sender::new(Vec::new()),
            connections: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            max_open: AtomicUsize::new(0),
            finished: watch::Sender::new(0),
            released: Semaphore::new(0),
            scripts,
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(FakeUpstream {
            addr,
            shared,
            closes_taken: AtomicUsize::new(0),
            accept,
        })
    }

    /// The address the server listens on (always on 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request completely received so far, in arrival order.
    pub async fn requests(&self) -> Vec<Received> {
        self.shared.requests.borrow().clone()
    }

    /// Waits until at least `n` requests have been received or `timeout` has passed, then
    /// returns every request received so far (fewer than `n` on timeout: assert the length).
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let mut rx = self.shared.requests.subscribe();
        // Only the wait is bounded; a timeout is reported through the returned length.
        let reached = tokio::time::timeout(timeout, rx.wait_for(|reqs| reqs.len() >= n)).await;
        drop(reached);
        self.shared.requests.borrow().clone()
    }

    /// Waits for the peer to close (read EOF, reset, or a failed write) a connection on which
    /// a response was in progress or pending: after a request head arrived and before its
    /// script ended. Returns how long after that request head arrived the close was seen, or
    /// `None` on timeout.
    ///
    /// Each call hands out the next close not returned by an earlier call, in the order they
    /// were seen. Closes between requests (an idle keep-alive connection going away) are not
    /// counted; end a script with [`Step::Stall`] to watch for a close after the response
    /// was written completely.
    pub async fn wait_client_close(&self, timeout: Duration) -> Option<Duration> {
        let index = self.closes_taken.load(Ordering::SeqCst);
        let mut rx = self.shared.closes.subscribe();
        let seen = tokio::time::timeout(timeout, rx.wait_for(|closes| closes.len() > index))
            .await
            .ok()?
            .ok()?
            .get(index)
            .copied();
        if seen.is_some() {
            self.closes_taken.store(index + 1, Ordering::SeqCst);
        }
        seen
    }

    /// Every client close seen so far (see [`FakeUpstream::wait_client_close`]), in order,
    /// whether or not it was already handed out.
    pub fn client_closes(&self) -> Vec<Duration> {
        self.shared.closes.borrow().clone()
    }

    /// How many TCP connections were accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// The most connections that were open at once.
    pub fn max_open_connections(&self) -> usize {
        self.shared.max_open.load(Ordering::SeqCst)
    }

    /// Lets one script waiting at a [`Step::Hold`] (now or later) go on.
    pub fn release(&self) {
        self.shared.released.add_permits(1);
    }

    /// Waits until at least `n` scripts have ended (every step written, or the script
    /// cut short) or `timeout` has passed; returns how many have ended. A script's writes
    /// have left the socket by then: on loopback they are in the proxy's receive queue.
    pub async fn wait_scripts_ended(&self, n: usize, timeout: Duration) -> usize {
        let mut rx = self.shared.finished.subscribe();
        // Only the wait is bounded; a timeout is reported through the returned count.
        let reached = tokio::time::timeout(timeout, rx.wait_for(|ended| *ended >= n)).await;
        drop(reached);
        *self.shared.finished.borrow()
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        // The accept task owns the JoinSet of connection tasks: dropping it aborts them all.
        self.accept.abort();
    }
}

/// One request as the fake upstream received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Request method as sent, e.g. `POST`.
    pub method: String,
    /// Request target as sent, e.g. `/v1/chat/completions?x=1`.
    pub target: String,
    /// HTTP version as sent, e.g. `HTTP/1.1`.
    pub version: String,
    /// Header fields in the order received; names lowercased, values with surrounding
    /// whitespace removed (lossy UTF-8).
    pub headers: Vec<(String, String)>,
    /// The body: `Content-Length` bytes, or the decoded chunked body without trailers.
    pub body: Vec<u8>,
    /// The request head byte for byte, from the request line through the empty line.
    pub raw_head: Vec<u8>,
    /// Index (from 0) of the accepted connection it arrived on, in accept order.
    pub connection: usize,
}

impl Received {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name` (any case), in the order received.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as (lossy) UTF-8 text.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

mod script;
pub use script::*;
mod conn;
use conn::accept_loop;
