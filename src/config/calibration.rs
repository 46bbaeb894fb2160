//! `[calibration]`: scraping the upstream engine's own Prometheus endpoint and comparing
//! what the engine says with what the proxy measured (see [`crate::calibrate`]). The file
//! schema, its validation, and the runtime value. Every key is documented in
//! `config/goodput.example.toml`. All of them can change on reload: the scraper reads the
//! configuration again before every scrape.

use std::time::Duration;

use http::{Uri, uri::Scheme};
use serde::Deserialize;

use super::{Problem, Upstream, file::humantime_serde};

/// Shortest scrape interval accepted: engines render their whole registry per scrape.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// `[calibration]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CalibrationSection {
    pub enabled: bool,
    /// The engine's metrics endpoint; default: the upstream's origin + `/metrics`.
    pub url: Option<String>,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// `auto`, `vllm` or `sglang`.
    pub engine: String,
    /// NVIDIA dcgm-exporter endpoints (one per node), scraped with the engine.
    pub gpu_metrics: Vec<String>,
}

impl Default for CalibrationSection {
    fn default() -> Self {
        Self {
            enabled: false,
            url: None,
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(5),
            engine: "auto".into(),
            gpu_metrics: Vec::new(),
        }
    }
}

/// The validated `[calibration]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calibration {
    pub enabled: bool,
    /// Where the engine's metrics are scraped from (resolved even when disabled).
    pub url: Uri,
    pub interval: Duration,
    pub timeout: Duration,
    pub engine: EngineKind,
    /// dcgm-exporter endpoints scraped beside the engine (GPU utilization and memory).
    pub gpu_metrics: Vec<Uri>,
}

/// Validates `[calibration]`; `upstream` (when valid) gives the default URL. `None` when a
/// problem was pushed or the upstream is unknown (which is a problem of its own).
pub fn validate_calibration(
    s: &CalibrationSection,
    upstream: Option<&Upstream>,
    problems: &mut Vec<Problem>,
) -> Option<Calibration> {
    let before = problems.len();
    if s.interval < MIN_INTERVAL {
        problems.push(Problem::invalid(
            "calibration.interval",
            "must be at least 100ms",
        ));
    }
    if s.timeout.is_zero() {
        problems.push(Problem::invalid(
            "calibration.timeout",
            "must be greater than zero",
        ));
    } else if s.timeout > s.interval {
        problems.push(Problem::invalid(
            "calibration.timeout",
            "must not be longer than calibration.interval",
        ));
    }
    let engine = match EngineKind::parse(&s.engine) {
        Some(e) => Some(e),
        None => {
            problems.push(Problem::invalid(
                "calibration.engine",
                format!("`{}` is not one of `auto`, `vllm`, `sglang`", s.engine),
            ));
            None
        }
    };
    let url = match &s.url {
        Some(raw) => explicit_url(raw, problems, "calibration.url"),
        None => upstream.and_then(|u| default_url(u, problems)),
    };
    let gpu_metrics: Vec<Uri> = s
        .gpu_metrics
        .iter()
        .filter_map(|raw| explicit_url(raw, problems, "calibration.gpu_metrics"))
        .collect();
    match (url, engine) {
        (Some(url), Some(engine)) if problems.len() == before => Some(Calibration {
            enabled: s.enabled,
            url,
            interval: s.interval,
            timeout: s.timeout,
            engine,
            gpu_metrics,
        }),
        _ => None,
    }
}

fn explicit_url(raw: &str, problems: &mut Vec<Problem>, key: &'static str) -> Option<Uri> {
    let uri: Uri = match raw.parse() {
        Ok(u) => u,
        Err(e) => {
            problems.push(Problem::invalid(key, format!("`{raw}`: {e}")));
            return None;
        }
    };
    let http = matches!(
        uri.scheme().map(Scheme::as_str),
        Some("http") | Some("https")
    );
    if !http || uri.authority().is_none() {
        problems.push(Problem::invalid(
            key,
            format!("`{raw}` must be an absolute http:// or https:// URL"),
        ));
        return None;
    }
    Some(uri)
}

