//! `[server]`: the client-facing listener, its TLS, timeouts and the limits on what
//! clients may hold. The file's section, its validation and the runtime value.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use serde::Deserialize;

use super::restart::Changed;
use super::{
    Problem,
    file::humantime_serde,
    tls::{self, TlsSection},
    validate::positive,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    pub listen: String,
    pub tls: Option<TlsSection>,
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    pub http2: bool,
    /// Client connections served at once; at the cap, the longest-waiting connection
    /// without a request (older than `min_connection_age`) is closed to admit a new one,
    /// and if there is none the new one is closed at once.
    pub max_connections: usize,
    /// How long a connection may wait for its first (or next) request head before it may
    /// be closed to make room at `max_connections`.
    #[serde(with = "humantime_serde")]
    pub min_connection_age: Duration,
    /// HTTP/2 streams a client may have open on one connection (SETTINGS).
    pub http2_max_concurrent_streams: u32,
    /// Largest request head (start line and header fields) accepted; more -> 431.
    pub max_request_header_bytes: usize,
    /// Time from the request head to the end of its body; exceeded -> 408.
    #[serde(with = "humantime_serde")]
    pub request_body_timeout: Duration,
    /// HTTP/2 `PING`s and `SETTINGS` a client may send a second; more -> closed.
    pub http2_max_control_frames_per_second: u32,
    /// An HTTP/1 client that half-closes after its request is still answered.
    pub http1_half_close: bool,
    /// Plaintext HTTP/1.1 clients served by goodput's own server connection instead of
    /// hyper's (on by default; restart-only).
    pub http1_own: bool,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            http2: true,
            max_connections: 10_000,
            // A slow but honest client has sent its request head well within this.
            min_connection_age: Duration::from_secs(3),
            // nginx's http2_max_concurrent_streams.
            http2_max_concurrent_streams: 128,
            // Envoy's max_request_headers_kb is 60 KiB; nginx's large_client_header_buffers 32.
            max_request_header_bytes: 64 << 10,
            // nginx's client_body_timeout.
            request_body_timeout: Duration::from_secs(60),
            // A keep-alive PING every few seconds and a SETTINGS now and then is what
            // clients send; a hundred a second is none of them.
            http2_max_control_frames_per_second: 100,
            http1_half_close: false,
            // On: it passes the hostile suite and the differential test against hyper's
            // (hostile::server_parity), and an idle stream holds no more on it than on
            // hyper's (docs/PERFORMANCE.md).
            http1_own: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub header_read_timeout: Duration,
    pub drain_timeout: Duration,
    pub http2: bool,
    /// Bounds on what clients may hold (see docs/CONFIG.md "Limits").
    pub limits: ServerLimits,
    /// Answer HTTP/1 clients that half-close after their request (docs/CONFIG.md "Limits").
    pub http1_half_close: bool,
    /// Plaintext HTTP/1.1 served by goodput's own connection (`proxy::downstream::h1`).
    pub http1_own: bool,
}

impl Server {
    /// What the listener, the connection builders and the accept loop were made from.
    pub(super) fn restart_only(&self, new: &Server, changed: &mut Changed) {
        changed.check(&self.listen, &new.listen, "server.listen");
        changed.check(
            &self.tls.is_some(),
            &new.tls.is_some(),
            "server.tls (on/off)",
        );
        changed.check(&self.http2, &new.http2, "server.http2");
        changed.check(&self.http1_own, &new.http1_own, "server.http1_own");
        let (o, n) = (self, new);
        changed.check(
            &o.header_read_timeout,
            &n.header_read_timeout,
            "server.header_read_timeout",
        );
        changed.check(&o.drain_timeout, &n.drain_timeout, "server.drain_timeout");
        let (o, n) = (&self.limits, &new.limits);
        changed.check(
            &o.max_connections,
            &n.max_connections,
            "server.max_connections",
        );
        changed.check(
            &o.min_connection_age,
            &n.min_connection_age,
            "server.min_connection_age",
        );
        changed.check(
            &o.http2_max_concurrent_streams,
            &n.http2_max_concurrent_streams,
            "server.http2_max_concurrent_streams",
        );
        changed.check(
            &o.max_request_header_bytes,
            &n.max_request_header_bytes,
            "server.max_request_header_bytes",
        );
        changed.check(
            &o.request_body_timeout,
            &n.request_body_timeout,
            "server.request_body_timeout",
        );
        changed.check(
            &o.http2_max_control_frames_per_second,
            &n.http2_max_control_frames_per_second,
            "server.http2_max_control_frames_per_second",
        );
        changed.check(
            &self.http1_half_close,
            &new.http1_half_close,
            "server.http1_half_close",
        );
    }
}

/// What one client, or all of them together, may hold of the proxy.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub min_connection_age: Duration,
    pub http2_max_concurrent_streams: u32,
    pub max_request_header_bytes: usize,
    pub request_body_timeout: Duration,
    pub http2_max_control_frames_per_second: u32,
}

/// The smallest request-head limit: hyper's HTTP/1 server reads with at least 8 KiB.
const MIN_HEADER_BYTES: usize = 8192;

/// The runtime `[server]` on `listen` (the file's, or the flag's, already parsed).
pub(super) fn validate(
    s: &ServerSection,
    listen: Option<SocketAddr>,
    problems: &mut Vec<Problem>,
) -> Option<Server> {
    let tls = match &s.tls {
        None => None,
        Some(t) => match tls::server_config(tls::TlsKeys::SERVER, &t.cert, &t.key, s.http2) {
            Ok(cfg) => Some(cfg),
            Err(mut p) => {
                problems.append(&mut p);
                None
            }
        },
    };
    positive(
        "server.header_read_timeout",
        s.header_read_timeout.as_millis() as u64,
        problems,
    );
    positive("server.max_connections", s.max_connections as u64, problems);
    positive(
        "server.http2_max_concurrent_streams",
        u64::from(s.http2_max_concurrent_streams),
        problems,
    );
    positive(
        "server.http2_max_control_frames_per_second",
        u64::from(s.http2_max_control_frames_per_second),
        problems,
    );
    positive(
        "server.request_body_timeout",
        s.request_body_timeout.as_millis() as u64,
        problems,
    );
    // hyper's HTTP/1 read buffer cannot be smaller; h2 takes a u32.
    if !(MIN_HEADER_BYTES..=u32::MAX as usize).contains(&s.max_request_header_bytes) {
        problems.push(Problem::invalid(
            "server.max_request_header_bytes",
            format!("must be between {MIN_HEADER_BYTES} and {}", u32::MAX),
        ));
    }
    Some(Server {
        listen: listen?,
        tls,
        header_read_timeout: s.header_read_timeout,
        drain_timeout: s.drain_timeout,
        http2: s.http2,
        limits: ServerLimits {
            max_connections: s.max_connections,
            min_connection_age: s.min_connection_age,
            http2_max_concurrent_streams: s.http2_max_concurrent_streams,
            max_request_header_bytes: s.max_request_header_bytes,
            request_body_timeout: s.request_body_timeout,
            http2_max_control_frames_per_second: s.http2_max_control_frames_per_second,
        },
        http1_half_close: s.http1_half_close,
        http1_own: s.http1_own,
    })
}
