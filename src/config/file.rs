//! The TOML file schema: what an operator writes. Every key has a documented default (see
//! `config/goodput.example.toml`); unknown keys are rejected so a typo never silently
//! falls back to a default. Nothing here is validated beyond its type: `validate.rs` turns
//! this into the runtime [`super::Config`].

use std::time::Duration;

use serde::Deserialize;

/// The whole file. Every section is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub upstream: UpstreamSection,
    #[serde(default)]
    pub admin: AdminSection,
    #[serde(default)]
    pub measure: MeasureSection,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub slo: super::slo_file::SloSection,
    pub cost: Option<super::slo_file::CostSection>,
    #[serde(default)]
    pub tokenizer: super::counting::TokenizerSection,
    #[serde(default)]
    pub usage_injection: super::counting::UsageInjectionSection,
    #[serde(default)]
    pub profile: super::profile_file::ProfileSection,
    #[serde(default)]
    pub drift: super::profile_file::DriftSection,
    #[serde(default)]
    pub calibration: super::calibration::CalibrationSection,
    /// Export to an OpenTelemetry collector; absent: off.
    pub otlp: Option<super::otlp::OtlpSection>,
}

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
    /// Client connections served at once; more are closed at once on accept.
    pub max_connections: usize,
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
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: String,
    pub key: String,
}

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
}

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
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    pub listen: String,
    /// A file holding the bearer token the admin endpoints require (none: open).
    pub token_file: Option<String>,
    /// Whether `/metrics` needs the token too (off: scrapers need no credentials).
    pub metrics_auth: bool,
    /// `[admin.tls]`: serve the admin endpoints over HTTPS.
    pub tls: Option<TlsSection>,
}

impl Default for AdminSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".into(),
            token_file: None,
            metrics_auth: false,
            tls: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeasureSection {
    pub request_inspect_limit: u64,
    pub response_inspect_limit: u64,
    pub channel_capacity: usize,
    pub recent_requests: usize,
    pub max_models: usize,
    /// Time request arrivals and upstream reads by the kernel's receive stamps.
    pub kernel_timestamps: bool,
}

impl Default for MeasureSection {
    fn default() -> Self {
        Self {
            request_inspect_limit: 8 << 20,
            response_inspect_limit: 8 << 20,
            channel_capacity: 8192,
            recent_requests: 1000,
            max_models: 50,
            kernel_timestamps: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    pub format: String,
    pub level: String,
    pub access_log: bool,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: "text".into(),
            level: "info".into(),
            access_log: true,
        }
    }
}

/// Durations are written the way operators say them: `"30s"`, `"5m"`, `"250ms"`.
pub(crate) mod humantime_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, de::Error};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| D::Error::custom(format!("`{s}`: {e}")))
    }
}
