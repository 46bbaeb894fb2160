//! `[otlp]`: export to an OpenTelemetry collector over OTLP/HTTP (protobuf): the GenAI
//! semantic-convention metrics and goodput's own, and optionally one span per request (see
//! [`crate::otlp`]). The file schema, its validation and the runtime value. Every key is
//! documented in `config/goodput.example.toml`. None of them can change on reload (the
//! exporter, its client and its queues are built at start): a reload that changes one is
//! refused with the list of keys, and the running configuration stays.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use http::{HeaderName, HeaderValue, Uri, uri::Scheme};
use serde::Deserialize;

use super::restart::Changed;
use super::{Problem, file::humantime_serde, tls};

/// Shortest metric export interval accepted: every export encodes every series.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// `[otlp]` as written. The section's presence turns export on; `endpoint` is then required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpSection {
    /// The collector's base URL; `/v1/metrics` and `/v1/traces` are appended.
    pub endpoint: Option<String>,
    pub metrics: bool,
    pub traces: bool,
    /// Sent with every export (e.g. an API key); values are never logged.
    pub headers: BTreeMap<String, String>,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub service_name: String,
    /// `gen_ai.provider.name`; default: from each request's API dialect.
    pub provider_name: Option<String>,
    pub queue_size: usize,
    pub batch_size: usize,
    /// Extra trust roots for an `https://` collector behind a private CA.
    pub ca_file: Option<String>,
}

impl Default for OtlpSection {
    fn default() -> Self {
        // The OpenTelemetry SDK defaults (OTEL_METRIC_EXPORT_INTERVAL,
        // OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE).
        Self {
            endpoint: None,
            metrics: true,
            traces: false,
            headers: BTreeMap::new(),
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            service_name: "goodput".into(),
            provider_name: None,
            queue_size: 2048,
            batch_size: 512,
            ca_file: None,
        }
    }
}

/// The validated `[otlp]`.
#[derive(Debug, Clone)]
pub struct Otlp {
    /// The base URL as configured (without a trailing `/`).
    pub endpoint: String,
    pub metrics_url: Uri,
    pub traces_url: Uri,
    pub metrics: bool,
    pub traces: bool,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub interval: Duration,
    pub timeout: Duration,
    pub service_name: String,
    pub provider_name: Option<String>,
    pub queue_size: usize,
    pub batch_size: usize,
    pub ca_file: Option<String>,
    /// Trust roots for an `https://` collector.
    pub tls: Arc<rustls::ClientConfig>,
}

/// The exporter is built once: anything it was built from needs a restart.
pub(super) fn restart_only(old: Option<&Otlp>, new: Option<&Otlp>, changed: &mut Changed) {
    let same = match (old, new) {
        (None, None) => true,
        (Some(o), Some(n)) => o.same_exporter(n),
        _ => false,
    };
    changed.check(&same, &true, "otlp");
}

impl Otlp {
    /// Whether a reload from `self` to `other` would change anything the exporter was
    /// built from.
    pub fn same_exporter(&self, other: &Otlp) -> bool {
        self.endpoint == other.endpoint
            && self.metrics == other.metrics
            && self.traces == other.traces
            && self.headers == other.headers
            && self.interval == other.interval
            && self.timeout == other.timeout
            && self.service_name == other.service_name
            && self.provider_name == other.provider_name
            && self.queue_size == other.queue_size
            && self.batch_size == other.batch_size
            && self.ca_file == other.ca_file
    }
}

