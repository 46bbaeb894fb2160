//! `[slo]`: the classes a request is held to, their targets and how requests are matched
//! to them. The file's section (key names are a contract with users' configs) and its
//! validation into the runtime value, [`crate::slo::Slo`], which holds the behaviour.

use std::time::Duration;

use http::HeaderName;

use serde::Deserialize;

use super::{Problem, file::humantime_serde};
use crate::slo::{
    ApiMatch, DEFAULT_CLASS, HeaderObjectives, LatencyMetric, Matcher, PercentileTarget, Slo,
    SloClass, Targets, tenant_hash,
};
use crate::slo::{DEFAULT_CLIENT_ERROR_STATUSES, MAX_TIMELINE_POINTS};

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
    /// Honour per-request `x-slo-ttft-ms` / `x-slo-tpot-ms` / `x-slo-e2e-ms` headers
    /// (the older spelling of `header_objectives = "override"`).
    pub override_headers: bool,
    /// Per-request objectives from `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms` (and the
    /// deprecated `x-slo-ttft-ms` / `x-slo-tpot-ms`, and `x-slo-e2e-ms`): `off`, `tighten`
    /// (a header may only make a class's target stricter) or `override` (trusted clients).
    pub header_objectives: Option<HeaderObjectives>,
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
            header_objectives: None,
            min_samples: 20,
            input_buckets: vec![1024, 4096, 16384, 65536],
            history: Duration::from_secs(6 * 3600),
            timeline_points: 720,
            long_input_bytes: 64 * 1024,
            client_error_statuses: DEFAULT_CLIENT_ERROR_STATUSES.to_vec(),
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

fn targets(
    key: &str,
    t: &TargetsSection,
    problems: &mut Vec<Problem>,
) -> (Targets, Vec<PercentileTarget>) {
    for (name, v) in [
        ("ttft_ms", t.ttft_ms),
        ("tpot_ms", t.tpot_ms),
        ("e2e_ms", t.e2e_ms),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0)
        {
            problems.push(Problem::invalid(
                format!("{key}.{name}"),
                "must be a positive number of ms",
            ));
        }
    }
    if !(t.attainment > 0.0 && t.attainment <= 1.0) {
        problems.push(Problem::invalid(
            format!("{key}.attainment"),
            "must be in (0, 1], e.g. 0.99",
        ));
    }
    if let Some(e) = t.error_rate_max
        && !(0.0..=1.0).contains(&e)
    {
        problems.push(Problem::invalid(
            format!("{key}.error_rate_max"),
            "must be in [0, 1], e.g. 0.01",
        ));
    }
    let mut percentiles = Vec::new();
    for (i, p) in t.percentiles.iter().enumerate() {
        let pkey = format!("{key}.percentiles[{i}]");
        let metric = match p.metric.as_str() {
            "ttft" => Some(LatencyMetric::Ttft),
            "tpot" => Some(LatencyMetric::Tpot),
            "itl" => Some(LatencyMetric::Itl),
            "e2e" => Some(LatencyMetric::E2e),
            other => {
                problems.push(Problem::invalid(
                    format!("{pkey}.metric"),
                    format!("`{other}` is not one of ttft, tpot, itl, e2e"),
                ));
                None
            }
        };
        if !(p.quantile > 0.0 && p.quantile < 1.0) {
            problems.push(Problem::invalid(
                format!("{pkey}.quantile"),
                "must be in (0, 1), e.g. 0.95",
            ));
        }
        if !(p.max_ms.is_finite() && p.max_ms > 0.0) {
            problems.push(Problem::invalid(
                format!("{pkey}.max_ms"),
                "must be a positive number",
            ));
        }
        if let Some(metric) = metric {
            percentiles.push(PercentileTarget {
                metric,
                quantile: p.quantile,
                max_ms: p.max_ms,
            });
        }
    }
    (
        Targets {
            ttft_ms: t.ttft_ms,
            tpot_ms: t.tpot_ms,
            e2e_ms: t.e2e_ms,
        },
        percentiles,
    )
}

