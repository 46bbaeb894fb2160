//! `[profile]` (anonymized traffic recording) and `[drift]` (live comparison with the
//! profile a deployment was accepted on): the file schema, its validation, and the runtime
//! values. Key names are a contract with users' configs; every key is documented in
//! `config/goodput.example.toml` and `docs/PROFILE.md`.
//!
//! The drift baseline is read here, once per configuration build, so a missing or
//! unreadable baseline is a configuration problem naming its path; a reload reads it again.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::Deserialize;

use super::{Problem, file::humantime_serde};
use crate::profile::{Contract, Profile, drift::Thresholds};

/// Default size at which a profile file is closed and a new one started.
pub const DEFAULT_ROTATE_BYTES: u64 = 64 << 20;
/// Default bytes per prompt block when hashing without a tokenizer: ≈ 512 tokens at the
/// usual ~4 bytes per token of English text, the block size Mooncake traces use.
pub const DEFAULT_BLOCK_BYTES: usize = 2048;

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

/// `[drift]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriftSection {
    /// The profile the deployment was accepted on; drift detection is off without it.
    pub baseline: Option<String>,
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    pub window_max_requests: usize,
    pub min_samples: usize,
    pub fire_after: u32,
    pub clear_after: u32,
    pub webhook: Option<String>,
    pub snapshot_dir: Option<String>,
    pub thresholds: Thresholds,
}

impl Default for DriftSection {
    fn default() -> Self {
        Self {
            baseline: None,
            every: Duration::from_secs(60),
            window: Duration::from_secs(3600),
            window_max_requests: 50_000,
            min_samples: 200,
            fire_after: 3,
            clear_after: 5,
            webhook: None,
            snapshot_dir: None,
            thresholds: Thresholds::default(),
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

/// Live drift detection against an accepted baseline.
#[derive(Debug, Clone)]
pub struct DriftConfig {
    pub baseline_path: PathBuf,
    /// The baseline, read and checked when the configuration was built.
    pub baseline: Arc<Profile>,
    pub every: Duration,
    pub window: Duration,
    /// Requests kept for the drift snapshot at most (the newest of the window); the
    /// statistics cover the whole window in fixed memory.
    pub window_max_requests: usize,
    pub min_samples: usize,
    pub fire_after: u32,
    pub clear_after: u32,
    pub webhook: Option<http::Uri>,
    pub snapshot_dir: PathBuf,
    pub thresholds: Thresholds,
}

impl DriftConfig {
    /// A configuration for tests and tools, with the defaults of `[drift]`.
    pub fn with_baseline(baseline: Profile) -> DriftConfig {
        let d = DriftSection::default();
        DriftConfig {
            baseline_path: PathBuf::new(),
            baseline: Arc::new(baseline),
            every: d.every,
            window: d.window,
            window_max_requests: d.window_max_requests,
            min_samples: d.min_samples,
            fire_after: d.fire_after,
            clear_after: d.clear_after,
            webhook: None,
            snapshot_dir: std::env::temp_dir(),
            thresholds: d.thresholds,
        }
    }
}

fn positive(key: &str, value: u64, problems: &mut Vec<Problem>) {
    if value == 0 {
        problems.push(Problem::invalid(key, "must be greater than zero"));
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

pub fn validate_drift(s: &DriftSection, problems: &mut Vec<Problem>) -> Option<DriftConfig> {
    let raw = s.baseline.as_deref()?;
    positive("drift.every", s.every.as_millis() as u64, problems);
    positive("drift.window", s.window.as_millis() as u64, problems);
    positive("drift.min_samples", s.min_samples as u64, problems);
    positive("drift.fire_after", u64::from(s.fire_after), problems);
    positive("drift.clear_after", u64::from(s.clear_after), problems);
    positive(
        "drift.window_max_requests",
        s.window_max_requests as u64,
        problems,
    );
    for p in s.thresholds.problems() {
        problems.push(Problem::invalid(format!("drift.thresholds.{}", p.0), p.1));
    }
    let webhook = s
        .webhook
        .as_deref()
        .and_then(|w| match w.parse::<http::Uri>() {
            Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) => Some(uri),
            Ok(_) => {
                problems.push(Problem::invalid(
                    "drift.webhook",
                    format!("`{w}` must start with http:// or https://"),
                ));
                None
            }
            Err(e) => {
                problems.push(Problem::invalid("drift.webhook", format!("`{w}`: {e}")));
                None
            }
        });
    let path = PathBuf::from(raw);
    let baseline = match Profile::read(std::slice::from_ref(&path)) {
        Ok(p) if p.entries.is_empty() => {
            problems.push(Problem::invalid(
                "drift.baseline",
                format!("`{raw}` holds no requests"),
            ));
            return None;
        }
        Ok(p) => p,
        Err(e) => {
            problems.push(Problem::invalid("drift.baseline", e.to_string()));
            return None;
        }
    };
    let snapshot_dir = s.snapshot_dir.as_deref().map_or_else(
        || {
            path.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf()
        },
        PathBuf::from,
    );
    Some(DriftConfig {
        baseline_path: path,
        baseline: Arc::new(baseline),
        every: s.every,
        window: s.window,
        window_max_requests: s.window_max_requests,
        min_samples: s.min_samples,
        fire_after: s.fire_after,
        clear_after: s.clear_after,
        webhook,
        snapshot_dir,
        thresholds: s.thresholds.clone(),
    })
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

    #[test]
    fn drift_needs_a_readable_baseline() {
        let s: DriftSection = toml::from_str("baseline = \"/nonexistent/base.jsonl\"").unwrap();
        let mut problems = Vec::new();
        assert!(validate_drift(&s, &mut problems).is_none());
        assert!(problems[0].to_string().contains("/nonexistent/base.jsonl"));
        let off: DriftSection = toml::from_str("").unwrap();
        assert!(validate_drift(&off, &mut problems).is_none());
        assert_eq!(problems.len(), 1);
    }
}