/// Validates `[otlp]`; `None` when the section is absent or a problem was pushed.
pub fn validate_otlp(section: Option<&OtlpSection>, problems: &mut Vec<Problem>) -> Option<Otlp> {
    let s = section?;
    let before = problems.len();
    let endpoint = match s.endpoint.as_deref().map(str::trim) {
        None | Some("") => {
            problems.push(Problem::invalid(
                "otlp.endpoint",
                "required when [otlp] is present, e.g. \"http://127.0.0.1:4318\"",
            ));
            None
        }
        Some(raw) => endpoint(raw, problems),
    };
    if !s.metrics && !s.traces {
        problems.push(Problem::invalid(
            "otlp",
            "metrics and traces are both off: remove the section or turn one on",
        ));
    }
    if s.interval < MIN_INTERVAL {
        problems.push(Problem::invalid("otlp.interval", "must be at least 100ms"));
    }
    if s.timeout.is_zero() {
        problems.push(Problem::invalid(
            "otlp.timeout",
            "must be greater than zero",
        ));
    }
    if s.service_name.trim().is_empty() {
        problems.push(Problem::invalid("otlp.service_name", "must not be empty"));
    }
    if s.provider_name
        .as_deref()
        .is_some_and(|p| p.trim().is_empty())
    {
        problems.push(Problem::invalid(
            "otlp.provider_name",
            "must not be empty (leave it out to derive it from the API)",
        ));
    }
    if s.queue_size == 0 {
        problems.push(Problem::invalid(
            "otlp.queue_size",
            "must be greater than zero",
        ));
    }
    if s.batch_size == 0 || s.batch_size > s.queue_size.max(1) {
        problems.push(Problem::invalid(
            "otlp.batch_size",
            "must be between 1 and otlp.queue_size",
        ));
    }
    let headers = headers(&s.headers, problems);
    let https = endpoint
        .as_ref()
        .is_some_and(|(base, _, _)| base.starts_with("https://"));
    if s.ca_file.is_some() && endpoint.is_some() && !https {
        problems.push(Problem::invalid(
            "otlp.ca_file",
            "only used with an https:// endpoint",
        ));
    }
    let tls = match tls::client_config_for("otlp.ca_file", s.ca_file.as_deref()) {
        Ok(c) => Some(Arc::new(c)),
        Err(p) => {
            problems.push(p);
            None
        }
    };
    match (endpoint, tls) {
        (Some((endpoint, metrics_url, traces_url)), Some(tls)) if problems.len() == before => {
            Some(Otlp {
                endpoint,
                metrics_url,
                traces_url,
                metrics: s.metrics,
                traces: s.traces,
                headers,
                interval: s.interval,
                timeout: s.timeout,
                service_name: s.service_name.trim().to_owned(),
                provider_name: s.provider_name.as_deref().map(|p| p.trim().to_owned()),
                queue_size: s.queue_size,
                batch_size: s.batch_size,
                ca_file: s.ca_file.clone(),
                tls,
            })
        }
        _ => None,
    }
}

/// The base URL and the two signal URLs (OTLP/HTTP: `<base>/v1/metrics`, `<base>/v1/traces`).
fn endpoint(raw: &str, problems: &mut Vec<Problem>) -> Option<(String, Uri, Uri)> {
    let uri: Uri = match raw.parse() {
        Ok(u) => u,
        Err(e) => {
            problems.push(Problem::invalid("otlp.endpoint", format!("`{raw}`: {e}")));
            return None;
        }
    };
    let http = matches!(
        uri.scheme().map(Scheme::as_str),
        Some("http") | Some("https")
    );
    if !http || uri.authority().is_none() {
        problems.push(Problem::invalid(
            "otlp.endpoint",
            format!("`{raw}` must be an absolute http:// or https:// URL"),
        ));
        return None;
    }
    if uri.query().is_some() {
        problems.push(Problem::invalid(
            "otlp.endpoint",
            format!("`{raw}` must not have a query: it is the base the signal paths go under"),
        ));
        return None;
    }
    let base = raw.trim_end_matches('/').to_owned();
    let mut signal = |path: &str| -> Option<Uri> {
        match format!("{base}{path}").parse() {
            Ok(u) => Some(u),
            Err(e) => {
                problems.push(Problem::invalid("otlp.endpoint", format!("`{raw}`: {e}")));
                None
            }
        }
    };
    let metrics = signal("/v1/metrics")?;
    let traces = signal("/v1/traces")?;
    Some((base, metrics, traces))
}

