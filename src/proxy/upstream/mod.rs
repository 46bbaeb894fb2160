//! The upstream side of the proxy: connections to the upstream and their budget
//! ([`slots`]), the inline HTTP/1.1 pool and goodput's own HTTP/1.1 client on it
//! ([`inline`], [`relay`], with the strict response framing of [`framing`]), hyper's
//! pooled client for TLS and HTTP/2 ([`client`]), the client's body on its way up
//! ([`request_body`]), the response body handed back ([`body`]) and the errors that become
//! the proxy's own answers ([`error`]).
//!
//! This wing never imports the client side (`super::downstream`): the forwarding service
//! (`super::forward`) joins the two, and the leaves both use (wire stamps, headers, the
//! file budget, limit counters) sit beside them in `proxy`.

pub(super) mod body;
pub(super) mod client;
mod closed;
pub(super) mod error;
pub(super) mod files_wait;
pub(super) mod framing;
pub(super) mod inline;
pub(super) mod relay;
pub(super) mod request_body;
pub(super) mod slots;