/// The upstream's origin with `/metrics`: vLLM and SGLang serve it at the root whatever
/// prefix the API is mounted under.
fn default_url(u: &Upstream, problems: &mut Vec<Problem>) -> Option<Uri> {
    let raw = format!("{}://{}/metrics", u.scheme, u.authority);
    match raw.parse() {
        Ok(uri) => Some(uri),
        Err(e) => {
            problems.push(Problem::invalid("calibration.url", format!("`{raw}`: {e}")));
            None
        }
    }
}

/// The engine the `[calibration] engine` key names; `auto` recognizes it per scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Auto,
    Vllm,
    Sglang,
}

impl EngineKind {
    pub fn parse(s: &str) -> Option<EngineKind> {
        match s {
            "auto" => Some(EngineKind::Auto),
            "vllm" => Some(EngineKind::Vllm),
            "sglang" => Some(EngineKind::Sglang),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Overrides, load_str};

    use super::*;

    fn load(toml: &str) -> Result<crate::config::Config, crate::config::ConfigError> {
        let overrides = Overrides {
            upstream: Some("https://gw.example:8443/api/".into()),
            ..Default::default()
        };
        load_str(toml, "test", &overrides)
    }

    #[test]
    fn off_by_default_with_the_upstream_origin_as_url() {
        let c = load("").unwrap().calibration;
        assert!(!c.enabled);
        assert_eq!(c.url.to_string(), "https://gw.example:8443/metrics");
        assert_eq!(c.interval, Duration::from_secs(15));
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(c.engine, EngineKind::Auto);
    }

    #[test]
    fn explicit_settings() {
        let c = load(
            "[calibration]\nenabled = true\nurl = \"http://10.0.0.7:8001/metrics\"\n\
             interval = \"30s\"\ntimeout = \"2s\"\nengine = \"sglang\"\n",
        )
        .unwrap()
        .calibration;
        assert!(c.enabled);
        assert_eq!(c.url.to_string(), "http://10.0.0.7:8001/metrics");
        assert_eq!((c.interval.as_secs(), c.timeout.as_secs()), (30, 2));
        assert_eq!(c.engine, EngineKind::Sglang);
        assert!(c.gpu_metrics.is_empty());
    }

    #[test]
    fn gpu_exporters_are_urls() {
        let c = load(
            "[calibration]\ngpu_metrics = [\"http://node-1:9400/metrics\", \"http://node-2:9400/metrics\"]\n",
        )
        .unwrap()
        .calibration;
        assert_eq!(c.gpu_metrics.len(), 2);
        assert_eq!(c.gpu_metrics[1].to_string(), "http://node-2:9400/metrics");
        let err = load("[calibration]\ngpu_metrics = [\"node-1:9400\"]\n").unwrap_err();
        assert!(err.to_string().contains("calibration.gpu_metrics"), "{err}");
    }

    #[test]
    fn every_problem_is_named() {
        let err = load(
            "[calibration]\nurl = \"ftp://x/metrics\"\ninterval = \"10ms\"\n\
             timeout = \"0s\"\nengine = \"tgi\"\n",
        )
        .unwrap_err();
        let msg = err.to_string();
        for key in [
            "calibration.url",
            "calibration.interval",
            "calibration.timeout",
            "calibration.engine",
        ] {
            assert!(msg.contains(key), "{key} missing from:\n{msg}");
        }
        assert_eq!(err.0.len(), 4, "{msg}");
        let err = load("[calibration]\ninterval = \"1s\"\ntimeout = \"2s\"\n").unwrap_err();
        assert!(err.to_string().contains("calibration.timeout"), "{err}");
        let err = load("[calibration]\nurl = \"/metrics\"\n").unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
        let err = load("[calibration]\nenable = true\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `enable`"), "{err}");
    }
}