fn class(i: usize, c: &ClassSection, salt: &str, problems: &mut Vec<Problem>) -> SloClass {
    let key = format!("slo.class[{i}] ({})", c.name);
    if c.name.is_empty() || c.name == DEFAULT_CLASS || !c.name.bytes().all(|b| b.is_ascii_graphic())
    {
        problems.push(Problem::invalid(
            format!("{key}.name"),
            "must be a non-empty name without spaces, and not `default` or `overall`",
        ));
    }
    let (targets, percentiles) = targets(&key, &c.targets, problems);
    SloClass {
        name: c.name.as_str().into(),
        matcher: Matcher {
            model: c.matches.model.clone(),
            api: c.matches.api.as_deref().and_then(|a| {
                let parsed = ApiMatch::parse(a);
                if parsed.is_none() {
                    problems.push(Problem::invalid(
                        format!("{key}.match.api"),
                        format!(
                            "`{a}` is not an API label (chat_completions, completions, responses, messages, tgi_generate, llamacpp_completion, ollama_chat, ollama_generate, embeddings, unknown, upgrade) nor `chat` or `completion`"
                        ),
                    ));
                }
                parsed
            }),
            tenant: c
                .matches
                .tenant
                .as_deref()
                .map(|t| tenant_hash(salt, t.as_bytes())),
            input_tokens_max: c.matches.input_tokens_max,
        },
        targets,
        attainment: c.targets.attainment,
        error_rate_max: c.targets.error_rate_max,
        percentiles,
    }
}

/// `header_objectives`, or what the older `override_headers` says when it is not set.
fn header_objectives(s: &SloSection, problems: &mut Vec<Problem>) -> HeaderObjectives {
    match (s.header_objectives, s.override_headers) {
        (None, true) => HeaderObjectives::Override,
        (None, false) => HeaderObjectives::Off,
        (Some(mode), true) if mode != HeaderObjectives::Override => {
            problems.push(Problem::invalid(
                "slo.override_headers",
                format!(
                    "`override_headers = true` contradicts `header_objectives = \"{}\"`; \
                     keep only `header_objectives`",
                    mode.as_str()
                ),
            ));
            mode
        }
        (Some(mode), _) => mode,
    }
}

