//! `[upstream]`: the inference gateway goodput forwards to, its TLS trust, timeouts and
//! the connection budget. The file's section, its validation and the runtime value.

use std::{sync::Arc, time::Duration};

use http::{
    Uri,
    uri::{Authority, Scheme},
};
use serde::Deserialize;

use super::{Problem, file::humantime_serde, tls, validate::positive};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    pub url: Option<String>,
    pub ca_file: Option<String>,
    pub http2: bool,
    pub preserve_host: bool,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub response_header_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// Upstream connections (HTTP/2: requests) in use at once.
    pub max_connections: usize,
    /// How long a request waits for one of them; exceeded -> 503.
    #[serde(with = "humantime_serde")]
    pub pool_wait_timeout: Duration,
    /// HTTP/2 upstreams: connections opened at most; a request goes on the first one with
    /// fewer than `http2_max_streams_per_connection` streams in flight.
    pub http2_max_connections: usize,
    /// HTTP/2 upstreams: streams one connection carries before the next connection is
    /// used; set it to the upstream's SETTINGS_MAX_CONCURRENT_STREAMS, past which requests
    /// would wait inside the connection.
    pub http2_max_streams_per_connection: usize,
    /// Plain HTTP/1.1 upstreams: goodput's own client connections, which relay the
    /// response body as read, instead of hyper's.
    pub http1_relay: bool,
    /// The most a response head (status line and fields) may take; past it the client
    /// gets a 502 and the upstream connection is closed.
    pub max_response_header_bytes: usize,
    /// Bytes per second a response body must average over `min_body_rate_window`, or it
    /// is cut (0: off). Slow token streams are legitimate, hence off by default.
    pub min_body_rate: u64,
    #[serde(with = "humantime_serde")]
    pub min_body_rate_window: Duration,
}

/// hyper's smallest read buffer: a response head limit below it cannot be kept on
/// hyper's path.
pub const MIN_RESPONSE_HEADER_BYTES: usize = 8192;
/// The most `upstream.max_response_header_bytes` may be set to.
pub const MAX_RESPONSE_HEADER_BYTES: usize = 1 << 20;

