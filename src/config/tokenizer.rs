//! `[tokenizer]`: counting tokens when the upstream reports no usage. The file's section,
//! its validation and the runtime value.
//!
//! Tokenizer files are loaded here, once per configuration build, so a missing or broken
//! `tokenizer.json` is a configuration problem naming its path, never a runtime surprise;
//! a reload loads them again.

use std::path::Path;

use serde::Deserialize;

use super::{Problem, slo::glob};
use crate::decode::text::DEFAULT_TEXT_LIMIT;
use crate::tokenize::{Counter, Tokenizer};

/// `[tokenizer]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizerSection {
    /// Model glob → `tokenizer.json`, first match wins.
    pub models: Vec<ModelTokenizerSection>,
    /// Count with the embedded o200k_base when no entry matches the model.
    pub estimate: bool,
    pub workers: usize,
    pub queue: usize,
    pub text_limit: u64,
}

impl Default for TokenizerSection {
    fn default() -> Self {
        Self {
            models: Vec::new(),
            estimate: true,
            workers: 1,
            queue: 256,
            text_limit: DEFAULT_TEXT_LIMIT as u64,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTokenizerSection {
    pub model: String,
    pub path: String,
}

/// How tokens are counted when the upstream reports no usage.
#[derive(Debug, Clone)]
pub struct Counting {
    pub models: Vec<ModelTokenizer>,
    pub estimate: bool,
    /// Tokenizer worker threads; fixed at start (a reload does not resize the pool).
    pub workers: usize,
    /// Counting jobs waiting for a worker; past it, counts fall back. Fixed at start.
    pub queue: usize,
    /// Generated text kept per request for counting, in bytes.
    pub text_limit: usize,
}

#[derive(Debug, Clone)]
pub struct ModelTokenizer {
    pub pattern: String,
    pub tokenizer: Tokenizer,
}

impl Counting {
    /// Whether any request can be counted at all.
    pub fn enabled(&self) -> bool {
        self.estimate || !self.models.is_empty()
    }

    /// What counts this model's tokens: its configured tokenizer (first matching glob),
    /// else the estimate when enabled. An unknown model matches only a pattern that
    /// matches the empty name (`*`).
    pub fn counter_for(&self, model: Option<&str>) -> Option<Counter> {
        let name = model.unwrap_or("");
        self.models
            .iter()
            .find(|m| glob(&m.pattern, name))
            .map(|m| Counter::Model(m.tokenizer.clone()))
            .or(self.estimate.then_some(Counter::Estimate))
    }
}

impl Default for Counting {
    fn default() -> Self {
        let s = TokenizerSection::default();
        Counting {
            models: Vec::new(),
            estimate: s.estimate,
            workers: s.workers,
            queue: s.queue,
            text_limit: DEFAULT_TEXT_LIMIT,
        }
    }
}

/// Validates `[tokenizer]`, loading every tokenizer file (each path once).
pub fn validate_tokenizer(s: &TokenizerSection, problems: &mut Vec<Problem>) -> Counting {
    let mut models: Vec<ModelTokenizer> = Vec::new();
    for (i, m) in s.models.iter().enumerate() {
        let key = format!("tokenizer.models[{i}]");
        if m.model.is_empty() {
            problems.push(Problem::invalid(
                format!("{key}.model"),
                "must be a model glob, e.g. \"llama-*\"",
            ));
        }
        let loaded = models
            .iter()
            .find(|l| l.tokenizer.path() == m.path)
            .map(|l| l.tokenizer.clone());
        let tokenizer = match loaded {
            Some(t) => Some(t),
            None => match Tokenizer::load(Path::new(&m.path)) {
                Ok(t) => Some(t),
                Err(e) => {
                    problems.push(Problem::invalid(format!("{key}.path"), e.to_string()));
                    None
                }
            },
        };
        if let Some(tokenizer) = tokenizer {
            models.push(ModelTokenizer {
                pattern: m.model.clone(),
                tokenizer,
            });
        }
    }
    for (name, value) in [
        ("workers", s.workers as u64),
        ("queue", s.queue as u64),
        ("text_limit", s.text_limit),
    ] {
        if value == 0 {
            problems.push(Problem::invalid(
                format!("tokenizer.{name}"),
                "must be greater than zero",
            ));
        }
    }
    Counting {
        models,
        estimate: s.estimate,
        workers: s.workers,
        queue: s.queue,
        text_limit: usize::try_from(s.text_limit).unwrap_or(usize::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> TokenizerSection {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            tokenizer: TokenizerSection,
        }
        toml::from_str::<File>(text).unwrap().tokenizer
    }

    #[test]
    fn defaults_count_with_the_estimate() {
        let t = section("");
        let mut problems = Vec::new();
        let counting = validate_tokenizer(&t, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(counting.enabled());
        assert!(matches!(
            counting.counter_for(Some("any")),
            Some(Counter::Estimate)
        ));
        assert_eq!(
            (counting.workers, counting.queue, counting.text_limit),
            (1, 256, 1 << 20)
        );
    }

    #[test]
    fn without_the_estimate_an_unmatched_model_is_not_counted() {
        let t = section("[tokenizer]\nestimate = false\n");
        let counting = validate_tokenizer(&t, &mut Vec::new());
        assert!(!counting.enabled());
        assert!(counting.counter_for(Some("m")).is_none());
        assert!(counting.counter_for(None).is_none());
    }

    #[test]
    fn every_problem_is_named() {
        let t = section(
            "[tokenizer]\nworkers = 0\nqueue = 0\nmodels = [{ model = \"\", path = \"/nonexistent/t.json\" }]\n",
        );
        let mut problems = Vec::new();
        validate_tokenizer(&t, &mut problems);
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        for key in [
            "tokenizer.models[0].model",
            "tokenizer.models[0].path",
            "tokenizer.workers",
            "tokenizer.queue",
        ] {
            assert!(
                all.iter().any(|p| p.starts_with(key)),
                "{key} missing from {all:?}"
            );
        }
        assert!(
            all.iter().any(|p| p.contains("/nonexistent/t.json")),
            "{all:?}"
        );
    }
}
