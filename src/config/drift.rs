//! `[drift]`: live comparison with the profile a deployment was accepted on. The file's
//! section, its validation and the runtime value. Key names are a contract with users'
//! configs; every key is documented in `config/goodput.example.toml` and `docs/PROFILE.md`.
//!
//! The baseline is read here, once per configuration build, so a missing or unreadable
//! baseline is a configuration problem naming its path; a reload reads it again.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::Deserialize;

use super::{Problem, file::humantime_serde, validate::positive};
use crate::profile::{Profile, drift::Thresholds};

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
    /// Switch `[shadow]` on for this long when a re-acceptance trigger fires (`"30m"`);
    /// absent: a trigger leaves the shadow as it is.
    #[serde(deserialize_with = "optional_duration")]
    pub shadow_on_trigger: Option<Duration>,
}

fn optional_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    humantime_serde::deserialize(d).map(Some)
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
            shadow_on_trigger: None,
        }
    }
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
    /// How long a fired trigger switches the shadow on (`None`: it does not).
    pub shadow_on_trigger: Option<Duration>,
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
            shadow_on_trigger: None,
        }
    }
}

pub fn validate_drift(s: &DriftSection, problems: &mut Vec<Problem>) -> Option<DriftConfig> {
    let raw = s.baseline.as_deref()?;
    positive("drift.every", s.every.as_millis() as u64, problems);
    if s.shadow_on_trigger.is_some_and(|d| d.is_zero()) {
        problems.push(Problem::invalid(
            "drift.shadow_on_trigger",
            "must be greater than zero (leave it out to keep the shadow as it is)",
        ));
    }
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
        shadow_on_trigger: s.shadow_on_trigger,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
