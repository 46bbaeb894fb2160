//! A misbehaving fake upstream: an HTTP/1.1 server over raw tokio TCP for integration tests.
//!
//! goodput must forward bytes unchanged and without delay, and propagate failures faithfully
//! (an upstream reset is a reset for the client; a client that goes away cancels the upstream
//! request). Testing that needs an upstream whose bytes *and socket* the test controls, which a
//! hyper server would hide: it re-frames bodies, coalesces writes and never sends an RST on
//! purpose. So this server parses requests itself and answers each one with a [`Script`]:
//! a list of [`Step`]s that write exact bytes, sleep, reset, close, or stall.
//!
//! - Every request is parsed (request line, headers, body by `Content-Length` or decoded
//!   chunked coding) and recorded as a [`Received`] *before* its script runs, so a test can
//!   wait for it while the response is still stalled. A request that cannot be framed is
//!   answered with a 400 (431 for a head over 64 KiB) and `connection: close`, and not
//!   recorded.
//! - A connection carries any number of keep-alive requests; each is served with the script
//!   again, as long as the previous script ran to its end without a reset, close or stall.
//! - While a script sleeps, stalls or writes, the server watches for the peer going away (EOF,
//!   including a half-close, or an error) and records when it did
//!   ([`FakeUpstream::wait_client_close`]), which is how tests check that the proxy cancels
//!   the upstream request when its client aborts. The script then ends there.
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
use tokio::sync::watch;
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

/// What the server does after it has received a request, step by step.
///
/// If every step runs (no [`Step::Reset`], [`Step::Close`] or [`Step::Stall`]), the
/// connection stays open for the next request, unless the
/// request asked for `Connection: close`. The script is not checked against HTTP: a response
/// whose framing is wrong or incomplete is exactly what some tests want.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// The steps, run in order.
    pub steps: Vec<Step>,
}

/// One thing the server does while answering a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write these bytes exactly, in one `write_all`, then flush. If the peer is already
    /// gone (or the write fails) the close is recorded and the script ends.
    Write(Bytes),
    /// Wait this long (watching for the peer going away meanwhile).
    Sleep(Duration),
    /// Abort the connection with an RST: `SO_LINGER` 0, then drop the socket.
    Reset,
    /// Orderly close: shut down the write side (FIN), then drop the socket.
    Close,
    /// Never answer further; keep the socket open until the peer closes it, and record that.
    Stall,
}

/// How [`Script::sse_chunked`] cuts the event bytes into HTTP chunks (one write each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WritePlan {
    /// One chunk per event.
    Whole,
    /// Every byte its own chunk and its own write: maximal fragmentation.
    Bytes1,
    /// Cut the concatenated events at these byte offsets (sorted and deduplicated here;
    /// offsets at 0 or past the end add nothing): events split across chunk boundaries.
    SplitAt(Vec<usize>),
    /// This many events per chunk (0 counts as 1); the last chunk may hold fewer.
    Coalesced(usize),
}

impl Script {
    /// A script of these steps.
    pub fn new(steps: Vec<Step>) -> Script {
        Script { steps }
    }

    /// This script with `step` appended.
    pub fn then(mut self, step: Step) -> Script {
        self.steps.push(step);
        self
    }

    /// This script with a [`Step::Sleep`] of `delay` first: a slow first byte.
    pub fn delayed(mut self, delay: Duration) -> Script {
        self.steps.insert(0, Step::Sleep(delay));
        self
    }

