//! The data path: listener (optionally TLS), HTTP/1.1 and HTTP/2 connections, and the
//! forwarding service. Bytes pass unchanged and unbuffered; the measurement layer wraps
//! the forwarding service and only observes.

mod body;
mod client;
mod coalesce;
mod error;
mod fds;
mod first_bytes;
mod forward;
mod h2guard;
mod headers;
pub mod inject;
mod inline;
mod request_body;
mod server;
mod slots;
mod tunnel;
mod wire;
pub use wire::kernel_timestamps;

use std::net::SocketAddr;

pub use body::{IdleTimeout, UpstreamBody};
pub use error::ProxyError;
pub use fds::ClientBudget;
pub use forward::Forward;
pub use server::{Proxy, serve};
pub use tunnel::Tunnel;

/// What the forwarding service knows about the client connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    pub tls: bool,
    /// When the connection's reads arrived (the request head's gives `t_arrival`).
    pub reads: Option<std::sync::Arc<crate::measure::ReadClock>>,
}
