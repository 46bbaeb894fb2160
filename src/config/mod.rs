//! Configuration: one TOML file ([`file`]), overridden by command-line flags, validated
//! into a runtime [`Config`] snapshot. Validation collects every problem at once so an
//! operator fixes the file in one pass; it never panics.

pub mod admin;
pub mod calibration;
pub mod cost;
pub mod drift;
pub mod file;
pub mod log;
pub mod measure;
pub mod metrics;
pub mod otlp;
pub mod profile;
mod restart;
pub mod server;
pub mod shadow;
pub mod slo;
mod tls;
pub mod tokenizer;
pub mod upstream;
pub mod usage_injection;
mod validate;

use std::{net::SocketAddr, path::Path};

pub use admin::{AdminAccess, AdminToken};
pub use calibration::Calibration;
pub use cost::Cost;
pub use drift::DriftConfig;
pub use log::{Log, LogFormat};
pub use measure::Measure;
pub use metrics::MetricsConfig;
pub use otlp::Otlp;
pub use profile::ProfileConfig;
pub use server::{Server, ServerLimits};
pub use shadow::ShadowConfig;
pub use tokenizer::Counting;
pub use upstream::{MIN_RESPONSE_HEADER_BYTES, Upstream};
pub use usage_injection::UsageInjection;
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
    /// Native-histogram precision of the latency metrics (`[metrics]`).
    pub metrics: MetricsConfig,
    pub log: Log,
    pub slo: crate::slo::Slo,
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
    /// A candidate mirrored to (`[shadow]`); `None` when off.
    pub shadow: Option<ShadowConfig>,
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