    /// A complete response in one write: status line, `headers` in order, then
    /// `content-length` (left out if `headers` already has `content-length` or
    /// `transfer-encoding`, or the status is 1xx or 204), the empty line and `body`.
    pub fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Script {
        let mut out = format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status)).into_bytes();
        let mut framed = (100..200).contains(&status) || status == 204;
        for (name, value) in headers {
            framed |= name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding");
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if !framed {
            out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        Script::new(vec![Step::Write(Bytes::from(out))])
    }

    /// A chunked SSE response: [`SSE_HEAD`] (`200 OK`, `content-type: text/event-stream`,
    /// `transfer-encoding: chunked`), the concatenated `events` as chunks cut by `write_plan`,
    /// then [`LAST_CHUNK`]. Each of these is its own write; `gap` is slept before every write
    /// after the head (nothing is slept when `gap` is zero). Empty pieces are skipped, since
    /// an empty chunk would end the body.
    pub fn sse_chunked(
        events: &[impl AsRef<[u8]>],
        write_plan: WritePlan,
        gap: Duration,
    ) -> Script {
        let mut steps = vec![Step::Write(Bytes::from_static(SSE_HEAD))];
        let chunks = plan_pieces(events, &write_plan)
            .into_iter()
            .map(|piece| http_chunk(&piece))
            .chain([Bytes::from_static(LAST_CHUNK)]);
        for chunk in chunks {
            if !gap.is_zero() {
                steps.push(Step::Sleep(gap));
            }
            steps.push(Step::Write(chunk));
        }
        Script::new(steps)
    }

    /// [`SSE_HEAD`], the first `n_before` events one chunk each, then [`Step::Close`]: an
    /// orderly close without the last chunk (a truncated body).
    pub fn sse_then_close(events: &[impl AsRef<[u8]>], n_before: usize) -> Script {
        Self::sse_prefix(events, n_before).then(Step::Close)
    }

    /// [`SSE_HEAD`], one SSE comment event ([`SSE_COMMENT`]) as a chunk, then
    /// [`Step::Stall`]: headers arrive, tokens never do.
    pub fn stall_after_head() -> Script {
        Script::new(vec![
            Step::Write(Bytes::from_static(SSE_HEAD)),
            Step::Write(http_chunk(SSE_COMMENT)),
            Step::Stall,
        ])
    }

    /// Reads the request and never answers ([`Step::Stall`]), recording when the client
    /// gives up: for response-header timeout tests.
    pub fn no_response() -> Script {
        Script::new(vec![Step::Stall])
    }

    fn sse_prefix(events: &[impl AsRef<[u8]>], n_before: usize) -> Script {
        let mut steps = vec![Step::Write(Bytes::from_static(SSE_HEAD))];
        steps.extend(
            events
                .iter()
                .take(n_before)
                .map(|event| event.as_ref())
                .filter(|event| !event.is_empty())
                .map(|event| Step::Write(http_chunk(event))),
        );
        Script::new(steps)
    }
}

