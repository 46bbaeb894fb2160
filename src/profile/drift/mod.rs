//! Drift: how far some traffic has moved from a baseline profile, dimension by dimension.
//! Shared by `goodput profile diff` (two files, one comparison) and live detection
//! ([`Monitor`]: a sliding window compared every period, with hysteresis).
//!
//! | dimension | statistic | drifted when (defaults) |
//! |---|---|---|
//! | `input_length`, `output_length` | `psi`, `ks` | PSI > 0.2, KS > 0.1 |
//! | `arrival_rate` | `fold_change` (max(r, 1/r) of the mean rates) | > 2 |
//! | `burstiness` | `cv_change` (\|ΔCV\| / max(CV_base, 0.1)) | > 0.5 |
//! | `model_mix`, `api_mix` | `tvd` | > 0.1 |
//! | `prefix_reuse` | `abs_change` of the reused-block share | > 0.2 |
//! | `concurrency` | `fold_change` of mean requests in flight | > 2 |
//!
//! Every statistic needs `min_samples` requests on each side, else its value is `null`
//! and it never counts as drifted. PSI and KS thresholds are raised to their noise floor
//! for the sample sizes at hand ([`super::stats`]); the threshold reported is the one
//! applied.
//!
//! # Layout
//! - this file: [`Thresholds`], [`Dimension`], [`compare`] and the [`Report`] of `diff`.
//! - `monitor`: [`Monitor`], evaluations, hysteresis and [`DriftStatus`].
//! - `window`: [`Window`], the live window as mergeable summaries in fixed memory.
//! - `webhook`: [`Webhook`], the optional JSON POST on transitions.
//! - `snapshot`: [`write_snapshot`], the live window as a profile file.
//! - `system`: [`IdentityWatch`], the upstream's identity read on a timer; a change fires
//!   the `system` trigger.

#[cfg(test)]
mod live_tests;
mod monitor;
mod snapshot;
mod system;
mod webhook;
mod window;

use std::collections::BTreeMap;

use serde::Serialize;

pub use monitor::{DimensionStatus, DriftStatus, Monitor, SYSTEM, Transition, TransitionKind};
pub use snapshot::{write_profile, write_snapshot};
pub use system::{IdentityWatch, SystemChange};
pub use webhook::Webhook;
pub use window::{ARRIVALS, PANES, REUSE_SLOTS, Window, binned, length_bin};

use super::{shape::Shape, stats};

pub use crate::config::drift::Thresholds;

/// Reads `[drift] baseline`: a profile with at least one request. What is wrong with it is
/// a configuration problem under `drift.baseline`, naming the file.
pub fn read_baseline(
    cfg: &crate::config::DriftConfig,
) -> Result<super::Profile, crate::config::Problem> {
    let path = &cfg.baseline_path;
    match super::Profile::read(std::slice::from_ref(path)) {
        Ok(p) if p.entries.is_empty() => Err(crate::config::Problem::invalid(
            "drift.baseline",
            format!("`{}` holds no requests", path.display()),
        )),
        Ok(p) => Ok(p),
        Err(e) => Err(crate::config::Problem::invalid(
            "drift.baseline",
            e.to_string(),
        )),
    }
}

/// One statistic of one dimension. The fields `name`, `statistic`, `value`, `threshold`,
/// `drifted` are a contract (`goodput profile diff --json`, `/api/v1/drift`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dimension {
    pub name: &'static str,
    pub statistic: &'static str,
    /// `null` when either side has fewer than `min_samples` requests (or no data).
    pub value: Option<f64>,
    /// The threshold applied (the configured one, raised to the noise floor if needed).
    pub threshold: f64,
    pub drifted: bool,
    /// What moved, from what to what, in one sentence.
    pub explanation: String,
}

/// `goodput profile diff`: every statistic, and whether anything drifted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub drifted: bool,
    pub dimensions: Vec<Dimension>,
    pub base_requests: usize,
    pub live_requests: usize,
    pub min_samples: usize,
}

impl Report {
    pub fn new(base: &Shape, live: &Shape, t: &Thresholds, min_samples: usize) -> Report {
        let dimensions = compare(base, live, t, min_samples);
        Report {
            drifted: dimensions.iter().any(|d| d.drifted),
            dimensions,
            base_requests: base.requests,
            live_requests: live.requests,
            min_samples,
        }
    }
}

