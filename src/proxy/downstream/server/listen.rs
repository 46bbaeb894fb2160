//! The accept loop: admitting each accepted connection (or making room for it), telling
//! how a plaintext one opens (HTTP/1 or the HTTP/2 preface) and handing it to its
//! server connection, TLS first where configured; draining once the stop comes.

use std::{
    future::Future,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

use super::{ACCEPT_BACKOFF, Open, Proxy};
use crate::{
    measure::ReadClock,
    proxy::{
        ConnInfo,
        downstream::{accept_errors::AcceptErrors, first_bytes::H2_PREFACE, room::Presence},
        wire::WireStream,
    },
};

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
async fn opening(stream: &WireStream, timeout: Duration) -> Opening {
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

impl Proxy {
    /// Admits and spawns an accepted connection; false when the accept failed.
    /// `late`: accepted from the queue as draining starts.
    fn accepted(
        self: &Arc<Self>,
        accepted: std::io::Result<(TcpStream, SocketAddr)>,
        conns: &mut JoinSet<()>,
        accept_errors: &mut AcceptErrors,
        late: bool,
    ) -> bool {
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and similar: back off, keep serving.
                accept_errors.failed(&e, &self.limits.accept_errors);
                return false;
            }
        };
        let Some(open) = self.admit() else {
            if self.room.make_room() {
                // One waiting for a request goes; this one takes its place.
                let _ = stream.set_nodelay(true);
                conns.spawn(Arc::clone(self).when_room(stream, remote, late));
                return true;
            }
            // Closed at once: the client knows at once, and the connections being
            // served keep their descriptors.
            self.limits.rejected("server.max_connections");
            tracing::debug!(%remote, "connection limit reached; closed");
            drop(stream);
            return true;
        };
        let _ = stream.set_nodelay(true);
        conns.spawn(accept(Arc::clone(self), stream, remote, open, late));
        true
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
    let mut accept_errors = AcceptErrors::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                if !proxy.accepted(accepted, &mut conns, &mut accept_errors, false) {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Connections the kernel has already queued on this listener are served, not reset
    // by closing it: with `SO_REUSEPORT` the clients behind them did nothing wrong (the
    // kernel picked this listener). What arrives after the last look is handed to the
    // other listeners of the group by `net.ipv4.tcp_migrate_req` (docs/RESTART.md).
    while let Ok(accepted) = tokio::time::timeout(Duration::ZERO, listener.accept()).await {
        if !proxy.accepted(accepted, &mut conns, &mut accept_errors, true) {
            break;
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

/// Serves one accepted connection. One accepted before draining started that has sent
/// nothing by then is closed; a `late` one (taken from the queue as draining starts: its
/// client connected a moment ago and has not had time to send) gets the usual handshake
/// and header time instead.
pub(super) async fn accept(
    proxy: Arc<Proxy>,
    stream: TcpStream,
    remote: SocketAddr,
    open: Open,
    late: bool,
) {
    let presence = Arc::clone(open.room.presence());
    let serving = serve_accepted(proxy, stream, remote, Arc::clone(&presence), late);
    tokio::select! {
        () = serving => {}
        () = presence.closing() => {
            tracing::debug!(%remote, "closed to make room for a new connection");
        }
    }
    drop(open);
}

async fn serve_accepted(
    proxy: Arc<Proxy>,
    stream: TcpStream,
    remote: SocketAddr,
    presence: Arc<Presence>,
    late: bool,
) {
    let drain_started = || async {
        if late {
            std::future::pending::<()>().await;
        } else {
            proxy.drain_started().await;
        }
    };
    // Reads are stamped with the packets' arrival where the kernel tells it (`wire`).
    let reads = Arc::new(ReadClock::new());
    let stream = WireStream::new(stream, Arc::clone(&reads)).probing();
    let reads = Some(reads);
    let Some(acceptor) = proxy.tls.as_ref().map(|t| TlsAcceptor::from(t.load_full())) else {
        let conn = ConnInfo {
            remote,
            tls: false,
            reads,
        };
        // A connection that has sent nothing yet when draining starts has nothing to
        // finish: closed, rather than holding the drain until its header timeout.
        // Biased: a request already received (queued while the listener was being closed)
        // is served, not dropped because draining started too.
        let opened = tokio::select! {
            biased;
            opened = opening(&stream, proxy.handshake_timeout) => opened,
            () = drain_started() => Opening::Gone,
        };
        // The other paths are boxed: this task's future is as large as its largest path,
        // and every plaintext HTTP/1 connection would pay for TLS's (docs/PERFORMANCE.md).
        return match opened {
            Opening::Http1 => match proxy.own {
                Some(settings) => {
                    Box::pin(Arc::clone(&proxy).http1_own(stream, conn, presence, settings)).await;
                }
                None => Arc::clone(&proxy).http1(stream, conn, presence).await,
            },
            Opening::Http2 => {
                Box::pin(Arc::clone(&proxy).connection(stream, conn, presence)).await;
            }
            Opening::Gone => tracing::debug!(%remote, "client sent no request head in time"),
        };
    };
    let handshake = Box::pin(async {
        tokio::select! {
            shaken = tokio::time::timeout(proxy.handshake_timeout, acceptor.accept(stream)) => {
                Some(shaken)
            }
            () = drain_started() => None,
        }
    });
    match handshake.await {
        Some(Ok(Ok(tls))) => {
            let conn = ConnInfo {
                remote,
                tls: true,
                reads,
            };
            Box::pin(proxy.connection(tls, conn, presence)).await;
        }
        Some(Ok(Err(e))) => tracing::debug!(error = %e, %remote, "TLS handshake failed"),
        Some(Err(_)) => tracing::debug!(%remote, "TLS handshake timed out"),
        None => tracing::debug!(%remote, "draining: TLS handshake abandoned"),
    }
}