/// `data` framed as one HTTP/1.1 chunk: lowercase hex size, CRLF, data, CRLF.
pub fn http_chunk(data: &[u8]) -> Bytes {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// Decodes a complete chunked body (chunk extensions and trailers allowed, then ignored).
/// Returns the data and how many input bytes the body took, or `None` when `input` is
/// malformed or ends before the last chunk and its trailer section.
pub fn decode_chunked(input: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut data = Vec::new();
    let mut pos = 0;
    loop {
        let line = take_line(input, &mut pos)?;
        let size = parse_chunk_size(line)?;
        if size == 0 {
            // Trailer section: field lines up to an empty line.
            while !take_line(input, &mut pos)?.is_empty() {}
            return Some((data, pos));
        }
        let end = pos.checked_add(size)?;
        data.extend_from_slice(input.get(pos..end)?);
        pos = end;
        if !take_line(input, &mut pos)?.is_empty() {
            return None;
        }
    }
}

/// Realistic OpenAI `chat.completion.chunk` stream events, each `data: {...}\n\n`: the
/// role-only first chunk (`"content":""`, not a token), `n_tokens` content chunks
/// (`"tok0 "`, `"tok1 "`, ...) the last of which has `"finish_reason":"stop"` (with no
/// tokens, one empty-delta chunk carries it), with `with_usage` a usage-only chunk
/// (`"choices":[]`, `prompt_tokens` 7, `completion_tokens` `n_tokens`), then `data: [DONE]`.
pub fn openai_chat_events(n_tokens: usize, with_usage: bool) -> Vec<Vec<u8>> {
    const PREFIX: &str =
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","#;
    let event = |json: String| format!("data: {json}\n\n").into_bytes();
    let mut events = vec![event(format!(
        r#"{PREFIX}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}"#
    ))];
    for i in 0..n_tokens {
        let finish = if i + 1 == n_tokens {
            r#""stop""#
        } else {
            "null"
        };
        events.push(event(format!(
            r#"{PREFIX}"choices":[{{"index":0,"delta":{{"content":"tok{i} "}},"finish_reason":{finish}}}]}}"#
        )));
    }
    if n_tokens == 0 {
        events.push(event(format!(
            r#"{PREFIX}"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}]}}"#
        )));
    }
    if with_usage {
        let total = n_tokens + 7;
        events.push(event(format!(
            r#"{PREFIX}"choices":[],"usage":{{"prompt_tokens":7,"completion_tokens":{n_tokens},"total_tokens":{total}}}}}"#
        )));
    }
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// The standard reason phrase, or `Unknown`.
fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// The pieces (chunk payloads) `plan` cuts `events` into, empty pieces left out.
fn plan_pieces(events: &[impl AsRef<[u8]>], plan: &WritePlan) -> Vec<Vec<u8>> {
    let all: Vec<u8> = events
        .iter()
        .flat_map(|e| e.as_ref().iter().copied())
        .collect();
    let pieces: Vec<Vec<u8>> = match plan {
        WritePlan::Whole => events.iter().map(|e| e.as_ref().to_vec()).collect(),
        WritePlan::Bytes1 => all.iter().map(|b| vec![*b]).collect(),
        WritePlan::SplitAt(offsets) => {
            let mut cuts: Vec<usize> = offsets.iter().map(|o| (*o).min(all.len())).collect();
            cuts.push(all.len());
            cuts.sort_unstable();
            cuts.dedup();
            let mut start = 0;
            cuts.into_iter()
                .map(|cut| {
                    let piece = all.get(start..cut).unwrap_or_default().to_vec();
                    start = cut;
                    piece
                })
                .collect()
        }
        WritePlan::Coalesced(n) => events
            .chunks((*n).max(1))
            .map(|group| {
                group
                    .iter()
                    .flat_map(|e| e.as_ref().iter().copied())
                    .collect()
            })
            .collect(),
    };
    pieces.into_iter().filter(|p| !p.is_empty()).collect()
}

/// Takes one CRLF-terminated line from `input` at `pos`, advancing past the CRLF.
fn take_line<'a>(input: &'a [u8], pos: &mut usize) -> Option<&'a [u8]> {
    let rest = input.get(*pos..)?;
    let len = rest.windows(2).position(|w| w == b"\r\n")?;
    *pos += len + 2;
    rest.get(..len)
}

/// The size of a chunk-size line (`1a;ext=x`), rejecting anything that is not hex.
fn parse_chunk_size(line: &[u8]) -> Option<usize> {
    let size = line.split(|b| *b == b';').next()?;
    let size = std::str::from_utf8(size).ok()?.trim_matches([' ', '\t']);
    if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    usize::from_str_radix(size, 16).ok()
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        // Reap finished connections so the set does not grow over a long test.
        while conns.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(_) => {
                // Out of descriptors or similar: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Each scripted write should leave as its own segment, at once.
        let _ = stream.set_nodelay(true);
        let index = shared.connections.fetch_add(1, Ordering::SeqCst);
        conns.spawn(
            Conn {
                stream,
                buf: BytesMut::with_capacity(8 * 1024),
                index,
                shared: Arc::clone(&shared),
            }
            .serve(),
        );
    }
}

/// Why reading a request stopped.
enum ReadError {
    /// The peer went away (EOF or an I/O error) part way through a request.
    Gone,
    /// The request is not HTTP/1.1 we can frame: answer with this status and close.
    Malformed(u16),
}

/// What to do with the connection after a script.
enum Flow {
    KeepAlive,
    Done,
}

struct Conn {
    stream: TcpStream,
    /// Bytes read but not yet parsed (a pipelined next request, say).
    buf: BytesMut,
    index: usize,
    shared: Arc<Shared>,
}

