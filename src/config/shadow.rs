//! `[shadow]`: a candidate system that receives a mirrored share of the live generation
//! traffic, measured and judged on its own beside the primary (docs/SHADOW.md). The
//! file's section, its validation and the runtime value. Off when the section is absent.

use std::{sync::Arc, time::Duration};

use http::{HeaderName, HeaderValue, Uri, uri::Scheme};
use serde::Deserialize;

use super::{Problem, Upstream, file::humantime_serde, tls, upstream::UpstreamSection};

/// Credentials a mirrored copy never carries unless told otherwise: the client's own
/// credentials for the primary are no business of the candidate. `x-api-key` and
/// `api-key` are the Anthropic and Azure OpenAI forms of the same thing.
pub const DEFAULT_DROP_HEADERS: [&str; 4] = ["authorization", "cookie", "x-api-key", "api-key"];

/// `shadow.record_queue` when the section says nothing (or is absent at start): records
/// are a few KiB each, and this is about a second of backlog at a busy shadow's rate.
pub const DEFAULT_RECORD_QUEUE: usize = 256;

/// `[shadow]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowSection {
    /// The candidate's base URL (`http://` or `https://`, like `upstream.url`).
    pub url: Option<String>,
    /// Mirror continuously; `false` keeps the candidate configured for
    /// `[drift] shadow_on_trigger` only.
    pub enabled: bool,
    /// Fraction of the generation requests mirrored, 0 to 1.
    pub share: f64,
    /// Model globs a request must match to be mirrored (empty: every model).
    pub models: Vec<String>,
    /// SLO class globs a request must match to be mirrored (empty: every class).
    pub classes: Vec<String>,
    /// Mirrored requests under way at once; past it a request is not mirrored (counted).
    pub max_in_flight: usize,
    /// Deadline of one mirrored exchange, from sending to the answer's last byte.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Body bytes of one answer read at most; past them the answer is cut (counted, and
    /// its record says so).
    pub max_answer_bytes: u64,
    /// Finished shadow measurements waiting for their record; past it one is dropped
    /// (counted) rather than waited for. Read at start.
    pub record_queue: usize,
    /// The model name the candidate is asked for instead of the client's.
    pub model: Option<String>,
    /// Request headers removed from the copy (hop-by-hop headers always are).
    pub drop_headers: Vec<String>,
    /// The candidate's own credential: `"Bearer …"` is sent as `authorization`;
    /// `"name: value"` sets that header.
    pub auth_header: Option<String>,
    /// Trust roots for an `https://` candidate (default: the public web roots).
    pub ca_file: Option<String>,
    /// Speak HTTP/2 to the candidate (prior knowledge for `http://`, ALPN for `https://`).
    pub http2: bool,
    /// Another replica of the primary, sent the same copies as the candidate, so that
    /// the candidate is judged against the primary's own noise; `"upstream"` is
    /// `upstream.url` itself.
    pub secondary_url: Option<String>,
    /// Ask the candidate and the secondary (never the primary) for the top 5
    /// log-probabilities of each token.
    pub logprobs: bool,
    /// Diffy's relative threshold: the candidate's share of differing answers may exceed
    /// the secondary's by this fraction of it.
    pub answers_relative: f64,
    /// Diffy's absolute threshold: and by this much in any case.
    pub answers_absolute: f64,
}

impl Default for ShadowSection {
    fn default() -> Self {
        Self {
            url: None,
            enabled: true,
            // A tenth of the traffic gives a verdict within minutes at any real rate and
            // does not double the candidate's load by surprise.
            share: 0.1,
            models: Vec::new(),
            classes: Vec::new(),
            max_in_flight: 64,
            timeout: Duration::from_secs(120),
            // A long generated answer is tens of KiB; a MiB is far past any the SLO judges,
            // and bounds what one copy costs to decode.
            max_answer_bytes: 1024 * 1024,
            record_queue: DEFAULT_RECORD_QUEUE,
            model: None,
            drop_headers: DEFAULT_DROP_HEADERS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            auth_header: None,
            ca_file: None,
            http2: false,
            secondary_url: None,
            logprobs: false,
            // Diffy's defaults: 20 % relative and 0.03 % absolute.
            answers_relative: 0.2,
            answers_absolute: 0.0003,
        }
    }
}

/// The validated `[shadow]`.
#[derive(Debug, Clone)]
pub struct ShadowConfig {
    /// The candidate, as an upstream (its timeouts and pool from `[upstream]`'s defaults).
    pub target: Upstream,
    pub enabled: bool,
    pub share: f64,
    pub models: Vec<String>,
    pub classes: Vec<String>,
    pub max_in_flight: usize,
    pub timeout: Duration,
    pub max_answer_bytes: u64,
    pub record_queue: usize,
    pub model: Option<String>,
    pub drop_headers: Vec<HeaderName>,
    pub auth_header: Option<(HeaderName, HeaderValue)>,
    /// The secondary (`secondary_url`): a replica of the primary, with the candidate's
    /// limits and timeouts.
    pub secondary: Option<Upstream>,
    pub logprobs: bool,
    pub answers_relative: f64,
    pub answers_absolute: f64,
}

