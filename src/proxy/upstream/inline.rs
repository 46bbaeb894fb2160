//! Plain-HTTP/1.1 upstream connections driven by the request that holds them.
//!
//! hyper's pooled client runs every upstream connection as a task of its own and hands
//! each response chunk to the client connection's task over a channel: per streamed event
//! a wake-up, often of a parked worker thread, and polls of two tasks. Here the connection
//! future travels with the request instead. The forwarding future polls it until the
//! response head is in; then the response body polls it before asking for each chunk. All
//! of it runs in the client connection's task, so an event goes from the upstream socket
//! to the client socket in one task poll (docs/PERFORMANCE.md has the measurements).
//!
//! The connection and the response body wake each other through hyper's channels (a chunk
//! for the body, "ready for more" for the connection), and both are polled by the same
//! task: such a wake, left to tokio, reschedules the task as if it had yielded, and tokio
//! rouses a parked worker thread for every yield, once per streamed event. Both are
//! therefore polled under a waker of their own ([`Nudge`]): a wake that arrives while
//! they are being polled makes the poller go round once more instead, and only wakes from
//! outside (the socket, a timer) reach the task.
//!
//! Each connection holds a slot of the upstream budget ([`super::slots`]) from its connect
//! to its close, idle or not: there are never more than `upstream.max_connections`.
//!
//! With `upstream.http1_relay` (the default) the connections are goodput's own
//! ([`super::relay`]): the response body reads the socket itself, and no channel or
//! waker stands between them. Without it they are hyper's client connections, driven as
//! above. The pool, its budget and its sweep are the same for both.
//!
//! A connection whose response ended cleanly goes back to a small pool. Nobody polls an
//! idle connection, so a sweep polls each one every second to notice an upstream that
//! closed it, and drops those idle for longer than `pool_idle_timeout`. A reused
//! connection that turns out to be closed before the request was written is replaced by
//! a fresh one, the request unchanged.
//!
//! On either kind of connection, a response head the client could not be given as it
//! means (an unasked-for 101, a transfer coding other than chunked) is refused with a 502
//! and its connection closed ([`forwardable`]).

use std::{
    future::{Future, poll_fn},
    pin::{Pin, pin},
    sync::{Arc, Mutex, PoisonError, Weak},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{
    HeaderValue, Request, Response, StatusCode, Uri,
    header::{HOST, TRANSFER_ENCODING},
    uri::Authority,
};
use http_body_util::{BodyExt, combinators::UnsyncBoxBody};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioIo};
use tower::Service;

use super::closed::Closed;
use super::{
    body::Source,
    client::StreamHold,
    error::ProxyError,
    relay::{self, Home, RawConn, SendError},
    request_body::{BodyFault, ClientBody},
    slots::{Got, Slot, Slots},
};
use crate::proxy::client_body::ClientSide;
use crate::proxy::wire::{Quiet, WireStream};
use crate::{
    BoxError,
    config::Upstream,
    measure::{ReadClock, RequestTap},
    usage_injection::ForwardBody,
};
use nudge::Nudge;
#[cfg(test)]
use nudge::ROUNDS;

/// Boxed: hyper's request queue allocates room for 32 requests per connection up front,
/// and the unboxed body would make that 13 KiB of heap per upstream connection instead of
/// 8 (resident memory hardly changes: only the slot in use is written).
pub type ReqBody = UnsyncBoxBody<Bytes, BoxError>;

/// How often idle connections are checked for closure and age.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The idle connections to one upstream and how to make new ones.
pub struct Pool {
    connector: HttpConnector,
    builder: http1::Builder,
    /// Where connections go, as a URI the connector understands.
    origin: Uri,
    /// The `Host` header for requests that do not carry one.
    host: HeaderValue,
    idle: Mutex<Vec<Idle>>,
    idle_timeout: Duration,
    max_idle: usize,
    /// The upstream budget, shared with hyper's client.
    slots: Arc<Slots>,
    sweeper: std::sync::OnceLock<()>,
    /// Connections are goodput's own ([`super::relay`]), not hyper's.
    relay: bool,
    /// `upstream.max_response_header_bytes`, for the relay's head parser.
    max_head: usize,
}

struct Idle {
    conn: Pooled,
    since: Instant,
}

impl Idle {
    /// Still open, ready for a request, and idle for less than `timeout` (a read attempt);
    /// otherwise why it is closed.
    fn usable(&mut self, timeout: Duration) -> Result<(), Closed> {
        if self.since.elapsed() >= timeout {
            return Err(Closed::IdleTimeout);
        }
        match self.conn.idle_state() {
            Quiet::Silent => Ok(()),
            Quiet::Closed => Err(Closed::ByUpstream),
            Quiet::Unsolicited => Err(Closed::UnsolicitedBytes),
        }
    }
}

