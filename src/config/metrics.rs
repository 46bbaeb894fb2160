//! `[metrics]`: how the latency histograms on `/metrics` keep their native buckets (served
//! in the Prometheus protobuf exposition; docs/METRICS.md "Native histograms"), and the OTLP
//! export's exponential histograms the same precision. The file's section, its validation
//! and the runtime value.

use serde::Deserialize;

use super::Problem;

/// The schema Prometheus accepts (`-4..=8`): bucket boundaries grow by `2^(2^-schema)`.
const SCHEMA_RANGE: std::ops::RangeInclusive<i8> = -4..=8;

/// Schema 6: buckets grow by 2^(1/64) ≈ 1.0109, so a quantile read from them is within
/// 0.54 % of the true value (schema 5 would give 1.08 %, over the 1 % aimed at).
pub const DEFAULT_SCHEMA: i8 = 6;

/// 512 buckets hold 8 doublings (a spread of 256x between the fastest and the slowest
/// request of a series) at schema 6, in 8 KiB per series; a wider spread halves the
/// resolution (schema 5, 1.08 %) rather than growing.
pub const DEFAULT_MAX_BUCKETS: u32 = 512;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Resolution of the native buckets: `-4` (coarsest) to `8` (finest).
    pub native_histogram_schema: i8,
    /// Most native buckets a series keeps; past it the series halves its resolution.
    pub native_histogram_max_buckets: u32,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            native_histogram_schema: DEFAULT_SCHEMA,
            native_histogram_max_buckets: DEFAULT_MAX_BUCKETS,
        }
    }
}

/// The runtime `[metrics]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsConfig {
    pub native_histogram_schema: i8,
    pub native_histogram_max_buckets: u32,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            native_histogram_schema: DEFAULT_SCHEMA,
            native_histogram_max_buckets: DEFAULT_MAX_BUCKETS,
        }
    }
}

pub(super) fn validate_metrics(s: &MetricsSection, problems: &mut Vec<Problem>) -> MetricsConfig {
    if !SCHEMA_RANGE.contains(&s.native_histogram_schema) {
        problems.push(Problem::invalid(
            "metrics.native_histogram_schema",
            "must be in -4..=8 (6: at most 0.54 % relative error)",
        ));
    }
    if s.native_histogram_max_buckets == 0 {
        problems.push(Problem::invalid(
            "metrics.native_histogram_max_buckets",
            "must be at least 1",
        ));
    }
    MetricsConfig {
        native_histogram_schema: s.native_histogram_schema,
        native_histogram_max_buckets: s.native_histogram_max_buckets,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError, Overrides};

    fn load_str(toml: &str) -> Result<Config, ConfigError> {
        let overrides = Overrides {
            upstream: Some("http://127.0.0.1:8000".into()),
            ..Default::default()
        };
        crate::config::load_str(toml, "test", &overrides)
    }

    #[test]
    fn defaults_and_bounds() {
        let c = load_str("").unwrap();
        assert_eq!(c.metrics.native_histogram_schema, 6);
        assert_eq!(c.metrics.native_histogram_max_buckets, 512);
        let c = load_str("[metrics]\nnative_histogram_schema = 3\n").unwrap();
        assert_eq!(c.metrics.native_histogram_schema, 3);
        let err = load_str("[metrics]\nnative_histogram_schema = 9\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics.native_histogram_schema"), "{err}");
        let err = load_str("[metrics]\nnative_histogram_max_buckets = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metrics.native_histogram_max_buckets"),
            "{err}"
        );
    }
}
