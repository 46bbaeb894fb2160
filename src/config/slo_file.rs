//! The `[slo]` and `[cost]` sections of the config file (schema only; see `slo.rs` for the
//! validated form). Key names are a contract with users' configs.

use std::time::Duration;

use serde::Deserialize;

use super::file::humantime_serde;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloSection {
    /// Sliding windows reported, e.g. `["1m", "5m", "1h"]`.
    pub windows: Vec<String>,
    /// Request header naming the tenant; its value is only kept as a salted hash.
    pub tenant_header: Option<String>,
    /// Salt for tenant hashes; random per process when absent (hashes then can't be
    /// linked across restarts).
    pub tenant_salt: Option<String>,
    /// Honour per-request `x-slo-ttft-ms` / `x-slo-tpot-ms` / `x-slo-e2e-ms` headers.
    pub override_headers: bool,
    /// Samples a concurrency level needs before it can count as stable.
    pub min_samples: u64,
    /// Upper bounds (tokens) of the input-length buckets TTFT is broken down by.
    pub input_buckets: Vec<u64>,
    /// How long per-window series are kept for the stability view.
    #[serde(with = "humantime_serde")]
    pub history: Duration,
    /// Points of the dashboard's timeline (`/api/v1/timeline`): one per slice of the
    /// shortest window (5 s for 1m), so 720 is the last hour.
    pub timeline_points: usize,
    /// A request whose body is at least this many bytes counts as long-input when asking
    /// whether long requests slow down short ones (≈ 4 bytes per token).
    pub long_input_bytes: u64,
    /// Upstream 4xx statuses caused by the request itself: outcome `client_error`,
    /// excluded from attainment. 429 is always a rejection.
    pub client_error_statuses: Vec<u16>,
    /// The classes, first match wins.
    pub class: Vec<ClassSection>,
    /// Targets of the class that takes every request no other class matched.
    pub default: TargetsSection,
}

impl Default for SloSection {
    fn default() -> Self {
        Self {
            windows: vec!["1m".into(), "5m".into(), "1h".into()],
            tenant_header: None,
            tenant_salt: None,
            override_headers: false,
            min_samples: 20,
            input_buckets: vec![1024, 4096, 16384, 65536],
            history: Duration::from_secs(6 * 3600),
            timeline_points: 720,
            long_input_bytes: 64 * 1024,
            client_error_statuses: crate::measure::record::DEFAULT_CLIENT_ERROR_STATUSES.to_vec(),
            class: Vec::new(),
            default: TargetsSection::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSection {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matches: MatchSection,
    #[serde(flatten)]
    pub targets: TargetsSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSection {
    /// Glob over the request's model (`*` and `?`).
    pub model: Option<String>,
    /// An API label (`chat_completions`, `completions`, ...) or `chat` for every chat API.
    pub api: Option<String>,
    /// Tenant header value (compared by salted hash).
    pub tenant: Option<String>,
    /// Largest input (tokens) this class takes.
    pub input_tokens_max: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetsSection {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    /// Share of requests that must meet the targets, e.g. 0.99.
    pub attainment: f64,
    /// Largest share of requests that may end in an upstream or proxy error
    /// (`upstream_error`, `upstream_reset`, `proxy_error`); the class fails above it.
    pub error_rate_max: Option<f64>,
    /// Percentile targets, e.g. `[{ metric = "ttft", quantile = 0.95, max_ms = 800 }]`.
    pub percentiles: Vec<PercentileSection>,
}

impl Default for TargetsSection {
    fn default() -> Self {
        Self {
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: None,
            attainment: 0.99,
            error_rate_max: None,
            percentiles: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PercentileSection {
    /// `ttft`, `tpot`, `itl` or `e2e`.
    pub metric: String,
    pub quantile: f64,
    pub max_ms: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostSection {
    pub currency: String,
    pub per_hour: PerHourSection,
    /// One-time costs by name (migration, integration, upgrade, ...), spread over
    /// `amortize_months`.
    pub one_time: std::collections::BTreeMap<String, f64>,
    pub amortize_months: f64,
    /// Power drawn by the serving system, kW; with `energy_price_per_kwh` the energy cost.
    pub kw: Option<f64>,
    pub energy_price_per_kwh: Option<f64>,
    /// Share of paid hours the system stands idle, and share lost to failures and
    /// maintenance: the hours that serve carry the cost of the others.
    pub idle_share: f64,
    pub failure_share: f64,
}

/// Months one-time costs are spread over unless set (a three-year depreciation).
pub const DEFAULT_AMORTIZE_MONTHS: f64 = 36.0;

impl Default for CostSection {
    fn default() -> Self {
        Self {
            currency: "USD".into(),
            per_hour: PerHourSection::default(),
            one_time: std::collections::BTreeMap::new(),
            amortize_months: DEFAULT_AMORTIZE_MONTHS,
            kw: None,
            energy_price_per_kwh: None,
            idle_share: 0.0,
            failure_share: 0.0,
        }
    }
}

/// Cost of the serving system per hour, by component; each optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerHourSection {
    pub hardware: Option<f64>,
    pub power: Option<f64>,
    pub hosting: Option<f64>,
    pub licences: Option<f64>,
    pub operations: Option<f64>,
}