/// A connection of either kind (one pool holds one kind).
#[expect(
    clippy::large_enum_variant,
    reason = "idle connections of one kind only; boxing hyper's would cost an allocation \
              per connection to save room in a list of at most pool_max_idle_per_host"
)]
enum Pooled {
    Hyper(Conn),
    Raw(RawConn),
}

impl Pooled {
    #[cfg(test)]
    fn reads(&self) -> &Arc<ReadClock> {
        match self {
            Pooled::Hyper(conn) => &conn.reads,
            Pooled::Raw(conn) => conn.reads(),
        }
    }

    fn idle_state(&mut self) -> Quiet {
        match self {
            Pooled::Hyper(conn) => conn.idle_state(),
            Pooled::Raw(conn) => conn.idle_state(),
        }
    }
}

type Driver = Connection<Stamped, ReqBody>;

/// One upstream connection: the handle requests are sent on, the future that does its I/O
/// (`None` once that has finished), the waker it is driven under, and when it last read.
struct Conn {
    send: SendRequest<ReqBody>,
    driver: Option<Driver>,
    nudge: Nudge,
    reads: Arc<ReadClock>,
    /// The connection ended because it read bytes while no request was outstanding.
    unsolicited: bool,
    /// Given back when the connection is dropped (closed).
    _slot: Slot,
}

impl Conn {
    fn new(send: SendRequest<ReqBody>, driver: Driver, reads: Arc<ReadClock>, slot: Slot) -> Conn {
        Conn {
            send,
            driver: Some(driver),
            nudge: Nudge::new(),
            reads,
            unsolicited: false,
            _slot: slot,
        }
    }

    /// Open and idle, ready for a request ([`Quiet::Silent`]). Checked with a waker that
    /// goes nowhere: an idle connection is looked at again when it is taken or swept,
    /// nobody waits on it. hyper ends an idle connection that reads bytes with an error of
    /// its own (no I/O source), and one that reads its end or fails with an I/O error.
    fn idle_state(&mut self) -> Quiet {
        let mut cx = Context::from_waker(Waker::noop());
        let open = drive(&mut self.driver, &mut self.unsolicited, &mut cx);
        if open && self.send.is_ready() {
            Quiet::Silent
        } else if self.unsolicited {
            Quiet::Unsolicited
        } else {
            Quiet::Closed
        }
    }

    /// Drives the connection, then polls `then` (the response, or its body), under the
    /// connection's own waker ([`Nudge`]).
    fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut then: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let (driver, unsolicited) = (&mut self.driver, &mut self.unsolicited);
        self.nudge.poll(cx, |cx| {
            // The connection first, so that what it read reaches the response or body.
            drive(driver, unsolicited, cx);
            then(cx)
        })
    }
}

/// Lets the connection read and write what it can; false once it has closed. Errors
/// reach the request or the body through hyper's own channels, so they are only logged
/// here; `unsolicited` is set when the connection ended on bytes read between responses.
fn drive(driver: &mut Option<Driver>, unsolicited: &mut bool, cx: &mut Context<'_>) -> bool {
    let Some(conn) = driver else {
        return false;
    };
    match Pin::new(conn).poll(cx) {
        Poll::Pending => true,
        Poll::Ready(done) => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "upstream connection ended with an error");
                *unsolicited = read_between_responses(&e);
            }
            *driver = None;
            false
        }
    }
}

/// hyper ends a client connection that reads bytes while no response is due with an error
/// of a kind it does not expose (`UnexpectedMessage`): the one with no I/O source that is
/// none of the kinds it does expose.
fn read_between_responses(e: &hyper::Error) -> bool {
    std::error::Error::source(e).is_none()
        && !(e.is_parse()
            || e.is_parse_status()
            || e.is_parse_too_large()
            || e.is_user()
            || e.is_canceled()
            || e.is_closed()
            || e.is_incomplete_message()
            || e.is_body_write_aborted()
            || e.is_timeout())
}

/// The upstream socket, noting in a [`ReadClock`] when each read's bytes arrived
/// ([`WireStream`]): the measured body stamps the frames of a read with its time (one
/// stamp per read, not per streamed event).
pub type Stamped = TokioIo<WireStream>;

