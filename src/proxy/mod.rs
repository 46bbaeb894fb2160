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
mod inline;
mod request_body;
mod server;
mod slots;
mod tunnel;
mod wire;
pub use wire::kernel_timestamps;

use std::net::SocketAddr;

pub use body::UpstreamBody;
pub use error::ProxyError;
pub use fds::ClientBudget;
pub use forward::Forward;
pub use server::{Proxy, serve};

/// What the forwarding service knows about the client connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    pub tls: bool,
    /// When the connection's reads arrived; each request carries it to the measurement
    /// as [`crate::measure::ClientReads`] (the read completing its head is `t_arrival`).
    pub reads: Option<std::sync::Arc<crate::measure::ReadClock>>,
}