impl Conn {
    async fn serve(mut self) {
        loop {
            let (received, head_at, wants_close) = match self.read_request().await {
                Ok(Some(request)) => request,
                // Idle close between requests: nothing was pending.
                Ok(None) => return,
                Err(ReadError::Gone) => return,
                Err(ReadError::Malformed(status)) => {
                    let answer = Script::response(status, &[("connection", "close")], b"");
                    for step in answer.steps {
                        if let Step::Write(bytes) = step {
                            let _ = self.stream.write_all(&bytes).await;
                        }
                    }
                    self.close().await;
                    return;
                }
            };
            let mut nth = 0;
            self.shared.requests.send_modify(|requests| {
                nth = requests.len();
                requests.push(received);
            });
            let script = match self.shared.scripts.get(nth).or(self.shared.scripts.last()) {
                Some(script) => script.clone(),
                None => Script::no_response(),
            };
            match self.run(&script, head_at).await {
                Flow::KeepAlive if !wants_close => {}
                Flow::KeepAlive => {
                    self.close().await;
                    return;
                }
                Flow::Done => return,
            }
        }
    }

    /// Runs `script` for the request whose head arrived at `head_at`.
    async fn run(&mut self, script: &Script, head_at: Instant) -> Flow {
        for step in &script.steps {
            match step {
                Step::Write(bytes) => {
                    // A write to a peer that already left usually still succeeds (the kernel
                    // answers with an RST only afterwards), so look before writing.
                    if self.peer_gone_now() {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                    let written = match self.stream.write_all(bytes).await {
                        Ok(()) => self.stream.flush().await,
                        Err(e) => Err(e),
                    };
                    if written.is_err() {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                }
                Step::Sleep(duration) => {
                    if !self.sleep_watching(*duration).await {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                }
                Step::Reset => {
                    // SO_LINGER 0 makes the drop that follows (Flow::Done) send an RST.
                    let _ = self.stream.set_zero_linger();
                    return Flow::Done;
                }
                Step::Close => {
                    self.close().await;
                    return Flow::Done;
                }
                Step::Stall => {
                    self.wait_peer_gone().await;
                    self.record_close(head_at);
                    return Flow::Done;
                }
            }
        }
        Flow::KeepAlive
    }

    /// Sleeps for `duration` while reading (and keeping) whatever the peer sends. Returns
    /// false as soon as the peer has gone away.
    async fn sleep_watching(&mut self, duration: Duration) -> bool {
        let deadline = tokio::time::sleep(duration);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return true,
                read = self.stream.read_buf(&mut self.buf) => match read {
                    Ok(0) | Err(_) => return false,
                    Ok(_) => {}
                },
            }
        }
    }

    /// Whether the peer has already closed or reset, without waiting. Bytes it sent
    /// meanwhile are kept for the next request.
    fn peer_gone_now(&mut self) -> bool {
        loop {
            match self.stream.try_read_buf(&mut self.buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    /// Reads and discards until EOF or an error.
    async fn wait_peer_gone(&mut self) {
        loop {
            self.buf.clear();
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Orderly close: FIN, then drop what already arrived unread so that dropping the socket
    /// does not turn the close into an RST.
    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
        let mut sink = [0u8; 4096];
        while matches!(self.stream.try_read(&mut sink), Ok(n) if n > 0) {}
    }

    fn record_close(&self, head_at: Instant) {
        let after = head_at.elapsed();
        self.shared.closes.send_modify(|closes| closes.push(after));
    }

    /// Reads more bytes into the buffer; false on EOF or error.
    async fn fill(&mut self) -> bool {
        matches!(self.stream.read_buf(&mut self.buf).await, Ok(n) if n > 0)
    }

    /// Reads one request. `Ok(None)` when the peer closed cleanly before sending a byte of it.
    /// Returns the request, when its head arrived, and whether the connection should close
    /// after the response.
    async fn read_request(&mut self) -> Result<Option<(Received, Instant, bool)>, ReadError> {
        let head_len = loop {
            // A server should ignore empty lines before a request line (RFC 9112, 2.2).
            while self.buf.starts_with(b"\r\n") {
                self.buf.advance(2);
            }
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end + 4;
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(ReadError::Malformed(431));
            }
            if !self.fill().await {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Gone)
                };
            }
        };
        let head_at = Instant::now();
        let raw_head = self.buf.split_to(head_len).to_vec();
        let head = parse_head(&raw_head, self.index).ok_or(ReadError::Malformed(400))?;
        let body = match body_framing(&head)? {
            Framing::None => Ok(Vec::new()),
            Framing::Length(len) => self.read_exact(len).await,
            Framing::Chunked => self.read_chunked().await,
        };
        let body = match body {
            Ok(body) => body,
            Err(e) => {
                if matches!(e, ReadError::Gone) {
                    // The head arrived, so the response was pending when the peer left.
                    self.record_close(head_at);
                }
                return Err(e);
            }
        };
        let wants_close = wants_close(&head);
        Ok(Some((
            Received {
                body,
                raw_head,
                ..head
            },
            head_at,
            wants_close,
        )))
    }

    async fn read_exact(&mut self, len: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < len {
            if !self.fill().await {
                return Err(ReadError::Gone);
            }
        }
        Ok(self.buf.split_to(len).to_vec())
    }

    async fn read_line(&mut self) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.buf.split_to(end).to_vec();
                self.buf.advance(2);
                return Ok(line);
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(ReadError::Malformed(400));
            }
            if !self.fill().await {
                return Err(ReadError::Gone);
            }
        }
    }

    async fn read_chunked(&mut self) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line().await?;
            let size = parse_chunk_size(&line).ok_or(ReadError::Malformed(400))?;
            if size == 0 {
                // Trailer fields, up to the empty line, are read and dropped.
                while !self.read_line().await?.is_empty() {}
                return Ok(body);
            }
            body.extend_from_slice(&self.read_exact(size).await?);
            if !self.read_line().await?.is_empty() {
                return Err(ReadError::Malformed(400));
            }
        }
    }
}