impl Pool {
    /// `None` for upstreams this pool does not serve: TLS and HTTP/2 go through hyper's
    /// pooled client.
    pub fn for_upstream(cfg: &Upstream, slots: Arc<Slots>) -> Option<Arc<Pool>> {
        if cfg.http2 || cfg.scheme != http::uri::Scheme::HTTP {
            return None;
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let mut builder = http1::Builder::new();
        builder.max_buf_size(super::client::head_buffer(cfg));
        let origin = Uri::builder()
            .scheme(http::uri::Scheme::HTTP)
            .authority(cfg.authority.clone())
            .path_and_query("/")
            .build()
            .ok()?;
        let host = host_header(&cfg.authority)?;
        Some(Arc::new(Pool {
            connector,
            builder,
            origin,
            host,
            idle: Mutex::new(Vec::new()),
            idle_timeout: cfg.pool_idle_timeout,
            max_idle: cfg.pool_max_idle_per_host,
            slots,
            sweeper: std::sync::OnceLock::new(),
            relay: cfg.http1_relay,
            max_head: cfg.max_response_header_bytes,
        }))
    }

    /// Sends `req` (absolute URI, as built for the upstream) on an idle connection or a
    /// new one, and returns the response head with the connection its body runs on.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<ForwardBody<ClientBody<RequestTap<ClientSide>>>>,
        fault: &BodyFault,
    ) -> Result<(Response<Source>, Lease), ProxyError> {
        let mut req = req.map(BodyExt::boxed_unsync);
        req.headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.host.clone());
        *req.uri_mut() = origin_form(req.uri());
        if self.relay {
            return self.relay(req, fault).await;
        }
        // Set by the first connect that failed for want of descriptors: the pool wait
        // timeout from then on.
        let mut out_of_files = None;
        loop {
            let (conn, reused) = self.checkout(&mut out_of_files).await?;
            let Pooled::Hyper(mut conn) = conn else {
                continue;
            };
            let before = conn.reads.latest();
            let sent = conn.send.try_send_request(req);
            let mut sent = pin!(sent);
            let result = poll_fn(|cx| {
                let polled = conn.poll_with(cx, |cx| sent.as_mut().poll(cx));
                if polled.is_pending() && conn.reads.latest() != before {
                    // The upstream began to answer before the request body was complete:
                    // its clock starts at its first byte (see `request_body`).
                    fault.start_upstream_clock();
                }
                polled
            })
            .await;
            match result {
                Ok(resp) => {
                    forwardable(&resp)?;
                    let lease = Lease(Held::Conn {
                        conn,
                        pool: Arc::clone(self),
                    });
                    return Ok((resp.map(Source::Hyper), lease));
                }
                Err(mut e) => match e.take_message() {
                    // A pooled connection closed before the request went out: nothing
                    // was written, so another connection may carry it.
                    Some(unsent) if reused => {
                        tracing::debug!(error = %e.error(), "idle upstream connection was closed; retrying");
                        req = unsent;
                    }
                    _ => return Err(ProxyError::from_hyper(e.into_error(), self.max_head)),
                },
            }
        }
    }

    /// [`Pool::send`] on connections of goodput's own ([`super::relay`]).
    async fn relay(
        self: &Arc<Self>,
        req: Request<ReqBody>,
        fault: &BodyFault,
    ) -> Result<(Response<Source>, Lease), ProxyError> {
        let mut out = relay::outgoing(req);
        let mut out_of_files = None;
        loop {
            let (conn, reused) = self.checkout(&mut out_of_files).await?;
            let Pooled::Raw(conn) = conn else {
                continue;
            };
            let reads = Arc::clone(conn.reads());
            let home: Arc<dyn Home> = Arc::clone(self) as Arc<dyn Home>;
            match relay::send(conn, out, fault, home, self.max_head).await {
                Ok(resp) => {
                    forwardable(&resp)?;
                    return Ok((resp.map(Source::Relay), Lease(Held::Relay(reads))));
                }
                // A pooled connection closed before the request went out: nothing was
                // written, so another connection may carry it.
                Err(SendError::Unsent(unsent)) if reused => out = unsent,
                Err(SendError::Unsent(_)) => {
                    return Err(ProxyError::UpstreamFailed(
                        "upstream closed a new connection before the request".into(),
                    ));
                }
                Err(SendError::Failed(e)) => return Err(e),
            }
        }
    }

    /// An idle connection, else a new one; when the budget is spent, whichever comes
    /// first: a connection back in the pool or a slot given back. Whether it was reused.
    async fn checkout(
        self: &Arc<Self>,
        out_of_files: &mut Option<tokio::time::Instant>,
    ) -> Result<(Pooled, bool), ProxyError> {
        loop {
            match self.slots.take_or(|| self.take()).await? {
                Got::Other(conn) => return Ok((conn, true)),
                Got::Slot(slot) => match self.connect(slot).await {
                    Ok(conn) => return Ok((conn, false)),
                    // Out of descriptors: a pool wait like any other, not a failure.
                    Err(ProxyError::OutOfFiles(e)) => {
                        let until = *out_of_files
                            .get_or_insert_with(|| tokio::time::Instant::now() + self.slots.wait());
                        if self.slots.wait_for_files(until).await {
                            continue;
                        }
                        return Err(ProxyError::OutOfFiles(e));
                    }
                    Err(e) => return Err(e),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open and young enough. Each
    /// is checked (a read attempt) after the lock is let go.
    fn take(&self) -> Option<Pooled> {
        loop {
            let mut entry = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            match entry.usable(self.idle_timeout) {
                Ok(()) => return Some(entry.conn),
                Err(why) => self.closed(why),
            }
        }
    }

    async fn connect(self: &Arc<Self>, slot: Slot) -> Result<Pooled, ProxyError> {
        let io = self
            .connector
            .clone()
            .call(self.origin.clone())
            .await
            .map_err(|e| ProxyError::connect(Box::new(e)))?;
        let reads = Arc::new(ReadClock::new());
        let wire = WireStream::new(io.into_inner(), Arc::clone(&reads));
        self.start_sweeping();
        if self.relay {
            return Ok(Pooled::Raw(RawConn::new(wire, reads, slot)));
        }
        let (send, driver) = self
            .builder
            .handshake(TokioIo::new(wire))
            .await
            .map_err(|e| ProxyError::Unreachable(Box::new(e)))?;
        Ok(Pooled::Hyper(Conn::new(send, driver, reads, slot)))
    }

    fn put(&self, conn: Pooled) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
            drop(idle);
            self.slots.returned();
        } else {
            drop(idle);
            self.closed(Closed::PoolFull);
        }
    }

    /// Counts a connection the pool closed, by why.
    fn closed(&self, why: Closed) {
        self.slots.limits().upstream_closed(why.as_str());
    }

    /// Drops idle connections that closed or aged out. They are checked (a read attempt
    /// each) with the lock let go, so that requests taking or returning a connection
    /// meanwhile do not wait for the sweep; connections returned meanwhile were used more
    /// recently and go after the checked ones.
    fn sweep(&self) {
        let mut kept =
            std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        kept.retain_mut(|entry| match entry.usable(self.idle_timeout) {
            Ok(()) => true,
            Err(why) => {
                self.closed(why);
                false
            }
        });
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        kept.append(&mut idle);
        // Over the limit only if connections came back during the check: the oldest go.
        let excess: Vec<Idle> = kept
            .drain(..kept.len().saturating_sub(self.max_idle))
            .collect();
        *idle = kept;
        drop(idle);
        // Closed after the lock is let go.
        for _ in &excess {
            self.closed(Closed::PoolFull);
        }
        drop(excess);
    }

    /// One sweeping task per pool, started with its first connection (inside the
    /// runtime) and ended when the pool is dropped, e.g. replaced on a config reload.
    fn start_sweeping(self: &Arc<Self>) {
        self.sweeper.get_or_init(|| {
            let pool: Weak<Pool> = Arc::downgrade(self);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match pool.upgrade() {
                        Some(pool) => pool.sweep(),
                        None => break,
                    }
                }
            });
        });
    }
}

