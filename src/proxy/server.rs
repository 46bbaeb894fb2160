//! The accept loop and connection handling: TLS termination, HTTP/1.1 with upgrades and
//! HTTP/2 (h2c prior knowledge or ALPN), hyper's header-read timeout wired to a real timer,
//! and graceful shutdown: stop accepting, let in-flight streams finish until the drain
//! deadline, then cut what is left (recorded as such).
//!
//! A plaintext connection's first bytes are peeked at, not read: one that does not open
//! with the HTTP/2 preface goes straight to hyper's HTTP/1 server. hyper-util's `auto`
//! reads the first bytes itself and replays them, which makes hyper double its 8 KiB read
//! buffer on every connection: 8 KiB more per open stream (docs/PERFORMANCE.md).

use std::{
    fmt::Display,
    future::{Future, poll_fn},
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::Waker,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use http::Request;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tower::{Layer, ServiceExt, service_fn};

use super::{
    ConnInfo, Forward,
    coalesce::Coalesce,
    first_bytes::{FirstBytes, H2_PREFACE},
};
use crate::{
    config::Server,
    measure::{Delivery, Measure, MeasureLayer, Recorder},
};

/// HTTP/2 streams a client may open on one connection. hyper's default (200) would hold a
/// gateway's or load generator's streams back in the client, before `t_arrival`, where no
/// measurement sees the wait; the upstream's own limit is what should apply.
const H2_MAX_CONCURRENT_STREAMS: u32 = 16_384;

/// Everything a connection needs; shared by all of them.
pub struct Proxy {
    service: Measure<Forward>,
    builder: auto::Builder<TokioExecutor>,
    /// Plaintext HTTP/1 connections, recognised by peeking (see the module doc).
    http1: hyper::server::conn::http1::Builder,
    /// Set when draining starts; every client connection watches it.
    draining: watch::Sender<bool>,
    /// Set just before `draining`, so a connection can tell cheaply whether to look.
    drain_started: AtomicBool,
    /// Swappable so a config reload can rotate certificates without a restart.
    tls: Option<Arc<ArcSwap<rustls::ServerConfig>>>,
    handshake_timeout: Duration,
    drain_timeout: Duration,
    recorder: Recorder,
}

impl Proxy {
    /// The handle a config reload uses to rotate the listener's certificate.
    pub fn tls_handle(&self) -> Option<Arc<ArcSwap<rustls::ServerConfig>>> {
        self.tls.clone()
    }

    pub fn new(
        server: &Server,
        forward: Forward,
        layer: MeasureLayer,
        recorder: Recorder,
    ) -> Proxy {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(server.header_read_timeout)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS);
        if !server.http2 {
            builder = builder.http1_only();
        }
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(server.header_read_timeout)
            .keep_alive(true);
        Proxy {
            service: layer.layer(forward),
            builder,
            http1,
            draining: watch::Sender::new(false),
            drain_started: AtomicBool::new(false),
            tls: server.tls.clone().map(|c| Arc::new(ArcSwap::new(c))),
            handshake_timeout: server.header_read_timeout,
            drain_timeout: server.drain_timeout,
            recorder,
        }
    }

    /// A TLS or HTTP/2 connection: hyper-util's `auto` server (HTTP/1 or HTTP/2), with
    /// upgrades, shut down gracefully when draining starts.
    async fn connection<IO>(self: Arc<Self>, io: IO, conn: ConnInfo)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let delivery = Arc::new(Delivery::new());
        let svc = self.service(conn, &delivery);
        // hyper's header-read timeout starts only once HTTP/1 is chosen; bound the bytes before.
        let io = FirstBytes::new(io, self.handshake_timeout);
        // Events already on their way go out in one write (see `coalesce`).
        let io = Coalesce::new(io, Arc::clone(&delivery));
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(svc));
        self.until_ended(connection, &delivery, |c| c.graceful_shutdown())
            .await;
    }

    /// A plaintext connection known to speak HTTP/1: hyper's HTTP/1 server on the socket
    /// itself, with upgrades, shut down gracefully when draining starts.
    async fn http1(self: Arc<Self>, io: TcpStream, conn: ConnInfo) {
        let delivery = Arc::new(Delivery::new());
        let svc = self.service(conn, &delivery);
        let io = Coalesce::new(io, Arc::clone(&delivery));
        let connection = self
            .http1
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
            .with_upgrades();
        self.until_ended(connection, &delivery, |c| c.graceful_shutdown())
            .await;
    }

    /// The service for one connection's requests: each carries what is known of the
    /// connection, and its [`Delivery`] for the response body to follow.
    fn service(
        &self,
        conn: ConnInfo,
        delivery: &Arc<Delivery>,
    ) -> impl tower::Service<
        Request<Incoming>,
        Response = <Measure<Forward> as tower::Service<Request<Incoming>>>::Response,
        Error = <Measure<Forward> as tower::Service<Request<Incoming>>>::Error,
        Future: Send,
    > + Clone
    + Send
    + 'static {
        let svc = self.service.clone();
        let delivery = Arc::clone(delivery);
        service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(conn.clone());
            req.extensions_mut().insert(Arc::clone(&delivery));
            svc.clone().oneshot(req)
        })
    }

    /// Drives `connection` to its end, starting its graceful shutdown (`shut_down`) once
    /// draining starts. Each poll is counted in `delivery`.
    async fn until_ended<C, E>(
        &self,
        connection: C,
        delivery: &Delivery,
        mut shut_down: impl FnMut(Pin<&mut C>),
    ) where
        C: Future<Output = Result<(), E>>,
        E: Display,
    {
        let mut connection = std::pin::pin!(connection);
        let mut draining = self.draining.subscribe();
        // Unconstrained: tokio's cooperative budget could otherwise make its first poll
        // return before it registers the task's waker (see below).
        let mut drain = std::pin::pin!(tokio::task::unconstrained(async move {
            // Err only if the sender is gone, i.e. the proxy itself: stop all the same.
            let _ = draining.wait_for(|d| *d).await;
        }));
        // The drain signal is polled once, which registers the task's waker with it, and
        // again only once draining has started: not on each of the connection's wakes,
        // i.e. each streamed event (`tokio::select!` would poll both every time).
        let (mut armed, mut shutting_down) = (false, false);
        let mut task: Option<Waker> = None;
        let ended = poll_fn(|cx| {
            if !shutting_down && (!armed || self.drain_started.load(Ordering::Acquire)) {
                armed = true;
                if drain.as_mut().poll(cx).is_ready() {
                    shut_down(connection.as_mut());
                    shutting_down = true;
                }
            }
            if !task
                .as_ref()
                .is_some_and(|t: &Waker| t.will_wake(cx.waker()))
            {
                task = Some(cx.waker().clone());
                delivery.connection_task(cx.waker().clone());
            }
            delivery.poll_begins();
            connection.as_mut().poll(cx)
        })
        .await;
        if let Err(e) = ended {
            tracing::debug!(error = %e, "client connection ended with an error");
        }
    }
}