fn headers(
    raw: &BTreeMap<String, String>,
    problems: &mut Vec<Problem>,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let key = format!("otlp.headers.{name}");
        let Ok(n) = HeaderName::from_bytes(name.as_bytes()) else {
            problems.push(Problem::invalid(key, "not a valid header name"));
            continue;
        };
        if matches!(
            n.as_str(),
            "content-type" | "content-length" | "host" | "transfer-encoding" | "content-encoding"
        ) {
            problems.push(Problem::invalid(
                key,
                "set by the exporter itself and cannot be configured",
            ));
            continue;
        }
        // The value is a secret as often as not: never echo it in the problem.
        match HeaderValue::from_str(value) {
            Ok(mut v) => {
                v.set_sensitive(true);
                out.push((n, v));
            }
            Err(_) => problems.push(Problem::invalid(
                key,
                "the value is not a valid header value (visible ASCII only)",
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, Overrides, load_str};

    use super::*;

    fn load(toml: &str) -> Result<crate::config::Config, ConfigError> {
        let overrides = Overrides {
            upstream: Some("http://127.0.0.1:8000".into()),
            ..Default::default()
        };
        load_str(toml, "test", &overrides)
    }

    fn problems(toml: &str) -> String {
        load(toml).unwrap_err().to_string()
    }

    #[test]
    fn off_without_the_section() {
        assert!(load("").unwrap().otlp.is_none());
    }

    #[test]
    fn defaults_with_an_endpoint() {
        let o = load("[otlp]\nendpoint = \"http://127.0.0.1:4318/\"\n")
            .unwrap()
            .otlp
            .unwrap();
        assert_eq!(o.endpoint, "http://127.0.0.1:4318");
        assert_eq!(
            o.metrics_url.to_string(),
            "http://127.0.0.1:4318/v1/metrics"
        );
        assert_eq!(o.traces_url.to_string(), "http://127.0.0.1:4318/v1/traces");
        assert!(o.metrics);
        assert!(!o.traces);
        assert!(o.headers.is_empty());
        assert_eq!(o.interval, Duration::from_secs(60));
        assert_eq!(o.timeout, Duration::from_secs(10));
        assert_eq!(o.service_name, "goodput");
        assert_eq!(o.provider_name, None);
        assert_eq!((o.queue_size, o.batch_size), (2048, 512));
    }

    #[test]
    fn explicit_settings_and_a_path_prefix() {
        let o = load(
            "[otlp]\nendpoint = \"https://otel.example/otlp\"\ntraces = true\nmetrics = false\n\
             interval = \"15s\"\ntimeout = \"2s\"\nservice_name = \"gw-proxy\"\n\
             provider_name = \"vllm\"\nqueue_size = 100\nbatch_size = 10\n\
             [otlp.headers]\nauthorization = \"Bearer s3cret\"\n",
        )
        .unwrap()
        .otlp
        .unwrap();
        assert_eq!(
            o.traces_url.to_string(),
            "https://otel.example/otlp/v1/traces"
        );
        assert!(o.traces && !o.metrics);
        assert_eq!(o.interval, Duration::from_secs(15));
        assert_eq!(o.timeout, Duration::from_secs(2));
        assert_eq!(o.service_name, "gw-proxy");
        assert_eq!(o.provider_name.as_deref(), Some("vllm"));
        assert_eq!((o.queue_size, o.batch_size), (100, 10));
        assert_eq!(o.headers.len(), 1);
        assert_eq!(o.headers[0].0, "authorization");
        assert!(o.headers[0].1.is_sensitive());
    }

    #[test]
    fn every_problem_at_once() {
        let p = problems(
            "[otlp]\nmetrics = false\ninterval = \"10ms\"\ntimeout = \"0s\"\n\
             service_name = \" \"\nprovider_name = \"\"\nqueue_size = 0\nbatch_size = 5\n\
             [otlp.headers]\n\"bad header\" = \"x\"\ncontent-type = \"text/plain\"\n\
             x-key = \"line\\nbreak\"\n",
        );
        for needle in [
            "otlp.endpoint",
            "metrics and traces are both off",
            "otlp.interval",
            "otlp.timeout",
            "otlp.service_name",
            "otlp.provider_name",
            "otlp.queue_size",
            "otlp.batch_size",
            "otlp.headers.bad header",
            "otlp.headers.content-type",
            "otlp.headers.x-key",
        ] {
            assert!(p.contains(needle), "{needle} missing from: {p}");
        }
        assert!(!p.contains("line"), "a header value leaked: {p}");
    }

    #[test]
    fn endpoint_must_be_an_http_base_url() {
        for bad in [
            "127.0.0.1:4318",
            "grpc://collector:4317",
            "/v1/traces",
            "http://collector:4318/?a=b",
        ] {
            let p = problems(&format!("[otlp]\nendpoint = \"{bad}\"\n"));
            assert!(p.contains("otlp.endpoint"), "{bad}: {p}");
        }
        let p = problems("[otlp]\nendpoint = \"http://c:4318\"\nca_file = \"/nonexistent\"\n");
        assert!(p.contains("otlp.ca_file"), "{p}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let p = problems("[otlp]\nendpoint = \"http://c:4318\"\ntrace = true\n");
        assert!(p.contains("trace"), "{p}");
    }

    /// The example's commented-out `[otlp]` section: every key is there, and uncommented
    /// it loads.
    #[test]
    fn the_example_config_documents_every_key() {
        let text = include_str!("../../config/goodput.example.toml");
        let section = text
            .split("\n# [otlp]\n")
            .nth(1)
            .expect("the example has a commented-out [otlp] section");
        let section = section.split("\n[").next().unwrap_or(section);
        let settings: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ")
                    .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            })
            .collect();
        for key in [
            "endpoint",
            "metrics",
            "traces",
            "headers",
            "interval",
            "timeout",
            "service_name",
            "provider_name",
            "queue_size",
            "batch_size",
            "ca_file",
        ] {
            assert!(
                settings.iter().any(|l| l.starts_with(&format!("{key} = "))),
                "otlp.{key} is not in the example's [otlp] section"
            );
        }
        // Uncommented (without ca_file, which names a file, and with an http endpoint),
        // the section loads.
        let uncommented: String = settings
            .iter()
            .filter(|l| !l.starts_with("ca_file"))
            .map(|l| format!("{l}\n"))
            .collect();
        let o = load(&format!("[otlp]\n{uncommented}"))
            .unwrap()
            .otlp
            .unwrap();
        assert!(o.endpoint.starts_with("http://"));
    }
}
