//! The accept loop and connection handling: TLS termination, HTTP/1.1 with upgrades and
//! HTTP/2 (h2c prior knowledge or ALPN), hyper's header-read timeout wired to a real timer,
//! and graceful shutdown: stop accepting, close connections that have not sent anything
//! yet, let in-flight streams finish until the drain deadline, then cut what is left
//! (recorded as such).
//!
//! Client connections are bounded (`server.max_connections`): past it, a connection that
//! has waited longest for a request is closed to make room for the new one
//! ([`super::room`]), and if none may be, the new connection is closed as soon as it is
//! accepted, so that the ones served keep their descriptors and a flood of idle
//! connections costs the flood, not the listener. Failed accepts (out of
//! descriptors) back off and warn at most once per [`super::accept_errors::ACCEPT_WARN_EVERY`].
//!
//! A plaintext connection's first bytes are peeked at, not read: one that does not open
//! with the HTTP/2 preface goes straight to goodput's own HTTP/1.1 server connection
//! ([`super::h1`], `server.http1_own`) or hyper's HTTP/1 server. hyper-util's `auto`
//! reads the first bytes itself and replays them, which makes hyper double its 8 KiB read
//! buffer on every connection: 8 KiB more per open stream (docs/PERFORMANCE.md).

use std::{
    future::{Future, poll_fn},
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::Waker,
    time::Duration,
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
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore, watch},
};
use tower::{Layer, ServiceExt, service_fn};

use super::{
    coalesce::Coalesce,
    first_bytes::FirstBytes,
    h1,
    h2guard::{self, H2Guard},
    room::{Held, Presence, Registered, Room},
};
use crate::{
    BoxError,
    config::Server,
    measure::{ClientReads, Delivery, Measure, MeasureLayer, MeasuredBody, Recorder},
    proxy::{ClientSide, ConnInfo, Forward, LimitMetrics, UpstreamBody, wire::WireStream},
};

mod listen;
pub use listen::serve;

/// Streams an HTTP/2 client may reset before the server has seen them, before the
/// connection is closed with GOAWAY (the "rapid reset" attack, CVE-2023-44487). h2's
/// default, stated here so it is documented and kept.
const H2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the server may reset because the client broke the protocol on them before the
/// connection is closed (RUSTSEC-2024-0003). hyper's default, stated here likewise.
const H2_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// A connection accepted at the cap waits at most this long for the place of the one
/// told to close to make room for it.
const ROOM_WAIT: Duration = Duration::from_secs(1);

/// Failed accepts (out of descriptors) are retried after this pause.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Everything a connection needs; shared by all of them.
pub struct Proxy {
    service: Measure<Forward>,
    builder: auto::Builder<TokioExecutor>,
    /// Plaintext HTTP/1 connections, recognised by peeking (see the module doc).
    http1: hyper::server::conn::http1::Builder,
    /// `server.http1_own`: plaintext HTTP/1 on goodput's own connection ([`super::h1`]).
    own: Option<h1::Settings>,
    /// Set when draining starts; every client connection watches it.
    draining: watch::Sender<bool>,
    /// Set just before `draining`, so a connection can tell cheaply whether to look.
    drain_started: AtomicBool,
    /// Swappable so a config reload can rotate certificates without a restart.
    tls: Option<Arc<ArcSwap<rustls::ServerConfig>>>,
    handshake_timeout: Duration,
    drain_timeout: Duration,
    recorder: Recorder,
    /// Client connections that may be open at once (`server.max_connections`).
    connections: Arc<Semaphore>,
    /// The open connections, to close one that waits for a request when the cap is
    /// reached (see [`super::room`]).
    room: Arc<Room>,
    limits: LimitMetrics,
    /// HTTP/2 control frames a connection may send a second, and where a flood counts.
    control_frames: u32,
    control_floods: prometheus_client::metrics::counter::Counter,
}

