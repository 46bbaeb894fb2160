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
//! A connection whose response ended cleanly goes back to a small pool. Nobody polls an
//! idle connection, so a sweep polls each one every second to notice an upstream that
//! closed it, and drops those idle for longer than `pool_idle_timeout`. A reused
//! connection that turns out to be closed before the request was written is replaced by
//! a fresh one, the request unchanged.

use std::{
    future::{Future, poll_fn},
    pin::{Pin, pin},
    sync::{Arc, Mutex, PoisonError, Weak},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header::HOST, uri::Authority};
use http_body_util::{BodyExt, combinators::UnsyncBoxBody};
use hyper::{
    body::Incoming,
    client::conn::http1::{self, Connection, SendRequest},
};
use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioIo};
use tokio::net::TcpStream;
use tower::Service;

use super::{error::ProxyError, inject::ForwardBody};
use crate::{config::Upstream, measure::RequestTap};

/// Boxed: hyper's request queue allocates room for 32 requests per connection up front,
/// and the unboxed body would make that 13 KiB of heap per upstream connection instead of
/// 8 (resident memory hardly changes: only the slot in use is written).
pub type ReqBody = UnsyncBoxBody<Bytes, hyper::Error>;

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
    sweeper: std::sync::OnceLock<()>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// One upstream connection: the handle requests are sent on, and the future that does
/// its I/O (`None` once that has finished).
struct Conn {
    send: SendRequest<ReqBody>,
    driver: Option<Connection<TokioIo<TcpStream>, ReqBody>>,
}

impl Conn {
    /// Lets the connection read and write what it can; false once it has closed. Errors
    /// reach the request or the body through hyper's own channels, so they are only
    /// logged here.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = &mut self.driver else {
            return false;
        };
        match Pin::new(driver).poll(cx) {
            Poll::Pending => true,
            Poll::Ready(done) => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
                self.driver = None;
                false
            }
        }
    }

    /// Open and idle, ready for a request.
    fn reusable(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx) && self.send.is_ready()
    }
}

/// A connection on loan to one response: the body drives it and hands it back.
pub struct Lease {
    conn: Conn,
    pool: Arc<Pool>,
}

impl Lease {
    /// Drives the connection so that the response body's next bytes can arrive.
    pub fn drive(&mut self, cx: &mut Context<'_>) {
        self.conn.drive(cx);
    }

    /// The response body has ended: the connection goes back to the pool if it can carry
    /// another request, and is closed otherwise.
    pub fn release(mut self, cx: &mut Context<'_>) {
        if self.conn.reusable(cx) {
            self.pool.put(self.conn);
        }
    }
}

impl Pool {
    /// `None` for upstreams this pool does not serve: TLS and HTTP/2 go through hyper's
    /// pooled client.
    pub fn for_upstream(cfg: &Upstream) -> Option<Arc<Pool>> {
        if cfg.http2 || cfg.scheme != http::uri::Scheme::HTTP {
            return None;
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let builder = http1::Builder::new();
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
            sweeper: std::sync::OnceLock::new(),
        }))
    }

    /// Sends `req` (absolute URI, as built for the upstream) on an idle connection or a
    /// new one, and returns the response head with the connection its body runs on.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<ForwardBody<RequestTap<Incoming>>>,
    ) -> Result<(Response<Incoming>, Lease), ProxyError> {
        let mut req = req.map(BodyExt::boxed_unsync);
        req.headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.host.clone());
        *req.uri_mut() = origin_form(req.uri());
        loop {
            let (mut conn, reused) = match self.take() {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            let sent = conn.send.try_send_request(req);
            let mut sent = pin!(sent);
            let result = poll_fn(|cx| {
                // The connection first, so that what it read reaches the response future.
                conn.drive(cx);
                sent.as_mut().poll(cx)
            })
            .await;
            match result {
                Ok(resp) => {
                    let lease = Lease {
                        conn,
                        pool: Arc::clone(self),
                    };
                    return Ok((resp, lease));
                }
                Err(mut e) => match e.take_message() {
                    // A pooled connection closed before the request went out: nothing
                    // was written, so another connection may carry it.
                    Some(unsent) if reused => {
                        tracing::debug!(error = %e.error(), "idle upstream connection was closed; retrying");
                        req = unsent;
                    }
                    _ => return Err(ProxyError::UpstreamFailed(e.into_error().into())),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open and young enough. Each
    /// is checked (a read attempt) after the lock is let go.
    fn take(&self) -> Option<Conn> {
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let mut entry = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            if entry.since.elapsed() < self.idle_timeout && entry.conn.reusable(&mut cx) {
                return Some(entry.conn);
            }
        }
    }

    async fn connect(self: &Arc<Self>) -> Result<Conn, ProxyError> {
        let io = self
            .connector
            .clone()
            .call(self.origin.clone())
            .await
            .map_err(|e| ProxyError::connect(Box::new(e)))?;
        let (send, driver) = self
            .builder
            .handshake(io)
            .await
            .map_err(|e| ProxyError::Unreachable(Box::new(e)))?;
        self.start_sweeping();
        Ok(Conn {
            send,
            driver: Some(driver),
        })
    }

    fn put(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Drops idle connections that closed or aged out. Under the lock: at most
    /// `pool_max_idle_per_host` read attempts, once a second.
    fn sweep(&self) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain_mut(|entry| {
            entry.since.elapsed() < self.idle_timeout && entry.conn.reusable(&mut cx)
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_go_out_in_origin_form() {
        let cases = [
            (
                "http://up:8000/v1/chat/completions?a=1",
                "/v1/chat/completions?a=1",
            ),
            ("http://up:8000/", "/"),
            ("http://up:8000", "/"),
        ];
        for (absolute, origin) in cases {
            let uri: Uri = absolute.parse().unwrap();
            assert_eq!(origin_form(&uri).to_string(), origin, "{absolute}");
        }
    }

    #[test]
    fn host_leaves_out_the_default_port() {
        for (authority, host) in [("up:8000", "up:8000"), ("up:80", "up"), ("up", "up")] {
            let authority: Authority = authority.parse().unwrap();
            assert_eq!(host_header(&authority).unwrap(), host);
        }
    }
}
