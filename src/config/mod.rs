//! Configuration: one TOML file ([`file`]), overridden by command-line flags, validated
//! into a runtime [`Config`] snapshot. Validation collects every problem at once so an
//! operator fixes the file in one pass; it never panics.

pub mod admin;
pub mod calibration;
pub mod counting;
pub mod file;
pub mod otlp;
pub mod profile_file;
pub mod slo;
pub mod slo_file;
mod tls;
mod validate;

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use http::uri::{Authority, Scheme};

pub use admin::{AdminAccess, AdminToken};
pub use calibration::Calibration;
pub use counting::{Counting, UsageInjection};
pub use otlp::Otlp;
pub use profile_file::{DriftConfig, ProfileConfig};
pub use slo::{Cost, Slo, SloClass};
pub use validate::{load, load_str, load_with_salt};

/// Values given on the command line; each replaces the file's value.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub admin: Option<String>,
}

/// The validated runtime configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub upstream: Upstream,
    /// The admin listener's address (`[admin] listen`).
    pub admin: SocketAddr,
    /// Token, `/metrics` protection and TLS of the admin listener (`[admin]`).
    pub admin_access: AdminAccess,
    pub measure: Measure,
    pub log: Log,
    pub slo: Slo,
    pub cost: Option<Cost>,
    /// Token counting when the upstream reports no usage (`[tokenizer]`).
    pub tokenizer: Counting,
    pub usage_injection: UsageInjection,
    /// Anonymized traffic recording (`[profile]`); `dir: None` means off.
    pub profile: ProfileConfig,
    /// Live drift detection (`[drift]`); `None` when no baseline is configured.
    pub drift: Option<DriftConfig>,
    /// Comparison with the engine's own metrics (`[calibration]`).
    pub calibration: Calibration,
    /// Export to an OpenTelemetry collector (`[otlp]`); `None` when off.
    pub otlp: Option<Otlp>,
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
}

/// What one client, or all of them together, may hold of the proxy.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub http2_max_concurrent_streams: u32,
    pub max_request_header_bytes: usize,
    pub request_body_timeout: Duration,
    pub http2_max_control_frames_per_second: u32,
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
}

#[derive(Debug, Clone)]
pub struct Measure {
    pub request_inspect_limit: usize,
    pub response_inspect_limit: usize,
    pub channel_capacity: usize,
    pub recent_requests: usize,
    pub max_models: usize,
    /// Reads timed by the kernel's receive stamps where it gives them (`proxy::wire`).
    pub kernel_timestamps: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct Log {
    pub format: LogFormat,
    pub level: String,
    pub access_log: bool,
}

/// One thing wrong with the configuration.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("{key}: cannot read `{path}`: {source}")]
    Io {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

impl Problem {
    pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Every problem found in one configuration.
#[derive(Debug, thiserror::Error)]
#[error("{}", render(.0))]
pub struct ConfigError(pub Vec<Problem>);

fn render(problems: &[Problem]) -> String {
    let mut out = format!("{} problem(s) in the configuration:", problems.len());
    for p in problems {
        out.push_str("\n  - ");
        out.push_str(&p.to_string());
    }
    out
}

/// Validates a file without any overrides, as `goodput check-config` does.
pub fn check(path: &Path) -> Result<Config, ConfigError> {
    load(Some(path), &Overrides::default())
}

impl Config {
    /// Settings that are valid but probably unintended (printed by `check-config`, logged
    /// at start); never a reason to refuse the configuration.
    pub fn warnings(&self) -> Vec<String> {
        admin::warnings(self.admin, &self.admin_access)
    }
}