/// Compares `live` with `base` on every dimension (see the module doc).
pub fn compare(base: &Shape, live: &Shape, t: &Thresholds, min_samples: usize) -> Vec<Dimension> {
    let enough = |a: usize, b: usize| a >= min_samples.max(1) && b >= min_samples.max(1);
    let short = |a: usize, b: usize| {
        format!("not enough samples (baseline {a}, live {b}; {min_samples} needed on each side)")
    };
    let mut out = Vec::new();
    for (name, label, b, l) in [
        ("input_length", "input length", &base.input, &live.input),
        ("output_length", "output length", &base.output, &live.output),
    ] {
        let p50 = |v: &stats::Counts| v.percentile(0.5).unwrap_or(0.0);
        let moved = format!("{label} P50 {} → {} tokens", p50(b), p50(l));
        if !enough(b.len(), l.len()) {
            for statistic in ["psi", "ks"] {
                out.push(missing(name, statistic, t.psi, short(b.len(), l.len())));
            }
            continue;
        }
        let (psi, bins) = stats::psi(b, l).unwrap_or((0.0, 1));
        let threshold = t.psi.max(stats::psi_noise_floor(b.len(), l.len(), bins));
        out.push(judge(name, "psi", "PSI", psi, threshold, &moved));
        let ks = stats::ks(b, l).unwrap_or(0.0);
        let threshold = t.ks.max(stats::ks_noise_floor(b.len(), l.len()));
        out.push(judge(name, "ks", "KS", ks, threshold, &moved));
    }
    let (nb, nl) = (base.requests, live.requests);
    if enough(nb, nl) {
        let moved = format!(
            "arrival rate {:.3} → {:.3} requests/s",
            base.rate_mean, live.rate_mean
        );
        let fold = fold_change(base.rate_mean, live.rate_mean);
        out.push(judge(
            "arrival_rate",
            "fold_change",
            "×",
            fold,
            t.rate_ratio,
            &moved,
        ));
        match (base.burstiness, live.burstiness) {
            (Some(cb), Some(cl)) => {
                let change = (cl - cb).abs() / cb.max(0.1);
                let moved = format!("burstiness (CV of inter-arrival times) {cb:.2} → {cl:.2}");
                out.push(judge(
                    "burstiness",
                    "cv_change",
                    "relative change",
                    change,
                    t.burstiness_change,
                    &moved,
                ));
            }
            _ => out.push(missing(
                "burstiness",
                "cv_change",
                t.burstiness_change,
                "too few arrivals".into(),
            )),
        }
        for (name, label, a, b) in [
            ("model_mix", "model mix", &base.models, &live.models),
            ("api_mix", "API mix", &base.apis, &live.apis),
        ] {
            let value = stats::tvd(a, b).unwrap_or(0.0);
            out.push(judge(
                name,
                "tvd",
                "TVD",
                value,
                t.tvd,
                &mix_moved(label, a, b),
            ));
        }
        match (base.prefix_reuse, live.prefix_reuse) {
            (Some(rb), Some(rl)) => {
                let moved = format!("prefix reuse {rb:.2} → {rl:.2} of prompt blocks");
                out.push(judge(
                    "prefix_reuse",
                    "abs_change",
                    "|Δ|",
                    (rl - rb).abs(),
                    t.reuse_change,
                    &moved,
                ));
            }
            _ => out.push(missing(
                "prefix_reuse",
                "abs_change",
                t.reuse_change,
                "no hash_ids on one side".into(),
            )),
        }
        match (base.concurrency, live.concurrency) {
            (Some(cb), Some(cl)) => {
                let moved = format!("mean concurrency {cb:.2} → {cl:.2} requests in flight");
                out.push(judge(
                    "concurrency",
                    "fold_change",
                    "×",
                    fold_change(cb, cl),
                    t.concurrency_ratio,
                    &moved,
                ));
            }
            _ => out.push(missing(
                "concurrency",
                "fold_change",
                t.concurrency_ratio,
                "no latencies".into(),
            )),
        }
    } else {
        for (name, statistic, threshold) in [
            ("arrival_rate", "fold_change", t.rate_ratio),
            ("burstiness", "cv_change", t.burstiness_change),
            ("model_mix", "tvd", t.tvd),
            ("api_mix", "tvd", t.tvd),
            ("prefix_reuse", "abs_change", t.reuse_change),
            ("concurrency", "fold_change", t.concurrency_ratio),
        ] {
            out.push(missing(name, statistic, threshold, short(nb, nl)));
        }
    }
    out
}

