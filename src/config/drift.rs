//! `[drift]`: live comparison with the profile a deployment was accepted on. The file's
//! section, its validation and the runtime value. Key names are a contract with users'
//! configs; every key is documented in `config/goodput.example.toml` and `docs/PROFILE.md`.
//!
//! The baseline is named here and read by `profile::drift::read_baseline` when the server
//! starts and when `check-config` runs, so a missing or unreadable baseline is still a
//! configuration problem naming its path (key `drift.baseline`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::restart::Changed;
use super::{Problem, file::humantime_serde, validate::positive};

/// `[drift.thresholds]`: when a statistic counts as drifted. Documented defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    pub psi: f64,
    pub ks: f64,
    pub tvd: f64,
    pub rate_ratio: f64,
    pub burstiness_change: f64,
    pub reuse_change: f64,
    pub concurrency_ratio: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            psi: 0.2,
            ks: 0.1,
            tvd: 0.1,
            rate_ratio: 2.0,
            burstiness_change: 0.5,
            reuse_change: 0.2,
            concurrency_ratio: 2.0,
        }
    }
}

impl Thresholds {
    /// Each unusable value as (key, why).
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        let positive = [
            ("psi", self.psi),
            ("ks", self.ks),
            ("tvd", self.tvd),
            ("burstiness_change", self.burstiness_change),
            ("reuse_change", self.reuse_change),
        ];
        for (k, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                out.push((k, "must be a number greater than zero"));
            }
        }
        for (k, v) in [
            ("rate_ratio", self.rate_ratio),
            ("concurrency_ratio", self.concurrency_ratio),
        ] {
            if !(v.is_finite() && v > 1.0) {
                out.push((k, "must be a ratio greater than 1"));
            }
        }
        out
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
    /// Switch `[shadow]` on for this long when a re-acceptance trigger fires (`"30m"`);
    /// absent: a trigger leaves the shadow as it is.
    #[serde(deserialize_with = "optional_duration")]
    pub shadow_on_trigger: Option<Duration>,
    /// How often the upstream's identity is read (engine, version, model); a change fires
    /// the `system` trigger. `"0s"` turns the watch off.
    #[serde(with = "humantime_serde")]
    pub identity_interval: Duration,
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
            identity_interval: Duration::from_secs(60),
        }
    }
}

/// Live drift detection against an accepted baseline.
#[derive(Debug, Clone)]
pub struct DriftConfig {
    /// The profile the deployment was accepted on (read when the server starts).
    pub baseline_path: PathBuf,
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
    /// How often the upstream's identity is read (`None`: not at all).
    pub identity_interval: Option<Duration>,
}

/// The running monitor keeps the baseline it read at start.
pub(super) fn restart_only(
    old: Option<&DriftConfig>,
    new: Option<&DriftConfig>,
    changed: &mut Changed,
) {
    let baseline = |d: Option<&DriftConfig>| d.map(|d| d.baseline_path.clone());
    changed.check(&baseline(old), &baseline(new), "drift.baseline");
}

impl DriftConfig {
    /// A configuration for tests and tools, with the defaults of `[drift]`.
    pub fn with_defaults(baseline_path: PathBuf) -> DriftConfig {
        let d = DriftSection::default();
        DriftConfig {
            baseline_path,
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
            identity_interval: None,
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
        identity_interval: (!s.identity_interval.is_zero()).then_some(s.identity_interval),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_on_with_a_baseline_and_its_snapshots_go_beside_it() {
        let s: DriftSection = toml::from_str("baseline = \"/data/base.jsonl\"").unwrap();
        let mut problems = Vec::new();
        let d = validate_drift(&s, &mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(d.baseline_path, PathBuf::from("/data/base.jsonl"));
        assert_eq!(d.snapshot_dir, PathBuf::from("/data"));
        let off: DriftSection = toml::from_str("").unwrap();
        assert!(validate_drift(&off, &mut problems).is_none());
        let bad: DriftSection =
            toml::from_str("baseline = \"b.jsonl\"\nevery = \"0s\"\n[thresholds]\npsi = 0\n")
                .unwrap();
        validate_drift(&bad, &mut problems);
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(all.iter().any(|p| p.starts_with("drift.every")), "{all:?}");
        assert!(
            all.iter().any(|p| p.starts_with("drift.thresholds.psi")),
            "{all:?}"
        );
    }
}
