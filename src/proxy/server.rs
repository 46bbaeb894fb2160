//! The accept loop and connection handling: TLS termination, HTTP/1.1 with upgrades and
//! HTTP/2 (h2c prior knowledge or ALPN), hyper's header-read timeout wired to a real timer,
//! and graceful shutdown: stop accepting, let in-flight streams finish until the drain
//! deadline, then cut what is left (recorded as such).

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use http::Request;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{
        conn::auto,
        graceful::{GracefulShutdown, Watcher},
    },
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tower::{Layer, ServiceExt, service_fn};

use super::{ConnInfo, Forward, coalesce::Coalesce, first_bytes::FirstBytes};
use crate::{
    config::Server,
    measure::{Measure, MeasureLayer, Recorder},
};

/// HTTP/2 streams a client may open on one connection. hyper's default (200) would hold a
/// gateway's or load generator's streams back in the client, before `t_arrival`, where no
/// measurement sees the wait; the upstream's own limit is what should apply.
const H2_MAX_CONCURRENT_STREAMS: u32 = 16_384;

/// Everything a connection needs; shared by all of them.
pub struct Proxy {
    service: Measure<Forward>,
    builder: auto::Builder<TokioExecutor>,
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
        Proxy {
            service: layer.layer(forward),
            builder,
            tls: server.tls.clone().map(|c| Arc::new(ArcSwap::new(c))),
            handshake_timeout: server.header_read_timeout,
            drain_timeout: server.drain_timeout,
            recorder,
        }
    }

    async fn connection<IO>(self: Arc<Self>, io: IO, conn: ConnInfo, watcher: Watcher)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let svc = self.service.clone();
        let svc = service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(conn.clone());
            svc.clone().oneshot(req)
        });
        // hyper's header-read timeout starts only once HTTP/1 is chosen; bound the bytes before.
        let io = FirstBytes::new(io, self.handshake_timeout);
        // Events already on their way go out in one write (see `coalesce`).
        let io = Coalesce::new(io);
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(svc));
        if let Err(e) = watcher.watch(connection.into_owned()).await {
            tracing::debug!(error = %e, "client connection ended with an error");
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
    let graceful = GracefulShutdown::new();
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
                conns.spawn(accept(proxy.clone(), stream, remote, graceful.watcher()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let in_flight = conns.len();
    tracing::info!(connections = in_flight, deadline = ?proxy.drain_timeout, "draining");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(proxy.drain_timeout) => {
            proxy.recorder.mark_cutting();
            tracing::warn!(connections = conns.len(), "drain deadline passed; cutting the rest");
            conns.abort_all();
        }
    }
    while conns.join_next().await.is_some() {}
    Ok(())
}

async fn accept(
    proxy: Arc<Proxy>,
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    watcher: Watcher,
) {
    let Some(acceptor) = proxy.tls.as_ref().map(|t| TlsAcceptor::from(t.load_full())) else {
        let conn = ConnInfo { remote, tls: false };
        return Arc::clone(&proxy).connection(stream, conn, watcher).await;
    };
    match tokio::time::timeout(proxy.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            let conn = ConnInfo { remote, tls: true };
            proxy.connection(tls, conn, watcher).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, %remote, "TLS handshake failed"),
        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
    }
}
