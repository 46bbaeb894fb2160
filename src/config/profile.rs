//! `[profile]`: anonymized traffic recording. The file's section, its validation and the
//! runtime value. Key names are a contract with users' configs; every key is documented
//! in `config/goodput.example.toml` and `docs/PROFILE.md`.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::restart::Changed;
use super::{Problem, file::humantime_serde, validate::positive};

/// Default size at which a profile file is closed and a new one started.
pub const DEFAULT_ROTATE_BYTES: u64 = 64 << 20;
/// Default bytes per prompt block when hashing without a tokenizer: ≈ 512 tokens at the
/// usual ~4 bytes per token of English text, the block size Mooncake traces use.
pub const DEFAULT_BLOCK_BYTES: usize = 2048;

/// Test-contract metadata from `[profile.contract]`: what the traffic was served by. All
/// free-form and optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_revision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

/// `[profile]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileSection {
    /// Directory profile files are written to; recording is off without it.
    pub dir: Option<String>,
    /// Name of this proxy instance in file names (default: the host name).
    pub instance: Option<String>,
    pub rotate_bytes: u64,
    #[serde(with = "humantime_serde")]
    pub rotate_every: Duration,
    /// Retention: newest files of this instance kept (0 = no limit).
    pub max_files: usize,
    /// Retention: files last written longer ago than this are deleted (default: kept).
    pub max_age: Option<String>,
    pub queue: usize,
    pub hash_ids: bool,
    /// Model globs whose requests are recorded without `hash_ids`.
    pub hash_ids_skip: Vec<String>,
    pub block_bytes: usize,
    /// Key for hash_ids and tenant hashes; random per process when absent.
    pub salt: Option<String>,
    pub contract: Contract,
}

impl Default for ProfileSection {
    fn default() -> Self {
        Self {
            dir: None,
            instance: None,
            rotate_bytes: DEFAULT_ROTATE_BYTES,
            rotate_every: Duration::from_secs(3600),
            max_files: 168,
            max_age: None,
            queue: 4096,
            hash_ids: true,
            hash_ids_skip: Vec::new(),
            block_bytes: DEFAULT_BLOCK_BYTES,
            salt: None,
            contract: Contract::default(),
        }
    }
}

/// How profiles are recorded and anonymized. Always present: the salt and block settings
/// are also what live drift detection hashes with when recording is off.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    /// `None`: recording is off.
    pub dir: Option<PathBuf>,
    pub instance: String,
    pub rotate_bytes: u64,
    pub rotate_every: Duration,
    pub max_files: usize,
    pub max_age: Option<Duration>,
    pub queue: usize,
    pub hash_ids: bool,
    pub hash_ids_skip: Vec<String>,
    pub block_bytes: usize,
    pub salt: Option<String>,
    pub contract: Contract,
}

impl ProfileConfig {
    /// The recorder's files and the hashes already written.
    pub(super) fn restart_only(&self, new: &ProfileConfig, changed: &mut Changed) {
        changed.check(&self.dir, &new.dir, "profile.dir");
        changed.check(&self.salt, &new.salt, "profile.salt");
    }
}

/// Host name, for file names; `goodput` when it cannot be read.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "goodput".to_owned())
}

/// Keeps file names portable and sortable: letters, digits, `.`, `_`; the rest become `_`.
fn sanitize_instance(raw: &str) -> String {
    let s: String = raw
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "goodput".into() } else { s }
}

pub fn validate_profile(s: &ProfileSection, problems: &mut Vec<Problem>) -> ProfileConfig {
    positive("profile.rotate_bytes", s.rotate_bytes, problems);
    positive(
        "profile.rotate_every",
        s.rotate_every.as_millis() as u64,
        problems,
    );
    positive("profile.queue", s.queue as u64, problems);
    if s.block_bytes < 16 {
        problems.push(Problem::invalid(
            "profile.block_bytes",
            "must be at least 16 (2048 approximates 512 tokens)",
        ));
    }
    if s.salt.as_deref().is_some_and(|salt| salt.len() < 16) {
        problems.push(Problem::invalid(
            "profile.salt",
            "must be at least 16 characters: a short salt can be guessed",
        ));
    }
    let max_age = s
        .max_age
        .as_deref()
        .and_then(|raw| match humantime::parse_duration(raw) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                problems.push(Problem::invalid(
                    "profile.max_age",
                    "must be greater than zero",
                ));
                None
            }
            Err(e) => {
                problems.push(Problem::invalid("profile.max_age", format!("`{raw}`: {e}")));
                None
            }
        });
    if s.dir.as_deref() == Some("") {
        problems.push(Problem::invalid("profile.dir", "must not be empty"));
    }
    ProfileConfig {
        dir: s
            .dir
            .as_deref()
            .filter(|d| !d.is_empty())
            .map(PathBuf::from),
        instance: sanitize_instance(&s.instance.clone().unwrap_or_else(host_name)),
        rotate_bytes: s.rotate_bytes,
        rotate_every: s.rotate_every,
        max_files: s.max_files,
        max_age,
        queue: s.queue,
        hash_ids: s.hash_ids,
        hash_ids_skip: s.hash_ids_skip.clone(),
        block_bytes: s.block_bytes,
        salt: s.salt.clone(),
        contract: s.contract.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_profile(text: &str) -> (ProfileConfig, Vec<Problem>) {
        let s: ProfileSection = toml::from_str(text).unwrap();
        let mut problems = Vec::new();
        let cfg = validate_profile(&s, &mut problems);
        (cfg, problems)
    }

    #[test]
    fn defaults_record_nothing() {
        let (cfg, problems) = parse_profile("");
        assert!(problems.is_empty());
        assert!(cfg.dir.is_none());
        assert_eq!(cfg.rotate_bytes, 64 << 20);
        assert_eq!(cfg.block_bytes, 2048);
        assert!(cfg.hash_ids);
    }

    #[test]
    fn bad_values_are_named() {
        let (_, problems) = parse_profile(
            "rotate_bytes = 0\nqueue = 0\nsalt = \"short\"\nmax_age = \"soon\"\nblock_bytes = 1\n",
        );
        let msg: Vec<String> = problems.iter().map(ToString::to_string).collect();
        for key in ["rotate_bytes", "queue", "salt", "max_age", "block_bytes"] {
            assert!(msg.iter().any(|m| m.contains(key)), "{key}: {msg:?}");
        }
    }

    #[test]
    fn instance_names_are_sanitized() {
        let (cfg, _) = parse_profile("instance = \"gw 1/a\"\n[contract]\nengine = \"vllm\"\n");
        assert_eq!(cfg.instance, "gw_1_a");
        assert_eq!(cfg.contract.engine.as_deref(), Some("vllm"));
    }
}