/// How a request body is delimited.
enum Framing {
    None,
    Length(usize),
    Chunked,
}

/// Chooses the body framing as RFC 9112 section 6.3 says: chunked transfer coding wins over
/// `Content-Length`; any other transfer coding, or disagreeing lengths, is a 400.
fn body_framing(head: &Received) -> Result<Framing, ReadError> {
    let codings = head.header_all("transfer-encoding");
    if !codings.is_empty() {
        let last = codings
            .iter()
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .rfind(|coding| !coding.is_empty());
        return match last {
            Some(coding) if coding.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
            _ => Err(ReadError::Malformed(400)),
        };
    }
    let mut length = None;
    for value in head
        .header_all("content-length")
        .iter()
        .flat_map(|v| v.split(','))
    {
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ReadError::Malformed(400));
        }
        let parsed: usize = value.parse().map_err(|_| ReadError::Malformed(400))?;
        if length.is_some_and(|known| known != parsed) {
            return Err(ReadError::Malformed(400));
        }
        length = Some(parsed);
    }
    Ok(match length {
        None | Some(0) => Framing::None,
        Some(len) => Framing::Length(len),
    })
}

/// Whether the connection ends after this request: `Connection: close`, or HTTP/1.0
/// without `Connection: keep-alive`.
fn wants_close(head: &Received) -> bool {
    let has_token = |token: &str| {
        head.header_all("connection")
            .iter()
            .flat_map(|value| value.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    has_token("close") || (head.version == "HTTP/1.0" && !has_token("keep-alive"))
}

/// Parses a request head (request line through the empty line) into a [`Received`] with an
/// empty body and `raw_head`. `None` when it is not an HTTP/1.x request head.
fn parse_head(raw: &[u8], connection: usize) -> Option<Received> {
    let mut lines = raw
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = std::str::from_utf8(lines.next()?).ok()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || target.is_empty()
        || !version.starts_with("HTTP/1.")
    {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines.take_while(|l| !l.is_empty()) {
        let colon = line.iter().position(|b| *b == b':')?;
        let (name, value) = (line.get(..colon)?, line.get(colon + 1..)?);
        // Whitespace in or before a name (including obsolete line folding) is rejected.
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return None;
        }
        let name = std::str::from_utf8(name).ok()?.to_ascii_lowercase();
        let value = String::from_utf8_lossy(value)
            .trim_matches([' ', '\t'])
            .to_owned();
        headers.push((name, value));
    }
    Some(Received {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
        body: Vec::new(),
        raw_head: Vec::new(),
        connection,
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