/// max(r, 1/r) of live/base: 1 when equal, symmetric for rises and falls.
fn fold_change(base: f64, live: f64) -> f64 {
    if base <= 0.0 || live <= 0.0 {
        return if base == live { 1.0 } else { f64::INFINITY };
    }
    let r = live / base;
    r.max(1.0 / r)
}

fn judge(
    name: &'static str,
    statistic: &'static str,
    shown: &str,
    value: f64,
    threshold: f64,
    moved: &str,
) -> Dimension {
    let drifted = value > threshold;
    let cmp = if drifted { ">" } else { "≤" };
    Dimension {
        name,
        statistic,
        value: Some(value),
        threshold,
        drifted,
        explanation: format!("{moved} ({shown} {value:.3} {cmp} {threshold:.3})"),
    }
}

fn missing(name: &'static str, statistic: &'static str, threshold: f64, why: String) -> Dimension {
    Dimension {
        name,
        statistic,
        value: None,
        threshold,
        drifted: false,
        explanation: why,
    }
}

/// "model mix: llama 90% → 40%": the category whose share moved most.
fn mix_moved(label: &str, a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> String {
    let share = |m: &BTreeMap<String, u64>, k: &str| {
        let n = m.values().sum::<u64>().max(1) as f64;
        m.get(k).copied().unwrap_or(0) as f64 / n * 100.0
    };
    let top = a
        .keys()
        .chain(b.keys())
        .map(|k| (k, (share(a, k) - share(b, k)).abs()))
        .max_by(|x, y| x.1.total_cmp(&y.1));
    match top {
        Some((k, _)) => format!("{label}: {k} {:.0}% → {:.0}%", share(a, k), share(b, k)),
        None => label.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::shape::{Shape, tests::sample};

    fn shape(output: impl Fn(i64) -> u64) -> Shape {
        let samples: Vec<_> = (0..2000)
            .map(|i| sample(i * 500, 100 + (i % 7) as u64 * 30, output(i)))
            .collect();
        Shape::of(&samples, None)
    }

    #[test]
    fn an_output_shift_is_flagged_and_explained() {
        let base = shape(|i| 150 + (i % 61) as u64);
        let live = shape(|i| 380 + (i % 61) as u64);
        let r = Report::new(&base, &live, &Thresholds::default(), 200);
        assert!(r.drifted);
        let psi = r
            .dimensions
            .iter()
            .find(|d| d.name == "output_length" && d.statistic == "psi")
            .unwrap();
        assert!(psi.drifted, "{psi:?}");
        assert!(
            psi.explanation
                .starts_with("output length P50 180 → 410 tokens (PSI "),
            "{}",
            psi.explanation
        );
        let input = r
            .dimensions
            .iter()
            .find(|d| d.name == "input_length")
            .unwrap();
        assert!(!input.drifted && input.value == Some(0.0));
        assert_eq!(
            r.dimensions.iter().filter(|d| d.drifted).count(),
            2,
            "{:#?}",
            r.dimensions
        );
    }

    #[test]
    fn too_few_samples_is_never_drift() {
        let base = shape(|_| 10);
        let small = Shape::of(&[sample(0, 5000, 5000)], None);
        let r = Report::new(&base, &small, &Thresholds::default(), 200);
        assert!(!r.drifted);
        assert!(r.dimensions.iter().all(|d| d.value.is_none()));
        assert_eq!(r.dimensions.len(), 10);
    }

    #[test]
    fn thresholds_are_checked() {
        let bad = Thresholds {
            psi: 0.0,
            rate_ratio: 1.0,
            ..Thresholds::default()
        };
        let p: Vec<&str> = bad.problems().iter().map(|p| p.0).collect();
        assert_eq!(p, ["psi", "rate_ratio"]);
        assert_eq!(fold_change(2.0, 1.0), 2.0);
        assert_eq!(fold_change(0.0, 0.0), 1.0);
    }
}