impl Home for Pool {
    fn put_back(&self, conn: RawConn) {
        self.put(Pooled::Raw(conn));
    }

    fn unsolicited(&self) {
        self.closed(Closed::UnsolicitedBytes);
    }
}

/// Refuses a response head that cannot be passed on as it means: a 101, since nothing
/// sent on this pool asks for an upgrade (upgrades go through hyper's client), and a
/// transfer coding other than one `chunked`, since the client would get the coded payload
/// with its `Transfer-Encoding` (a hop-by-hop field) taken off. Refused, the response is
/// dropped and its connection with it.
fn forwardable<B>(resp: &Response<B>) -> Result<(), ProxyError> {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        return Err(ProxyError::BadResponse(
            "101 Switching Protocols to a request without an upgrade",
        ));
    }
    let mut codings = resp
        .headers()
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    match codings.next() {
        None => Ok(()),
        Some(coding) if coding.eq_ignore_ascii_case(b"chunked") && codings.next().is_none() => {
            Ok(())
        }
        Some(_) => Err(ProxyError::BadResponse(
            "a transfer coding other than chunked",
        )),
    }
}

/// `Host` as hyper's client would write it: the authority without a default port.
fn host_header(authority: &Authority) -> Option<HeaderValue> {
    let value = match authority.port_u16() {
        Some(80) | None => authority.host().to_owned(),
        Some(port) => format!("{}:{port}", authority.host()),
    };
    HeaderValue::from_str(&value).ok()
}

/// The request target of an HTTP/1.1 request to an origin server: path and query only.
fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(pq) if pq.as_str() != "/" => {
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(pq.clone());
            Uri::from_parts(parts).unwrap_or_default()
        }
        _ => Uri::default(),
    }
}

mod lease;
mod nudge;
use lease::Held;
pub use lease::Lease;
#[cfg(test)]
mod tests;
