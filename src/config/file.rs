//! The TOML file schema: what an operator writes. Every key has a documented default (see
//! `config/goodput.example.toml`); unknown keys are rejected so a typo never silently
//! falls back to a default. Nothing here is validated beyond its type: `validate.rs` turns
//! this into the runtime [`super::Config`].

use serde::Deserialize;

/// The whole file. Every section is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: super::server::ServerSection,
    #[serde(default)]
    pub upstream: super::upstream::UpstreamSection,
    #[serde(default)]
    pub admin: super::admin::AdminSection,
    #[serde(default)]
    pub measure: super::measure::MeasureSection,
    #[serde(default)]
    pub metrics: super::metrics::MetricsSection,
    #[serde(default)]
    pub log: super::log::LogSection,
    #[serde(default)]
    pub slo: super::slo::SloSection,
    pub cost: Option<super::cost::CostSection>,
    #[serde(default)]
    pub tokenizer: super::tokenizer::TokenizerSection,
    #[serde(default)]
    pub usage_injection: super::usage_injection::UsageInjectionSection,
    #[serde(default)]
    pub profile: super::profile::ProfileSection,
    #[serde(default)]
    pub drift: super::drift::DriftSection,
    #[serde(default)]
    pub calibration: super::calibration::CalibrationSection,
    /// Export to an OpenTelemetry collector; absent: off.
    pub otlp: Option<super::otlp::OtlpSection>,
    /// A candidate that receives a mirrored share of the traffic; absent: off.
    pub shadow: Option<super::shadow::ShadowSection>,
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