impl ShadowConfig {
    /// Whether a change from `self` to `new` needs a new client for the candidate.
    pub fn same_target(&self, new: &ShadowConfig) -> bool {
        let (a, b) = (&self.target, &new.target);
        a.scheme == b.scheme
            && a.authority == b.authority
            && a.http2 == b.http2
            && Arc::ptr_eq(&a.tls, &b.tls)
    }

    /// Whether a change from `self` to `new` needs a new client for the secondary.
    pub fn same_secondary(&self, new: &ShadowConfig) -> bool {
        match (&self.secondary, &new.secondary) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.scheme == b.scheme
                    && a.authority == b.authority
                    && a.http2 == b.http2
                    && Arc::ptr_eq(&a.tls, &b.tls)
            }
            _ => false,
        }
    }
}

/// The runtime `[shadow]`; `None` when the section is absent or has problems.
pub fn validate_shadow(
    s: Option<&ShadowSection>,
    upstream: Option<&Upstream>,
    problems: &mut Vec<Problem>,
) -> Option<ShadowConfig> {
    let s = s?;
    let before = problems.len();
    if !(0.0..=1.0).contains(&s.share) || s.share.is_nan() {
        problems.push(Problem::invalid("shadow.share", "must be between 0 and 1"));
    }
    if s.max_in_flight == 0 {
        problems.push(Problem::invalid(
            "shadow.max_in_flight",
            "must be greater than zero",
        ));
    }
    if s.timeout.is_zero() {
        problems.push(Problem::invalid(
            "shadow.timeout",
            "must be greater than zero",
        ));
    }
    if s.max_answer_bytes == 0 {
        problems.push(Problem::invalid(
            "shadow.max_answer_bytes",
            "must be greater than zero",
        ));
    }
    if s.record_queue == 0 {
        problems.push(Problem::invalid(
            "shadow.record_queue",
            "must be greater than zero",
        ));
    }
    if s.model.as_deref().is_some_and(str::is_empty) {
        problems.push(Problem::invalid("shadow.model", "must not be empty"));
    }
    let drop_headers = s
        .drop_headers
        .iter()
        .filter_map(|h| match HeaderName::try_from(h.as_str()) {
            Ok(name) => Some(name),
            Err(_) => {
                problems.push(Problem::invalid(
                    "shadow.drop_headers",
                    format!("`{h}` is not a header name"),
                ));
                None
            }
        })
        .collect();
    let auth_header = s.auth_header.as_deref().and_then(|raw| {
        let parsed = parse_auth(raw);
        if parsed.is_none() {
            problems.push(Problem::invalid(
                "shadow.auth_header",
                "must be a header value (`Bearer …`) or `name: value`",
            ));
        }
        parsed
    });
    for (key, v) in [
        ("shadow.answers_relative", s.answers_relative),
        ("shadow.answers_absolute", s.answers_absolute),
    ] {
        if !(0.0..=1.0).contains(&v) || v.is_nan() {
            problems.push(Problem::invalid(key, "must be between 0 and 1"));
        }
    }
    let candidate = target(s, "shadow.url", s.url.as_deref(), problems);
    let secondary = match s.secondary_url.as_deref() {
        None => None,
        Some("upstream") => upstream.map(|u| Upstream {
            scheme: u.scheme.clone(),
            authority: u.authority.clone(),
            base_path: u.base_path.clone(),
            http2: u.http2,
            ..limits(s, u.tls.clone())
        }),
        Some(raw) => target(s, "shadow.secondary_url", Some(raw), problems),
    };
    if problems.len() > before {
        return None;
    }
    Some(ShadowConfig {
        target: candidate?,
        enabled: s.enabled,
        share: s.share,
        models: s.models.clone(),
        classes: s.classes.clone(),
        max_in_flight: s.max_in_flight,
        timeout: s.timeout,
        max_answer_bytes: s.max_answer_bytes,
        record_queue: s.record_queue,
        model: s.model.clone(),
        drop_headers,
        auth_header,
        secondary,
        logprobs: s.logprobs,
        answers_relative: s.answers_relative,
        answers_absolute: s.answers_absolute,
    })
}

