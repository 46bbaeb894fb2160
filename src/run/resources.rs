//! What a configuration names outside itself, loaded once it is valid: the tokenizer files
//! of `[tokenizer] models` and the baseline profile of `[drift]`. A file that cannot be
//! loaded is a configuration problem under its key, reported by `check-config`, refused
//! at start and (for tokenizers, which a reload can change) on a reload.

use std::path::Path;

use crate::{
    config::{self, Config, ConfigError},
    profile::{Profile, drift::read_baseline},
    tokenize::Tokenizers,
};

/// The loaded files of one configuration.
#[derive(Debug)]
pub struct Resources {
    pub tokenizers: Tokenizers,
    /// The `[drift]` baseline; `None` when drift detection is off.
    pub baseline: Option<Profile>,
}

impl Resources {
    /// Loads every file `cfg` names, collecting every problem.
    pub fn load(cfg: &Config) -> Result<Resources, ConfigError> {
        let mut problems = Vec::new();
        let tokenizers = Tokenizers::from_config(&cfg.tokenizer)
            .map_err(|p| problems.extend(p))
            .ok();
        let baseline = match &cfg.drift {
            Some(d) => read_baseline(d)
                .map(Some)
                .map_err(|p| problems.push(p))
                .ok(),
            None => Some(None),
        };
        match (tokenizers, baseline) {
            (Some(tokenizers), Some(baseline)) if problems.is_empty() => Ok(Resources {
                tokenizers,
                baseline,
            }),
            _ => Err(ConfigError(problems)),
        }
    }
}

/// Validates a configuration file and loads what it names, as `goodput check-config` does.
pub fn check(path: &Path) -> Result<Config, ConfigError> {
    let cfg = config::check(path)?;
    Resources::load(&cfg)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_that_cannot_be_loaded_is_named() {
        let text = "[upstream]\nurl = \"http://127.0.0.1:1\"\n[tokenizer]\nmodels = [{ model = \"a-*\", path = \"/nonexistent/t.json\" }]\n[drift]\nbaseline = \"/nonexistent/base.jsonl\"\n";
        let cfg = config::load_str(text, "test", &Default::default()).unwrap();
        let err = Resources::load(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.models[0].path") && err.contains("/nonexistent/t.json"),
            "{err}"
        );
        assert!(
            err.contains("drift.baseline") && err.contains("/nonexistent/base.jsonl"),
            "{err}"
        );
        let plain = config::load_str(
            "[upstream]\nurl = \"http://127.0.0.1:1\"\n",
            "t",
            &Default::default(),
        )
        .unwrap();
        let loaded = Resources::load(&plain).unwrap();
        assert!(loaded.baseline.is_none());
    }
}
