//! SLO behaviour: the classes a request is held to, how a finished request is matched to
//! its class (first match wins, the default class takes the rest), model globs and the
//! salted tenant hash. `config::slo` parses and validates `[slo]` into these values;
//! `measure::verdict` judges a record against its class's targets.

use std::{hash::Hasher, time::Duration};

use http::HeaderName;

use crate::decode::Api;

/// Name of the class that takes every request no configured class matched.
pub const DEFAULT_CLASS: &str = "default";

/// Upstream statuses caused by the request itself (bad request, unauthenticated,
/// forbidden, no such model or route, too large, unprocessable): the default of
/// `[slo] client_error_statuses`.
pub const DEFAULT_CLIENT_ERROR_STATUSES: [u16; 6] = [400, 401, 403, 404, 413, 422];

/// Upper bound on the timeline's points, whatever `[slo] timeline_points` says (a day of
/// 5 s slices).
pub const MAX_TIMELINE_POINTS: usize = 17_280;

/// How per-request objective headers are honoured (`[slo] header_objectives`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderObjectives {
    /// Ignored.
    #[default]
    Off,
    /// A header may only make a class's target stricter (or set one the class leaves open).
    Tighten,
    /// A header replaces the class's target.
    Override,
}

impl HeaderObjectives {
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderObjectives::Off => "off",
            HeaderObjectives::Tighten => "tighten",
            HeaderObjectives::Override => "override",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Slo {
    pub windows: Vec<Duration>,
    pub tenant_header: Option<HeaderName>,
    pub tenant_salt: String,
    /// How per-request objective headers are honoured.
    pub header_objectives: HeaderObjectives,
    pub min_samples: u64,
    pub input_buckets: Vec<u64>,
    pub history: Duration,
    pub timeline_points: usize,
    pub long_input_bytes: u64,
    /// Upstream 4xx statuses that are the request's own fault (`client_error`).
    pub client_error_statuses: Vec<u16>,
    /// Configured classes in order.
    pub classes: Vec<SloClass>,
    /// The class of every request no configured class matched.
    pub default: SloClass,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SloClass {
    pub name: std::sync::Arc<str>,
    pub matcher: Matcher,
    pub targets: Targets,
    pub attainment: f64,
    /// Largest error rate the class tolerates (errors / requests), if set.
    pub error_rate_max: Option<f64>,
    pub percentiles: Vec<PercentileTarget>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Targets {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyMetric {
    Ttft,
    Tpot,
    Itl,
    E2e,
}

impl LatencyMetric {
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyMetric::Ttft => "ttft",
            LatencyMetric::Tpot => "tpot",
            LatencyMetric::Itl => "itl",
            LatencyMetric::E2e => "e2e",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PercentileTarget {
    pub metric: LatencyMetric,
    pub quantile: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Matcher {
    pub model: Option<String>,
    pub api: Option<ApiMatch>,
    pub tenant: Option<u64>,
    pub input_tokens_max: Option<u64>,
}

/// What a finished request offers for class matching.
#[derive(Debug, Clone, Copy)]
pub struct MatchInput<'a> {
    pub model: Option<&'a str>,
    /// The request's API; `None` for an upgraded connection (a tunnel, label `upgrade`).
    pub api: Option<Api>,
    pub tenant: Option<u64>,
    pub input_tokens: Option<u64>,
}

impl Matcher {
    pub fn matches(&self, r: &MatchInput<'_>) -> bool {
        self.model
            .as_deref()
            .is_none_or(|g| r.model.is_some_and(|m| glob(g, m)))
            && self.api.is_none_or(|a| a.matches(r.api))
            && self.tenant.is_none_or(|t| r.tenant == Some(t))
            && self
                .input_tokens_max
                .is_none_or(|max| r.input_tokens.is_some_and(|n| n <= max))
    }
}

impl Slo {
    /// The class a request belongs to: the first that matches, else the default. A request
    /// that is no generation (`unknown`, `embeddings`, `upgrade`) belongs to no class
    /// (`None`: it passes through unjudged) unless a class names its API explicitly
    /// (`match = { api = "unknown" }`).
    pub fn class_for(&self, r: &MatchInput<'_>) -> Option<&SloClass> {
        if r.api.is_some_and(Api::is_generation) {
            return Some(
                self.classes
                    .iter()
                    .find(|c| c.matcher.matches(r))
                    .unwrap_or(&self.default),
            );
        }
        self.classes
            .iter()
            .find(|c| c.matcher.api.is_some_and(|a| a.names(r.api)) && c.matcher.matches(r))
    }

    /// Every class, the default last.
    pub fn all_classes(&self) -> impl Iterator<Item = &SloClass> {
        self.classes.iter().chain(std::iter::once(&self.default))
    }

    /// The salted hash a tenant header value is kept as.
    pub fn tenant_hash(&self, value: &[u8]) -> u64 {
        tenant_hash(&self.tenant_salt, value)
    }
}

pub fn tenant_hash(salt: &str, value: &[u8]) -> u64 {
    // SipHash keyed by the salt: a tenant value can't be recovered by a dictionary lookup
    // without the salt, which is never written anywhere.
    let mut key = std::hash::DefaultHasher::new();
    key.write(salt.as_bytes());
    let k0 = key.finish();
    key.write_u8(0xff);
    let k1 = key.finish();
    let mut h = std::hash::DefaultHasher::new();
    h.write_u64(k0);
    h.write_u64(k1);
    h.write(value);
    h.finish()
}

/// A class's `match.api`: one API, every chat-style or completion-style API, or upgraded
/// connections (tunnels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiMatch {
    /// One API by its label (`chat_completions`, `embeddings`, `unknown`, ...).
    Exact(Api),
    /// `chat`: every chat-style API.
    Chat,
    /// `completion`: every completion-style API.
    Completion,
    /// `upgrade`: connections upgraded to a tunnel (WebSocket and the like).
    Upgrade,
}

impl ApiMatch {
    /// The value of `match.api` in the configuration: an API label, `chat`, `completion`
    /// or `upgrade`; `None` for anything else.
    pub fn parse(label: &str) -> Option<ApiMatch> {
        match label {
            "chat" => Some(ApiMatch::Chat),
            "completion" => Some(ApiMatch::Completion),
            "upgrade" => Some(ApiMatch::Upgrade),
            other => Api::from_label(other).map(ApiMatch::Exact),
        }
    }

    /// Whether a request of `api` (`None`: a tunnel) is one this match names or covers.
    pub fn matches(self, api: Option<Api>) -> bool {
        self.names(api)
            || match (self, api) {
                (ApiMatch::Chat, Some(a)) => {
                    matches!(a, Api::ChatCompletions | Api::Messages | Api::OllamaChat)
                }
                (ApiMatch::Completion, Some(a)) => matches!(
                    a,
                    Api::Completions
                        | Api::LlamaCppCompletion
                        | Api::OllamaGenerate
                        | Api::TgiGenerate { .. }
                ),
                _ => false,
            }
    }

    /// Whether this match names `api` itself (not as one of a group): what opts traffic
    /// that is no generation in to a class.
    pub fn names(self, api: Option<Api>) -> bool {
        match (self, api) {
            (ApiMatch::Exact(want), Some(a)) => want.as_str() == a.as_str(),
            (ApiMatch::Upgrade, None) => true,
            _ => false,
        }
    }
}

/// `*` matches any run of characters, `?` one character; everything else literally.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("llama-*", "llama-3-70b"));
        assert!(glob("*", ""));
        assert!(glob("l?ama*b", "llama-70b"));
        assert!(!glob("llama-*", "mistral"));
        assert!(glob("*-instruct", "qwen-2-instruct"));
        assert!(!glob("a*b", "acbd"));
    }

    #[test]
    fn api_groups_cover_their_dialects_and_name_none() {
        let chat = ApiMatch::parse("chat").unwrap();
        for api in [Api::ChatCompletions, Api::Messages, Api::OllamaChat] {
            assert!(chat.matches(Some(api)) && !chat.names(Some(api)), "{api:?}");
        }
        assert!(!chat.matches(Some(Api::Completions)) && !chat.matches(None));
        let completion = ApiMatch::parse("completion").unwrap();
        let tgi = Api::TgiGenerate {
            stream_endpoint: true,
        };
        for api in [
            Api::Completions,
            Api::LlamaCppCompletion,
            Api::OllamaGenerate,
            tgi,
        ] {
            assert!(completion.matches(Some(api)), "{api:?}");
        }
        assert!(!completion.matches(Some(Api::Responses)));
        // One label covers both TGI endpoints.
        let exact = ApiMatch::parse("tgi_generate").unwrap();
        assert!(exact.names(Some(tgi)) && exact.matches(Some(tgi)));
        let upgrade = ApiMatch::parse("upgrade").unwrap();
        assert!(upgrade.names(None) && !upgrade.matches(Some(Api::Unknown)));
        assert!(
            ApiMatch::parse("unknown")
                .unwrap()
                .names(Some(Api::Unknown))
        );
        assert_eq!(ApiMatch::parse("chats"), None);
    }

    #[test]
    fn tenant_hashes_depend_on_the_salt() {
        assert_eq!(tenant_hash("s", b"acme"), tenant_hash("s", b"acme"));
        assert_ne!(tenant_hash("s1", b"acme"), tenant_hash("s2", b"acme"));
        assert_ne!(tenant_hash("s", b"acme"), tenant_hash("s", b"acm"));
    }
}