/// The candidate as an upstream: its URL, TLS and protocol; timeouts and pool sizes are
/// `[upstream]`'s defaults, the exchange as a whole is bounded by `shadow.timeout`.
fn target(
    s: &ShadowSection,
    key: &'static str,
    raw: Option<&str>,
    problems: &mut Vec<Problem>,
) -> Option<Upstream> {
    let Some(raw) = raw else {
        problems.push(Problem::invalid(key, "required when [shadow] is present"));
        return None;
    };
    let uri: Uri = match raw.parse() {
        Ok(uri) => uri,
        Err(e) => {
            problems.push(Problem::invalid(key, format!("`{raw}`: {e}")));
            return None;
        }
    };
    let https = match uri.scheme().map(Scheme::as_str) {
        Some("http") => false,
        Some("https") => true,
        _ => {
            problems.push(Problem::invalid(
                key,
                format!("`{raw}` must start with http:// or https://"),
            ));
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        problems.push(Problem::invalid(key, format!("`{raw}` has no host")));
        return None;
    };
    if uri.query().is_some() {
        problems.push(Problem::invalid(
            key,
            format!("`{raw}` must not have a query"),
        ));
    }
    if key == "shadow.url" && s.ca_file.is_some() && !https {
        problems.push(Problem::invalid(
            "shadow.ca_file",
            "only used with an https:// candidate",
        ));
    }
    let tls = match tls::client_config_for("shadow.ca_file", s.ca_file.as_deref()) {
        Ok(cfg) => Arc::new(cfg),
        Err(p) => {
            problems.push(p);
            return None;
        }
    };
    Some(Upstream {
        scheme: if https { Scheme::HTTPS } else { Scheme::HTTP },
        authority,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        http2: s.http2,
        ..limits(s, tls)
    })
}

/// A copy's upstream limits: timeouts and pool sizes are `[upstream]`'s defaults, the
/// exchange as a whole is bounded by `shadow.timeout`; the address is filled in after.
fn limits(s: &ShadowSection, tls: Arc<rustls::ClientConfig>) -> Upstream {
    let d = UpstreamSection::default();
    Upstream {
        scheme: Scheme::HTTP,
        authority: http::uri::Authority::from_static("localhost"),
        base_path: String::new(),
        tls,
        http2: false,
        preserve_host: false,
        connect_timeout: d.connect_timeout,
        response_header_timeout: s.timeout,
        idle_timeout: s.timeout,
        pool_idle_timeout: d.pool_idle_timeout,
        pool_max_idle_per_host: s.max_in_flight,
        max_connections: s.max_in_flight,
        pool_wait_timeout: d.pool_wait_timeout,
        http2_max_connections: 1,
        http2_max_streams_per_connection: s.max_in_flight,
        http1_relay: d.http1_relay,
        max_response_header_bytes: d.max_response_header_bytes,
        // The shadow's own budget (`max_answer_bytes`, `timeout`) bounds a slow answer.
        min_body_rate: None,
    }
}

/// `"name: value"` sets that header; anything else is the value of `authorization`.
fn parse_auth(raw: &str) -> Option<(HeaderName, HeaderValue)> {
    let value = |v: &str| {
        HeaderValue::from_str(v.trim())
            .ok()
            .filter(|v| !v.is_empty())
    };
    if let Some((name, rest)) = raw.split_once(':')
        && let Ok(name) = HeaderName::try_from(name.trim())
        && !name.as_str().contains(' ')
    {
        return Some((name, value(rest)?));
    }
    Some((http::header::AUTHORIZATION, value(raw)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> (Option<ShadowConfig>, Vec<String>) {
        let section: ShadowSection = match toml::from_str(toml) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let mut problems = Vec::new();
        let cfg = validate_shadow(Some(&section), None, &mut problems);
        (cfg, problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn absent_is_off_and_defaults_are_documented_ones() {
        assert!(validate_shadow(None, None, &mut Vec::new()).is_none());
        let (cfg, problems) = parse("url = \"http://127.0.0.1:9/v\"");
        assert!(problems.is_empty(), "{problems:?}");
        let Some(cfg) = cfg else { panic!("valid") };
        assert_eq!((cfg.share, cfg.max_in_flight, cfg.enabled), (0.1, 64, true));
        assert_eq!(cfg.timeout, Duration::from_secs(120));
        assert_eq!((cfg.max_answer_bytes, cfg.record_queue), (1_048_576, 256));
        assert_eq!(cfg.target.base_path, "/v");
        let dropped: Vec<&str> = cfg.drop_headers.iter().map(HeaderName::as_str).collect();
        assert_eq!(dropped, DEFAULT_DROP_HEADERS);
        assert!(cfg.auth_header.is_none());
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let (cfg, problems) = parse(
            "url = \"ftp://x\"\nshare = 1.5\nmax_in_flight = 0\ntimeout = \"0s\"\n\
             drop_headers = [\"bad header\"]\nmodel = \"\"\nmax_answer_bytes = 0\n\
             record_queue = 0",
        );
        assert!(cfg.is_none());
        for key in [
            "shadow.url",
            "shadow.share",
            "shadow.max_in_flight",
            "shadow.timeout",
            "shadow.max_answer_bytes",
            "shadow.record_queue",
            "shadow.drop_headers",
            "shadow.model",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(key)),
                "{key}: {problems:?}"
            );
        }
        let (cfg, problems) = parse("share = 0.5");
        assert!(cfg.is_none() && problems[0].starts_with("shadow.url"));
    }

    /// The example's commented-out `[shadow]` section: every key is there, and
    /// uncommented (without `ca_file`, which names a file) it loads.
    #[test]
    fn the_example_config_documents_every_key() {
        let text = include_str!("../../config/goodput.example.toml");
        let Some(section) = text.split("\n# [shadow]\n").nth(1) else {
            panic!("the example has a commented-out [shadow] section")
        };
        let section = section.split("\n\n").next().unwrap_or(section);
        let settings: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ").is_some_and(|(k, _)| {
                    k.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
            })
            .collect();
        let keys = [
            "url",
            "enabled",
            "share",
            "models",
            "classes",
            "max_in_flight",
            "timeout",
            "max_answer_bytes",
            "record_queue",
            "model",
            "drop_headers",
            "auth_header",
            "ca_file",
            "http2",
            "secondary_url",
            "logprobs",
            "answers_relative",
            "answers_absolute",
        ];
        for key in keys {
            assert!(
                settings.iter().any(|l| l.starts_with(&format!("{key} = "))),
                "shadow.{key} is not in the example's [shadow] section"
            );
        }
        let uncommented: String = settings
            .iter()
            .filter(|l| !l.starts_with("ca_file"))
            .map(|l| format!("{l}\n"))
            .collect();
        let (cfg, problems) = parse(&uncommented.replace("https://", "http://"));
        assert!(problems.is_empty(), "{problems:?}");
        assert!(cfg.is_some());
    }

    #[test]
    fn the_secondary_is_a_url_or_the_upstream_itself() {
        let (cfg, problems) =
            parse("url = \"http://127.0.0.1:9\"\nsecondary_url = \"http://10.0.0.2:8000/v\"");
        assert!(problems.is_empty(), "{problems:?}");
        let secondary = cfg
            .and_then(|c| c.secondary)
            .unwrap_or_else(|| panic!("valid"));
        assert_eq!(secondary.authority.as_str(), "10.0.0.2:8000");
        assert_eq!(secondary.base_path, "/v");
        let (_, problems) = parse("url = \"http://127.0.0.1:9\"\nsecondary_url = \"ftp://x\"");
        assert!(
            problems[0].starts_with("shadow.secondary_url"),
            "{problems:?}"
        );
        let (_, problems) = parse("url = \"http://127.0.0.1:9\"\nanswers_relative = -1.0");
        assert!(
            problems[0].starts_with("shadow.answers_relative"),
            "{problems:?}"
        );
        let section: ShadowSection =
            toml::from_str("url = \"http://127.0.0.1:9\"\nsecondary_url = \"upstream\"")
                .unwrap_or_else(|e| panic!("{e}"));
        let mut problems = Vec::new();
        let upstream = target(
            &section,
            "upstream.url",
            Some("https://primary:8443/p"),
            &mut problems,
        )
        .unwrap_or_else(|| panic!("valid"));
        let cfg = validate_shadow(Some(&section), Some(&upstream), &mut problems)
            .unwrap_or_else(|| panic!("valid: {problems:?}"));
        let secondary = cfg.secondary.unwrap_or_else(|| panic!("the upstream"));
        assert_eq!(secondary.authority.as_str(), "primary:8443");
        assert_eq!(
            (secondary.scheme.as_str(), secondary.base_path.as_str()),
            ("https", "/p")
        );
        assert_eq!(secondary.response_header_timeout, cfg.timeout);
    }

    #[test]
    fn auth_header_is_a_value_or_a_named_header() {
        let (name, value) = parse_auth("Bearer sk-123").unwrap_or_else(|| panic!("valid"));
        assert_eq!(
            (name.as_str(), value.to_str().ok()),
            ("authorization", Some("Bearer sk-123"))
        );
        let (name, value) = parse_auth("x-api-key: k:1").unwrap_or_else(|| panic!("valid"));
        assert_eq!(
            (name.as_str(), value.to_str().ok()),
            ("x-api-key", Some("k:1"))
        );
        assert!(parse_auth("x-api-key:   ").is_none());
        let (_, problems) = parse("url = \"http://127.0.0.1:9\"\nauth_header = \"\"");
        assert!(problems[0].starts_with("shadow.auth_header"));
    }
}
