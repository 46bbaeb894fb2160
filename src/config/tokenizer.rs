//! `[tokenizer]`: counting tokens when the upstream reports no usage. The file's section,
//! its validation and the runtime value.
//!
//! The tokenizer files are named here and loaded by `tokenize::Tokenizers::from_config`
//! when the server starts, when `check-config` runs and on every reload, so a missing or
//! broken `tokenizer.json` is still a configuration problem naming its path (key
//! `tokenizer.models[i].path`), never a runtime surprise.

use std::path::PathBuf;

use serde::Deserialize;

use super::Problem;
use super::restart::Changed;
use crate::decode::text::DEFAULT_TEXT_LIMIT;

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

impl Counting {
    /// The worker pool and its queue are sized once.
    pub(super) fn restart_only(&self, new: &Counting, changed: &mut Changed) {
        changed.check(&self.workers, &new.workers, "tokenizer.workers");
        changed.check(&self.queue, &new.queue, "tokenizer.queue");
    }
}

/// A model glob and the `tokenizer.json` that counts its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTokenizer {
    pub pattern: String,
    pub path: PathBuf,
}

impl Counting {
    /// Whether any request can be counted at all.
    pub fn enabled(&self) -> bool {
        self.estimate || !self.models.is_empty()
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

/// Validates `[tokenizer]` (the files are loaded by `tokenize::Tokenizers`).
pub fn validate_tokenizer(s: &TokenizerSection, problems: &mut Vec<Problem>) -> Counting {
    let mut models = Vec::new();
    for (i, m) in s.models.iter().enumerate() {
        let key = format!("tokenizer.models[{i}]");
        if m.model.is_empty() {
            problems.push(Problem::invalid(
                format!("{key}.model"),
                "must be a model glob, e.g. \"llama-*\"",
            ));
        }
        models.push(ModelTokenizer {
            pattern: m.model.clone(),
            path: PathBuf::from(&m.path),
        });
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
        assert!(counting.models.is_empty());
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
    }

    #[test]
    fn every_problem_is_named() {
        let t = section(
            "[tokenizer]\nworkers = 0\nqueue = 0\nmodels = [{ model = \"\", path = \"/nonexistent/t.json\" }]\n",
        );
        let mut problems = Vec::new();
        let counting = validate_tokenizer(&t, &mut problems);
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        for key in [
            "tokenizer.models[0].model",
            "tokenizer.workers",
            "tokenizer.queue",
        ] {
            assert!(
                all.iter().any(|p| p.starts_with(key)),
                "{key} missing from {all:?}"
            );
        }
        assert_eq!(
            counting.models[0].path,
            PathBuf::from("/nonexistent/t.json")
        );
    }
}