/// Validates `[slo]`. `salt` is the process's tenant salt when none is configured, so a
/// reload keeps tenant hashes stable.
pub fn validate(s: &SloSection, salt: &str, problems: &mut Vec<Problem>) -> Slo {
    let mut windows = Vec::new();
    for w in &s.windows {
        match humantime::parse_duration(w) {
            Ok(d) if d >= Duration::from_secs(1) => windows.push(d),
            _ => problems.push(Problem::invalid(
                "slo.windows",
                format!("`{w}` is not a duration ≥ 1s"),
            )),
        }
    }
    if s.windows.is_empty() {
        problems.push(Problem::invalid(
            "slo.windows",
            "needs at least one window, e.g. \"5m\"",
        ));
    }
    let tenant_header =
        s.tenant_header
            .as_deref()
            .and_then(|h| match HeaderName::from_bytes(h.as_bytes()) {
                Ok(name) => Some(name),
                Err(_) => {
                    problems.push(Problem::invalid(
                        "slo.tenant_header",
                        format!("`{h}` is not a header name"),
                    ));
                    None
                }
            });
    if !s.input_buckets.windows(2).all(|w| w[0] < w[1]) || s.input_buckets.is_empty() {
        problems.push(Problem::invalid(
            "slo.input_buckets",
            "must be a non-empty ascending list",
        ));
    }
    if s.timeline_points > MAX_TIMELINE_POINTS {
        problems.push(Problem::invalid(
            "slo.timeline_points",
            format!(
                "{} is more than the {} points the timeline keeps at most",
                s.timeline_points, MAX_TIMELINE_POINTS
            ),
        ));
    }
    let salt = s.tenant_salt.clone().unwrap_or_else(|| salt.to_owned());
    let classes: Vec<SloClass> = s
        .class
        .iter()
        .enumerate()
        .map(|(i, c)| class(i, c, &salt, problems))
        .collect();
    for (i, c) in classes.iter().enumerate() {
        if classes[..i].iter().any(|p| p.name == c.name) {
            problems.push(Problem::invalid(
                "slo.class",
                format!("class `{}` is defined twice", c.name),
            ));
        }
        if c.matcher.tenant.is_some() && tenant_header.is_none() {
            problems.push(Problem::invalid(
                format!("slo.class[{i}] ({}).match.tenant", c.name),
                "needs slo.tenant_header",
            ));
        }
    }
    let (targets, percentiles) = targets("slo.default", &s.default, problems);
    let default = SloClass {
        name: DEFAULT_CLASS.into(),
        matcher: Matcher::default(),
        targets,
        attainment: s.default.attainment,
        error_rate_max: s.default.error_rate_max,
        percentiles,
    };
    for &status in &s.client_error_statuses {
        if !(400..=499).contains(&status) || status == 429 {
            problems.push(Problem::invalid(
                "slo.client_error_statuses",
                format!("{status} is not a client error status (400-499, and 429 is a rejection)"),
            ));
        }
    }
    Slo {
        windows,
        tenant_header,
        tenant_salt: salt,
        header_objectives: header_objectives(s, problems),
        min_samples: s.min_samples.max(1),
        input_buckets: s.input_buckets.clone(),
        history: s.history,
        timeline_points: s.timeline_points,
        long_input_bytes: s.long_input_bytes,
        client_error_statuses: s.client_error_statuses.clone(),
        classes,
        default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slo::MatchInput;

    fn input<'a>(model: &'a str, api: &str, tokens: Option<u64>) -> MatchInput<'a> {
        MatchInput {
            model: Some(model),
            api: crate::decode::Api::from_label(api),
            tenant: None,
            input_tokens: tokens,
        }
    }

    #[test]
    fn first_match_wins_and_default_takes_the_rest() {
        let text = r#"
            [[class]]
            name = "short"
            match = { model = "llama-*", api = "chat", input_tokens_max = 1000 }
            ttft_ms = 500
            [[class]]
            name = "llama"
            match = { model = "llama-*" }
            ttft_ms = 2000
            [default]
            e2e_ms = 60000
        "#;
        let section: SloSection = toml::from_str(text).unwrap();
        let mut problems = Vec::new();
        let slo = validate(&section, "salt", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            slo.class_for(&input("llama-3", "chat_completions", Some(10)))
                .unwrap()
                .name
                .as_ref(),
            "short"
        );
        assert_eq!(
            slo.class_for(&input("llama-3", "chat_completions", Some(5000)))
                .unwrap()
                .name
                .as_ref(),
            "llama"
        );
        assert_eq!(
            slo.class_for(&input("llama-3", "completions", None))
                .unwrap()
                .name
                .as_ref(),
            "llama"
        );
        assert_eq!(
            slo.class_for(&input("gpt", "chat_completions", None))
                .unwrap()
                .name
                .as_ref(),
            "default"
        );
        assert_eq!(slo.default.targets.e2e_ms, Some(60000.0));
    }

    #[test]
    fn non_generation_traffic_is_judged_only_by_explicit_opt_in() {
        let text = r#"
            [[class]]
            name = "all"
            ttft_ms = 500
        "#;
        let section: SloSection = toml::from_str(text).unwrap();
        let slo = validate(&section, "salt", &mut Vec::new());
        for api in ["unknown", "embeddings", "upgrade"] {
            assert!(slo.class_for(&input("m", api, None)).is_none(), "{api}");
        }
        let text = r#"
            [[class]]
            name = "probes"
            match = { api = "unknown" }
            e2e_ms = 100
            [[class]]
            name = "all"
            ttft_ms = 500
        "#;
        let section: SloSection = toml::from_str(text).unwrap();
        let slo = validate(&section, "salt", &mut Vec::new());
        assert_eq!(
            slo.class_for(&input("m", "unknown", None))
                .unwrap()
                .name
                .as_ref(),
            "probes"
        );
        assert!(slo.class_for(&input("m", "embeddings", None)).is_none());
        assert_eq!(
            slo.class_for(&input("m", "chat_completions", None))
                .unwrap()
                .name
                .as_ref(),
            "all"
        );
    }

    #[test]
    fn tenants_match_by_salted_hash() {
        let text = "tenant_header = \"x-tenant\"\n[[class]]\nname = \"acme\"\nmatch = { tenant = \"acme\" }\n";
        let section: SloSection = toml::from_str(text).unwrap();
        let mut problems = Vec::new();
        let slo = validate(&section, "s1", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let acme = MatchInput {
            model: None,
            api: Some(crate::decode::Api::ChatCompletions),
            tenant: Some(slo.tenant_hash(b"acme")),
            input_tokens: None,
        };
        assert_eq!(slo.class_for(&acme).unwrap().name.as_ref(), "acme");
        assert_ne!(tenant_hash("s1", b"acme"), tenant_hash("s2", b"acme"));
    }

    #[test]
    fn bad_classes_are_all_reported() {
        let text = r#"
            windows = ["soon"]
            client_error_statuses = [401, 429, 500]
            [[class]]
            name = "default"
            attainment = 1.5
            percentiles = [{ metric = "speed", quantile = 2.0, max_ms = -1 }]
            error_rate_max = 1.5
            [[class]]
            name = "t"
            match = { tenant = "x", api = "chats" }
        "#;
        let section: SloSection = toml::from_str(text).unwrap();
        let mut problems = Vec::new();
        validate(&section, "s", &mut problems);
        let all: String = problems.iter().map(|p| format!("{p}\n")).collect();
        for needle in [
            "slo.windows",
            "name",
            "attainment",
            "metric",
            "quantile",
            "max_ms",
            "tenant_header",
            "error_rate_max",
            "client_error_statuses",
            "match.api",
        ] {
            assert!(all.contains(needle), "{needle} missing in:\n{all}");
        }
    }
}
