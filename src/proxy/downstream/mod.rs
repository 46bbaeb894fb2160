//! The client side of the proxy: the listener and its TLS, accepting and admitting
//! connections ([`room`]), HTTP/1.1 and HTTP/2 server connections with their guards, and
//! the measurement layer wrapped around the forwarding service. It hands each request to
//! [`crate::proxy::Forward`] and writes back what the upstream side answers; it never
//! opens an upstream connection itself.

pub(super) mod accept_errors;
mod coalesce;
mod first_bytes;
pub(super) mod h1;
mod h2guard;
mod room;
pub(super) mod server;
