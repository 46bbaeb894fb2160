//! The data path: listener (optionally TLS), HTTP/1.1 and HTTP/2 connections, and the
//! forwarding service. Bytes pass unchanged and unbuffered; the measurement layer wraps
//! the forwarding service and only observes.
//!
//! Two wings with imports one way: [`downstream`] (the client side: accept, admission,
//! server connections) and [`upstream`] (pool, relay, framing, hyper's client, the
//! response body), which never imports the client side. [`forward`] joins them; the
//! leaves both use ([`wire`], [`headers`], [`fds`], [`limit_metrics`], [`client_body`]) sit here beside
//! them, and [`tunnel`] splices an upgraded connection to its upstream.

/// `AsyncWrite` for a wrapper that only watches reads: every write goes to its `io` field
/// untouched. `$pin` turns `self` (a `Pin<&mut Self>`) into the pinned field.
macro_rules! write_through {
    (impl [$($generics:tt)*] for $ty:ty, |$this:ident| $pin:expr) => {
        impl<$($generics)*> tokio::io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                let $this = self;
                $pin.poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                let $this = self;
                $pin.poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                let $this = self;
                $pin.poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                let $this = self;
                $pin.poll_shutdown(cx)
            }
        }
    };
}

mod client_body;
mod downstream;
mod fds;
mod forward;
mod headers;
mod limit_metrics;
mod tunnel;
mod upstream;
mod wire;
pub use headers::strip_hop_by_hop;
pub use upstream::client::{Connector as PooledConnector, build as pooled_client};
pub use wire::kernel_timestamps;

use std::net::SocketAddr;

pub use client_body::ClientSide;
pub use downstream::server::{Proxy, serve};
pub use fds::{Division, FileBudget};
pub use forward::Forward;
pub use limit_metrics::{LIMITS, LimitMetrics, UPSTREAM_CLOSED_REASONS};
pub use upstream::body::UpstreamBody;
pub use upstream::error::ProxyError;
pub use upstream::framing::{Broken, Delimiter, Fed, Framing, Violation};

/// What the forwarding service knows about the client connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    pub tls: bool,
    /// When the connection's reads arrived; each request carries it to the measurement
    /// as [`crate::measure::ClientReads`] (the read completing its head is `t_arrival`).
    pub reads: Option<std::sync::Arc<crate::measure::ReadClock>>,
}