/// An open client connection's place among `server.max_connections`.
struct Open {
    _permit: OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
    room: Registered,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Proxy {
    /// The handle a config reload uses to rotate the listener's certificate.
    pub fn tls_handle(&self) -> Option<Arc<ArcSwap<rustls::ServerConfig>>> {
        self.tls.clone()
    }

    /// `max_connections` is `server.max_connections` as the open-files budget allows
    /// (see [`crate::proxy::fds`]).
    pub fn new(
        server: &Server,
        forward: Forward,
        layer: MeasureLayer,
        recorder: Recorder,
        limits: LimitMetrics,
        max_connections: usize,
    ) -> Proxy {
        let l = &server.limits;
        let header_bytes = l.max_request_header_bytes;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // hyper-util's HTTP/1 has no separate header limit: the read buffer bounds the
        // head (at least 8 KiB, checked by validation); a larger head -> 431.
        // One flat write buffer, not a queue of the body's buffers: hyper answers a
        // malformed pipelined request with a 400 written ahead of whatever of the previous
        // response its queue still holds (a held-back write, a slow reader), which cuts
        // that response; in one buffer the 400 follows it. The copy is a memcpy of what
        // goes out (hyper bounds the buffer by `max_buf_size`).
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(server.header_read_timeout)
            .max_buf_size(header_bytes)
            .writev(false)
            .half_close(server.http1_half_close)
            .keep_alive(true);
        // Flood bounds h2 has without settings: one PING answer and one SETTINGS ack
        // pending at a time (no more frames are read until they are written), CONTINUATION
        // frames bounded by the header list size. They are not rate limits (docs/CONFIG.md).
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(l.http2_max_concurrent_streams)
            .max_header_list_size(u32::try_from(header_bytes).unwrap_or(u32::MAX))
            .max_pending_accept_reset_streams(H2_MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_local_error_reset_streams(H2_MAX_LOCAL_ERROR_RESET_STREAMS);
        if !server.http2 {
            builder = builder.http1_only();
        }
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(server.header_read_timeout)
            .max_header_size(header_bytes)
            .writev(false)
            .half_close(server.http1_half_close)
            .keep_alive(true);
        let control_floods = limits
            .rejections
            .get_or_create(&crate::metrics::LimitLabel {
                limit: h2guard::LIMIT,
            })
            .clone();
        Proxy {
            service: layer.layer(forward),
            builder,
            http1,
            own: server.http1_own.then_some(h1::Settings {
                header_read_timeout: server.header_read_timeout,
                max_head_bytes: header_bytes,
                half_close: server.http1_half_close,
            }),
            draining: watch::Sender::new(false),
            drain_started: AtomicBool::new(false),
            tls: server.tls.clone().map(|c| Arc::new(ArcSwap::new(c))),
            handshake_timeout: server.header_read_timeout,
            drain_timeout: server.drain_timeout,
            recorder,
            connections: Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS))),
            room: Arc::new(Room::new(
                l.min_connection_age,
                limits.closed_for_room.clone(),
            )),
            limits,
            control_frames: l.http2_max_control_frames_per_second,
            control_floods,
        }
    }

    /// Resolves once draining has started (at once if it already has).
    async fn drain_started(&self) {
        let mut draining = self.draining.subscribe();
        // Err only if the sender is gone, i.e. the proxy itself: stop all the same.
        let _ = draining.wait_for(|d| *d).await;
    }

    /// A place for a newly accepted connection, if one is free.
    fn admit(&self) -> Option<Open> {
        let permit = Arc::clone(&self.connections).try_acquire_owned().ok()?;
        Some(self.open(permit))
    }

    fn open(&self, permit: OwnedSemaphorePermit) -> Open {
        let gauge = self.limits.client_connections.clone();
        gauge.inc();
        Open {
            _permit: permit,
            gauge,
            room: self.room.register(),
        }
    }

    /// A connection accepted at the cap, after one waiting for a request was told to
    /// close: it takes that one's place once it has gone (or is closed after
    /// [`ROOM_WAIT`], should a request have kept that one open).
    async fn when_room(self: Arc<Self>, stream: TcpStream, remote: SocketAddr, late: bool) {
        let permit =
            tokio::time::timeout(ROOM_WAIT, Arc::clone(&self.connections).acquire_owned()).await;
        match permit {
            Ok(Ok(permit)) => {
                let open = self.open(permit);
                listen::accept(self, stream, remote, open, late).await;
            }
            _ => {
                self.limits.rejected("server.max_connections");
                tracing::debug!(%remote, "connection limit reached; closed");
            }
        }
    }

    /// A TLS or HTTP/2 connection: hyper-util's `auto` server (HTTP/1 or HTTP/2), with
    /// upgrades, shut down gracefully when draining starts.
    async fn connection<IO>(self: Arc<Self>, io: IO, conn: ConnInfo, presence: Arc<Presence>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let delivery = Arc::new(Delivery::new());
        let svc = self.service(conn, &delivery, presence);
        // HTTP/2 PING and SETTINGS floods close the connection (HTTP/1 passes untouched).
        let io = H2Guard::new(io, self.control_frames, self.control_floods.clone());
        // hyper's header-read timeout starts only once HTTP/1 is chosen; bound the bytes before.
        let io = FirstBytes::new(io, self.handshake_timeout);
        // Events already on their way go out in one write (see `coalesce`).
        let io = Coalesce::new(io, Arc::clone(&delivery));
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(svc));
        self.until_ended(connection, &delivery, false, |c| c.graceful_shutdown())
            .await;
    }

    /// A plaintext connection known to speak HTTP/1: hyper's HTTP/1 server on the socket
    /// itself, with upgrades, shut down gracefully when draining starts.
    async fn http1(self: Arc<Self>, io: WireStream, conn: ConnInfo, presence: Arc<Presence>) {
        let delivery = Arc::new(Delivery::new());
        let svc = self.service(conn, &delivery, presence);
        let io = Coalesce::new(io, Arc::clone(&delivery));
        let connection = self
            .http1
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
            .with_upgrades();
        // Its first bytes were seen: a request is on its way (or bounded by the header
        // timeout), so draining lets it in before shutting the connection down.
        self.until_ended(connection, &delivery, true, |c| c.graceful_shutdown())
            .await;
    }

    /// A plaintext connection known to speak HTTP/1, on goodput's own server connection
    /// (`server.http1_own`); a request asking for an upgrade hands it to hyper's.
    async fn http1_own(
        self: Arc<Self>,
        io: WireStream,
        conn: ConnInfo,
        presence: Arc<Presence>,
        settings: h1::Settings,
    ) {
        let delivery = Arc::new(Delivery::new());
        let svc = self.own_service(conn.clone(), &delivery, Arc::clone(&presence));
        let io = Coalesce::new(io, Arc::clone(&delivery));
        let stop = Arc::new(AtomicBool::new(false));
        let hand_off = {
            let (proxy, delivery, stop) =
                (Arc::clone(&self), Arc::clone(&delivery), Arc::clone(&stop));
            move |io: h1::Rewind<Coalesce<WireStream>>| async move {
                let svc = proxy.service(conn, &delivery, presence);
                let connection = proxy
                    .http1
                    .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
                    .with_upgrades();
                let mut connection = std::pin::pin!(connection);
                let mut shutting_down = false;
                let ended = poll_fn(|cx| {
                    if !shutting_down && stop.load(Ordering::Acquire) {
                        shutting_down = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    connection.as_mut().poll(cx)
                })
                .await;
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upgraded client connection ended with an error");
                }
            }
        };
        let limits = self.limits.clone();
        let refused = move |r: h1::Reject| {
            if r == h1::Reject::TooLarge {
                limits.rejected("server.max_request_header_bytes");
            }
        };
        let connection = h1::serve(io, svc, settings, Arc::clone(&stop), refused, hand_off);
        self.until_ended(connection, &delivery, true, |_| {
            stop.store(true, Ordering::Release);
        })
        .await;
    }

    /// The service for one connection's requests: each carries what is known of the
    /// connection, and its [`Delivery`] for the response body to follow, and keeps the
    /// connection busy (not to be closed for room) until its response body is dropped.
    fn service(
        &self,
        conn: ConnInfo,
        delivery: &Arc<Delivery>,
        presence: Arc<Presence>,
    ) -> impl tower::Service<
        Request<Incoming>,
        Response = http::Response<Held<MeasuredBody<UpstreamBody>>>,
        Error = <Measure<Forward> as tower::Service<Request<ClientSide>>>::Error,
        Future: Send,
    > + Clone
    + Send
    + 'static {
        self.own_service(conn, delivery, presence)
            .map_request(|req: Request<Incoming>| req.map(ClientSide::Hyper))
    }

    /// [`Proxy::service`] for requests whose body is already a [`ClientSide`].
    pub(super) fn own_service(
        &self,
        conn: ConnInfo,
        delivery: &Arc<Delivery>,
        presence: Arc<Presence>,
    ) -> impl tower::Service<
        Request<ClientSide>,
        Response = http::Response<Held<MeasuredBody<UpstreamBody>>>,
        Error = <Measure<Forward> as tower::Service<Request<ClientSide>>>::Error,
        Future: Send,
    > + Clone
    + Send
    + 'static {
        let svc = self.service.clone();
        let delivery = Arc::clone(delivery);
        service_fn(move |mut req: Request<ClientSide>| {
            delivery.request_begins();
            let busy = presence.busy();
            if let Some(reads) = &conn.reads {
                req.extensions_mut().insert(ClientReads(Arc::clone(reads)));
            }
            req.extensions_mut().insert(conn.clone());
            req.extensions_mut().insert(Arc::clone(&delivery));
            let call = svc.clone().oneshot(req);
            async move {
                let resp = call.await?;
                Ok(resp.map(|body| Held::new(body, busy)))
            }
        })
    }

    /// Drives `connection` to its end, starting its graceful shutdown (`shut_down`) once
    /// draining starts. Each poll is counted in `delivery`.
    ///
    /// With `first_request`, the shutdown waits until a request has reached the service:
    /// hyper closes an HTTP/1 connection that is between requests at once, which for a
    /// connection accepted as draining starts (its request already in the socket buffer)
    /// would close it unanswered.
    async fn until_ended<C, E>(
        &self,
        connection: C,
        delivery: &Delivery,
        first_request: bool,
        mut shut_down: impl FnMut(Pin<&mut C>),
    ) where
        C: Future<Output = Result<(), E>>,
        E: Into<BoxError>,
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
        let (mut armed, mut drained, mut shutting_down) = (false, false, false);
        let mut task: Option<Waker> = None;
        let ended = poll_fn(|cx| {
            if !drained && (!armed || self.drain_started.load(Ordering::Acquire)) {
                armed = true;
                drained = drain.as_mut().poll(cx).is_ready();
            }
            let due = |shutting_down: bool| {
                drained && !shutting_down && (!first_request || delivery.served())
            };
            if due(shutting_down) {
                shut_down(connection.as_mut());
                shutting_down = true;
            }
            if !task
                .as_ref()
                .is_some_and(|t: &Waker| t.will_wake(cx.waker()))
            {
                task = Some(cx.waker().clone());
                delivery.connection_task(cx.waker().clone());
            }
            delivery.poll_begins();
            let polled = connection.as_mut().poll(cx);
            delivery.poll_ends();
            if polled.is_pending() && due(shutting_down) {
                // The awaited request arrived in this poll, which may have been the last
                // wake for a while (an answer written at once): shut down now.
                shut_down(connection.as_mut());
                shutting_down = true;
                delivery.poll_begins();
                let polled = connection.as_mut().poll(cx);
                delivery.poll_ends();
                return polled;
            }
            polled
        })
        .await;
        if let Err(e) = ended {
            let e: BoxError = e.into();
            if head_too_large(&*e) {
                // hyper answered 431 itself.
                self.limits.rejected("server.max_request_header_bytes");
            }
            tracing::debug!(error = %e, "client connection ended with an error");
        }
    }
}

/// Whether a connection ended because its request head was over the limit.
fn head_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse_too_large)
        {
            return true;
        }
        cur = err.source();
    }
    false
}
