//! The tokenizers `[tokenizer]` names, loaded: each file once, so a missing or broken
//! `tokenizer.json` is a configuration problem naming its path. Built when the server
//! starts, by `check-config`, and again on every reload.

use crate::config::{Problem, tokenizer::Counting};

use super::{Counter, Tokenizer};

/// What counts a model's tokens, per the configuration it was built from.
#[derive(Debug, Clone, Default)]
pub struct Tokenizers {
    models: Vec<(String, Tokenizer)>,
    estimate: bool,
}

impl Tokenizers {
    /// Loads every tokenizer file of `[tokenizer] models` (each path once); every file that
    /// cannot be loaded is a problem under its key, `tokenizer.models[i].path`.
    pub fn from_config(counting: &Counting) -> Result<Tokenizers, Vec<Problem>> {
        let mut models: Vec<(String, Tokenizer)> = Vec::new();
        let mut problems = Vec::new();
        for (i, m) in counting.models.iter().enumerate() {
            let shown = m.path.display().to_string();
            let loaded = models
                .iter()
                .find(|(_, t)| t.path() == shown)
                .map(|(_, t)| Ok(t.clone()))
                .unwrap_or_else(|| Tokenizer::load(&m.path));
            match loaded {
                Ok(t) => models.push((m.pattern.clone(), t)),
                Err(e) => problems.push(Problem::invalid(
                    format!("tokenizer.models[{i}].path"),
                    e.to_string(),
                )),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Tokenizers {
            models,
            estimate: counting.estimate,
        })
    }

    /// What counts this model's tokens: its configured tokenizer (first matching glob),
    /// else the estimate when enabled. An unknown model matches only a pattern that
    /// matches the empty name (`*`).
    pub fn counter_for(&self, model: Option<&str>) -> Option<Counter> {
        let name = model.unwrap_or("");
        self.models
            .iter()
            .find(|(pattern, _)| crate::slo::glob(pattern, name))
            .map(|(_, t)| Counter::Model(t.clone()))
            .or(self.estimate.then_some(Counter::Estimate))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::tokenizer::ModelTokenizer;

    #[test]
    fn the_estimate_counts_what_no_pattern_matches() {
        let counting = Counting::default();
        let t = Tokenizers::from_config(&counting).unwrap();
        assert!(matches!(
            t.counter_for(Some("any")),
            Some(Counter::Estimate)
        ));
        let off = Counting {
            estimate: false,
            ..Counting::default()
        };
        let t = Tokenizers::from_config(&off).unwrap();
        assert!(t.counter_for(Some("m")).is_none());
        assert!(t.counter_for(None).is_none());
    }

    #[test]
    fn every_unloadable_file_is_a_problem_under_its_key() {
        let counting = Counting {
            models: vec![
                ModelTokenizer {
                    pattern: "a-*".into(),
                    path: PathBuf::from("/nonexistent/a.json"),
                },
                ModelTokenizer {
                    pattern: "b-*".into(),
                    path: PathBuf::from("/nonexistent/b.json"),
                },
            ],
            ..Counting::default()
        };
        let problems = Tokenizers::from_config(&counting).unwrap_err();
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(
            all[0].starts_with("tokenizer.models[0].path")
                && all[0].contains("/nonexistent/a.json")
        );
        assert!(
            all[1].starts_with("tokenizer.models[1].path")
                && all[1].contains("/nonexistent/b.json")
        );
    }
}
