//! `[usage_injection]`: asking OpenAI-style upstreams for usage on the client's behalf.
//! The file's section, its validation and the runtime value (the edit itself is
//! `crate::usage_injection`).

use serde::Deserialize;

use super::Problem;
use crate::slo::glob;

/// `[usage_injection]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UsageInjectionSection {
    pub enabled: bool,
    pub models: Vec<String>,
    pub paths: Vec<String>,
}

impl Default for UsageInjectionSection {
    fn default() -> Self {
        Self {
            enabled: false,
            models: vec!["*".into()],
            paths: vec!["/v1/chat/completions".into(), "/v1/completions".into()],
        }
    }
}

/// Which requests get `stream_options.include_usage` added upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageInjection {
    pub enabled: bool,
    /// Model globs; the request's `model` must match one.
    pub models: Vec<String>,
    /// Request path globs (the client's path, before any upstream prefix).
    pub paths: Vec<String>,
}

impl UsageInjection {
    /// Whether requests to this path are candidates (the model is checked on the body).
    pub fn applies_to_path(&self, path: &str) -> bool {
        self.enabled && self.paths.iter().any(|p| glob(p, path))
    }

    pub fn applies_to_model(&self, model: &str) -> bool {
        self.models.iter().any(|m| glob(m, model))
    }
}

/// Validates `[usage_injection]`.
pub fn validate_injection(
    s: &UsageInjectionSection,
    problems: &mut Vec<Problem>,
) -> UsageInjection {
    if s.enabled {
        if s.models.is_empty() {
            problems.push(Problem::invalid(
                "usage_injection.models",
                "lists no model glob, so nothing would be injected; use [\"*\"] for every model",
            ));
        }
        if s.paths.is_empty() {
            problems.push(Problem::invalid("usage_injection.paths", "lists no path"));
        }
    }
    for (i, p) in s.paths.iter().enumerate() {
        if !(p.starts_with('/') || p.starts_with('*')) {
            problems.push(Problem::invalid(
                format!("usage_injection.paths[{i}]"),
                format!("`{p}` must be a request path (glob) starting with `/` or `*`"),
            ));
        }
    }
    UsageInjection {
        enabled: s.enabled,
        models: s.models.clone(),
        paths: s.paths.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> UsageInjectionSection {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            usage_injection: UsageInjectionSection,
        }
        toml::from_str::<File>(text).unwrap().usage_injection
    }

    #[test]
    fn off_by_default() {
        let mut problems = Vec::new();
        let injection = validate_injection(&section(""), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(!injection.applies_to_path("/v1/chat/completions"));
    }

    #[test]
    fn paths_and_models_are_globs() {
        let u = section(
            "[usage_injection]\nenabled = true\nmodels = [\"llama-*\"]\npaths = [\"*/chat/completions\"]\n",
        );
        let mut problems = Vec::new();
        let injection = validate_injection(&u, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(injection.applies_to_path("/openai/v1/chat/completions"));
        assert!(!injection.applies_to_path("/v1/completions"));
        assert!(injection.applies_to_model("llama-3-8b") && !injection.applies_to_model("qwen"));
    }

    #[test]
    fn every_problem_is_named() {
        let u = section("[usage_injection]\nenabled = true\nmodels = []\npaths = [\"v1/chat\"]\n");
        let mut problems = Vec::new();
        validate_injection(&u, &mut problems);
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        for key in ["usage_injection.models", "usage_injection.paths[0]"] {
            assert!(
                all.iter().any(|p| p.starts_with(key)),
                "{key} missing from {all:?}"
            );
        }
    }
}