/// How a plaintext connection opens.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    Http1,
    /// The HTTP/2 preface (h2c with prior knowledge).
    Http2,
    /// Closed, failed, or nothing decisive before the deadline.
    Gone,
}

/// Peeks (without consuming) at a connection's first bytes until they leave or complete the
/// HTTP/2 preface, for at most `timeout`.
async fn opening(stream: &TcpStream, timeout: Duration) -> Opening {
    let deadline = tokio::time::Instant::from_std(Instant::now() + timeout);
    let mut buf = [0u8; 24];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return Opening::Gone,
        };
        let seen = buf.get(..n).unwrap_or_default();
        if !H2_PREFACE.starts_with(seen) {
            return Opening::Http1;
        }
        if n >= H2_PREFACE.len() {
            return Opening::Http2;
        }
        // Part of the preface: `peek` would return at once, so wait a little for the rest.
        tokio::time::sleep(Duration::from_millis(5)).await;
        if tokio::time::Instant::now() >= deadline {
            return Opening::Gone;
        }
    }
}

/// Serves the proxy on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let proxy = Arc::new(proxy);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and similar: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                conns.spawn(accept(proxy.clone(), stream, remote));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let in_flight = conns.len();
    tracing::info!(connections = in_flight, deadline = ?proxy.drain_timeout, "draining");
    proxy.drain_started.store(true, Ordering::Release);
    proxy.draining.send_replace(true);
    let drained = async { while conns.join_next().await.is_some() {} };
    tokio::select! {
        () = drained => {}
        () = tokio::time::sleep(proxy.drain_timeout) => {
            proxy.recorder.mark_cutting();
            tracing::warn!(connections = conns.len(), "drain deadline passed; cutting the rest");
            conns.abort_all();
        }
    }
    while conns.join_next().await.is_some() {}
    Ok(())
}

async fn accept(proxy: Arc<Proxy>, stream: tokio::net::TcpStream, remote: SocketAddr) {
    let Some(acceptor) = proxy.tls.as_ref().map(|t| TlsAcceptor::from(t.load_full())) else {
        let conn = ConnInfo { remote, tls: false };
        // The other paths are boxed: this task's future is as large as its largest path,
        // and every plaintext HTTP/1 connection would pay for TLS's (docs/PERFORMANCE.md).
        return match opening(&stream, proxy.handshake_timeout).await {
            Opening::Http1 => Arc::clone(&proxy).http1(stream, conn).await,
            Opening::Http2 => Box::pin(Arc::clone(&proxy).connection(stream, conn)).await,
            Opening::Gone => tracing::debug!(%remote, "client sent no request head in time"),
        };
    };
    let handshake = Box::pin(acceptor.accept(stream));
    match tokio::time::timeout(proxy.handshake_timeout, handshake).await {
        Ok(Ok(tls)) => {
            let conn = ConnInfo { remote, tls: true };
            Box::pin(proxy.connection(tls, conn)).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, %remote, "TLS handshake failed"),
        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
    }
}