impl Default for UpstreamSection {
    fn default() -> Self {
        Self {
            url: None,
            ca_file: None,
            http2: false,
            preserve_host: false,
            connect_timeout: Duration::from_secs(5),
            // Prefill of a long prompt behind a queue can take minutes; a short default
            // would turn a slow-but-healthy request into a 504.
            response_header_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(300),
            pool_idle_timeout: Duration::from_secs(90),
            pool_max_idle_per_host: 256,
            // Envoy's circuit-breaker default (max_connections, max_requests).
            max_connections: 1024,
            pool_wait_timeout: Duration::from_secs(10),
            // RFC 9113 §6.5.2 asks servers to allow at least 100 concurrent streams, and
            // 100 is what many announce; 16 connections carry 1,600 streams.
            http2_max_connections: 16,
            http2_max_streams_per_connection: 100,
            http1_relay: true,
            // The client side's head limit (`server.max_request_header_bytes`) is of the
            // same order; no inference server sends heads anywhere near it.
            max_response_header_bytes: 64 * 1024,
            min_body_rate: 0,
            // Long enough that a model pausing to think (or a tool call being prepared)
            // does not count as a trickle; short enough to free a held connection soon.
            min_body_rate_window: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    /// Path prefix of the upstream URL without a trailing slash (`""` for none).
    pub base_path: String,
    /// Trust roots and settings for `https://` upstreams (unused for `http://`).
    pub tls: Arc<rustls::ClientConfig>,
    pub http2: bool,
    pub preserve_host: bool,
    pub connect_timeout: Duration,
    pub response_header_timeout: Duration,
    pub idle_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// Upstream connections in use at once (for an HTTP/2 upstream: requests).
    pub max_connections: usize,
    /// How long a request waits for a free upstream connection before its 503.
    pub pool_wait_timeout: Duration,
    pub http2_max_connections: usize,
    pub http2_max_streams_per_connection: usize,
    pub http1_relay: bool,
    pub max_response_header_bytes: usize,
    /// `(bytes per second, window)` a response body must keep up; `None`: off.
    pub min_body_rate: Option<(u64, Duration)>,
}

/// The runtime `[upstream]`; `url` is the flag's, replacing the file's.
pub(super) fn validate(
    u: &UpstreamSection,
    url: Option<&str>,
    problems: &mut Vec<Problem>,
) -> Option<Upstream> {
    for (key, value) in [
        ("upstream.max_connections", u.max_connections as u64),
        (
            "upstream.pool_wait_timeout",
            u.pool_wait_timeout.as_millis() as u64,
        ),
        (
            "upstream.connect_timeout",
            u.connect_timeout.as_millis() as u64,
        ),
        (
            "upstream.response_header_timeout",
            u.response_header_timeout.as_millis() as u64,
        ),
        ("upstream.idle_timeout", u.idle_timeout.as_millis() as u64),
        (
            "upstream.http2_max_connections",
            u.http2_max_connections as u64,
        ),
        (
            "upstream.http2_max_streams_per_connection",
            u.http2_max_streams_per_connection as u64,
        ),
    ] {
        positive(key, value, problems);
    }
    if !(MIN_RESPONSE_HEADER_BYTES..=MAX_RESPONSE_HEADER_BYTES)
        .contains(&u.max_response_header_bytes)
    {
        problems.push(Problem::invalid(
            "upstream.max_response_header_bytes",
            format!(
                "{} is outside {MIN_RESPONSE_HEADER_BYTES}..={MAX_RESPONSE_HEADER_BYTES} bytes",
                u.max_response_header_bytes
            ),
        ));
    }
    if u.min_body_rate > 0 && u.min_body_rate_window < Duration::from_secs(1) {
        problems.push(Problem::invalid(
            "upstream.min_body_rate_window",
            format!(
                "{:?} is under 1s: a rate over a shorter window cuts healthy streams between two tokens",
                u.min_body_rate_window
            ),
        ));
    }
    let Some(raw) = url.or(u.url.as_deref()) else {
        problems.push(Problem::invalid(
            "upstream.url",
            "required: set it in the file or pass --upstream http://host:port",
        ));
        return None;
    };
    let uri: Uri = match raw.parse() {
        Ok(uri) => uri,
        Err(e) => {
            problems.push(Problem::invalid("upstream.url", format!("`{raw}`: {e}")));
            return None;
        }
    };
    let scheme = uri.scheme().cloned();
    let https = match scheme.as_ref().map(Scheme::as_str) {
        Some("http") => false,
        Some("https") => true,
        _ => {
            problems.push(Problem::invalid(
                "upstream.url",
                format!("`{raw}` must start with http:// or https://"),
            ));
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        problems.push(Problem::invalid(
            "upstream.url",
            format!("`{raw}` has no host"),
        ));
        return None;
    };
    if uri.query().is_some() {
        problems.push(Problem::invalid(
            "upstream.url",
            format!("`{raw}` must not have a query"),
        ));
    }
    if u.ca_file.is_some() && !https {
        problems.push(Problem::invalid(
            "upstream.ca_file",
            "only used with an https:// upstream",
        ));
    }
    let tls = match tls::client_config(u.ca_file.as_deref()) {
        Ok(cfg) => Arc::new(cfg),
        Err(p) => {
            problems.push(p);
            return None;
        }
    };
    Some(Upstream {
        scheme: scheme.unwrap_or(Scheme::HTTP),
        authority,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        tls,
        http2: u.http2,
        preserve_host: u.preserve_host,
        connect_timeout: u.connect_timeout,
        response_header_timeout: u.response_header_timeout,
        idle_timeout: u.idle_timeout,
        pool_idle_timeout: u.pool_idle_timeout,
        pool_max_idle_per_host: u.pool_max_idle_per_host,
        max_connections: u.max_connections,
        pool_wait_timeout: u.pool_wait_timeout,
        http2_max_connections: u.http2_max_connections,
        http2_max_streams_per_connection: u.http2_max_streams_per_connection,
        http1_relay: u.http1_relay,
        max_response_header_bytes: u.max_response_header_bytes,
        min_body_rate: (u.min_body_rate > 0).then_some((u.min_body_rate, u.min_body_rate_window)),
    })
}
