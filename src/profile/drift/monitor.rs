//! Live drift detection: a sliding window of finished requests compared with the baseline
//! every evaluation period.
//!
//! Pure and deterministic: time is passed in (`at`, `now`), never read; it lives with the
//! aggregator (single owner), never on a request's path. Hysteresis keeps it quiet on
//! noise: a dimension *fires* after `fire_after` consecutive evaluations with one of its
//! statistics over threshold, and *clears* after `clear_after` consecutive evaluations
//! with none; evaluations without enough samples change nothing.
//!
//! The statistics come from the [`Window`]'s summaries, in fixed memory however many
//! requests the window holds. Only the snapshot needs requests themselves: the newest
//! `window_max_requests` are kept for it, with at most [`MAX_WINDOW_HASHES`] block
//! fingerprints between them (past it, a line is kept without its fingerprints).

use std::{
    collections::{BTreeMap, VecDeque},
    time::Instant,
};

use serde::Serialize;

use super::{
    Dimension, Thresholds, compare,
    system::SystemChange,
    window::{Window, binned},
};
use crate::{
    config::DriftConfig,
    metrics::{DimensionLabel, DriftLabels},
    profile::ProfileMetrics,
    profile::{
        ProfileLine,
        read::Profile,
        shape::{Shape, samples_of},
    },
};

/// Block fingerprints kept across the lines held for the snapshot (8 bytes each).
pub const MAX_WINDOW_HASHES: usize = 2_000_000;

/// The trigger of a system change (engine, version, model; [`super::system`]), beside
/// the traffic's dimensions.
pub const SYSTEM: &str = "system";

/// Every dimension of the traffic, in report order.
const DIMENSIONS: [&str; 8] = [
    "input_length",
    "output_length",
    "arrival_rate",
    "burstiness",
    "model_mix",
    "api_mix",
    "prefix_reuse",
    "concurrency",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    Fired,
    Cleared,
}

/// A dimension that started or stopped requiring re-acceptance at this evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    pub dimension: &'static str,
    /// Why: `traffic` (a dimension of the traffic drifted) or `system` (the upstream
    /// changed what it is).
    pub reason: &'static str,
    pub kind: TransitionKind,
    /// One sentence: what moved, from what to what (the statistic that decided).
    pub explanation: String,
}

/// One statistic with the dimension's hysteresis state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DimensionStatus {
    #[serde(flatten)]
    pub stat: Dimension,
    /// The dimension requires re-acceptance (fired and not cleared).
    pub reacceptance_required: bool,
}

/// What `GET /api/v1/drift` serves: the last evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DriftStatus {
    pub baseline: String,
    pub window_s: f64,
    pub evaluations: u64,
    pub baseline_requests: usize,
    pub live_requests: usize,
    pub min_samples: usize,
    /// Some dimension requires re-acceptance.
    pub drifted: bool,
    /// The dimensions that require re-acceptance.
    pub active: Vec<&'static str>,
    pub dimensions: Vec<DimensionStatus>,
    /// Fired or cleared at the last evaluation.
    pub transitions: Vec<Transition>,
    /// The upstream's identity changed since the deployment was accepted: from what, to
    /// what. It requires re-acceptance until goodput is restarted with the new baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemChange>,
}

impl DriftStatus {
    /// Sets `goodput_profile_drift{dimension,statistic}` and
    /// `goodput_reacceptance_required{dimension}`.
    pub fn publish(&self, metrics: &ProfileMetrics) {
        for d in &self.dimensions {
            let labels = DriftLabels {
                dimension: d.stat.name,
                statistic: d.stat.statistic,
            };
            match d.stat.value {
                Some(v) if v.is_finite() => {
                    metrics.profile_drift.get_or_create(&labels).set(v);
                }
                // No value: no series, rather than a stale or invented one.
                _ => {
                    metrics.profile_drift.remove(&labels);
                }
            }
        }
        for dimension in DIMENSIONS.into_iter().chain([SYSTEM]) {
            let active = self.active.contains(&dimension);
            metrics
                .reacceptance
                .get_or_create(&DimensionLabel { dimension })
                .set(i64::from(active));
        }
    }

    /// One structured log event per transition.
    pub fn log_transitions(&self) {
        for t in &self.transitions {
            match t.kind {
                TransitionKind::Fired => tracing::warn!(
                    dimension = t.dimension,
                    event = "drift_fired",
                    "re-acceptance required: {}",
                    t.explanation
                ),
                TransitionKind::Cleared => tracing::info!(
                    dimension = t.dimension,
                    event = "drift_cleared",
                    "drift cleared: {}",
                    t.explanation
                ),
            }
        }
    }

    /// Whether a dimension fired at the last evaluation (time for a snapshot).
    pub fn fired(&self) -> bool {
        self.transitions
            .iter()
            .any(|t| t.kind == TransitionKind::Fired)
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Hysteresis {
    over: u32,
    under: u32,
    active: bool,
}

/// A request kept for the snapshot, with the pane it counts in.
struct Held {
    pane: u64,
    line: ProfileLine,
}

/// See the module doc.
pub struct Monitor {
    thresholds: Thresholds,
    min_samples: usize,
    max_requests: usize,
    fire_after: u32,
    clear_after: u32,
    baseline_name: String,
    base: Shape,
    live: Window,
    lines: VecDeque<Held>,
    /// Fingerprints held in `lines`.
    hashes: usize,
    states: BTreeMap<&'static str, Hysteresis>,
    status: DriftStatus,
    /// A system change not yet evaluated, and the one in force.
    system_pending: Option<SystemChange>,
    system: Option<SystemChange>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("baseline", &self.baseline_name)
            .field("live", &self.lines.len())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    pub fn new(cfg: &DriftConfig, baseline: &Profile) -> Monitor {
        let mut base = Shape::of(&samples_of(baseline), None);
        // Lengths in the live window's bins, so both sides are measured alike.
        base.input = binned(&base.input);
        base.output = binned(&base.output);
        let baseline_name = cfg.baseline_path.display().to_string();
        Monitor {
            thresholds: cfg.thresholds.clone(),
            min_samples: cfg.min_samples,
            max_requests: cfg.window_max_requests.max(1),
            fire_after: cfg.fire_after.max(1),
            clear_after: cfg.clear_after.max(1),
            status: DriftStatus {
                baseline: baseline_name.clone(),
                baseline_requests: base.requests,
                min_samples: cfg.min_samples,
                ..Default::default()
            },
            baseline_name,
            base,
            live: Window::new(cfg.window),
            lines: VecDeque::new(),
            hashes: 0,
            states: BTreeMap::new(),
            system_pending: None,
            system: None,
        }
    }

    /// The upstream changed what it is: the next evaluation fires `system` (no hysteresis:
    /// one read both before and after is proof enough), and it stays required.
    pub fn system_changed(&mut self, change: SystemChange) {
        // Against the identity accepted on, not the one of a change already in force.
        let from = self.system.as_ref().map(|s| s.from.clone());
        self.system_pending = Some(match from {
            Some(from) => SystemChange { from, ..change },
            None => change,
        });
    }

    /// Adds a finished request, `at` = when it finished.
    pub fn observe(&mut self, line: &ProfileLine, at: Instant) {
        let Some(pane) = self.live.observe(line, at) else {
            return;
        };
        while self.lines.len() >= self.max_requests {
            self.pop();
        }
        let mut line = line.clone();
        if self.hashes + line.block_hashes.len() > MAX_WINDOW_HASHES {
            line.block_hashes = Vec::new();
        }
        self.hashes += line.block_hashes.len();
        self.lines.push_back(Held { pane, line });
        self.trim();
    }

    /// Compares the window ending at `now` with the baseline and applies hysteresis.
    pub fn evaluate(&mut self, now: Instant) -> DriftStatus {
        let (live, covered) = self.live.shape(now);
        self.trim();
        let stats = compare(&self.base, &live, &self.thresholds, self.min_samples);
        let mut transitions = Vec::new();
        for name in DIMENSIONS {
            let mine: Vec<&Dimension> = stats.iter().filter(|d| d.name == name).collect();
            if mine.iter().all(|d| d.value.is_none()) {
                continue;
            }
            let decisive = mine.iter().find(|d| d.drifted).or(mine.first()).copied();
            let state = self.states.entry(name).or_default();
            if mine.iter().any(|d| d.drifted) {
                state.over += 1;
                state.under = 0;
            } else {
                state.under += 1;
                state.over = 0;
            }
            let kind = if !state.active && state.over >= self.fire_after {
                state.active = true;
                Some(TransitionKind::Fired)
            } else if state.active && state.under >= self.clear_after {
                state.active = false;
                Some(TransitionKind::Cleared)
            } else {
                None
            };
            if let (Some(kind), Some(d)) = (kind, decisive) {
                transitions.push(Transition {
                    dimension: name,
                    reason: "traffic",
                    kind,
                    explanation: d.explanation.clone(),
                });
            }
        }
        if let Some(change) = self.system_pending.take() {
            transitions.push(Transition {
                dimension: SYSTEM,
                reason: SYSTEM,
                kind: TransitionKind::Fired,
                explanation: change.explanation.clone(),
            });
            self.system = Some(change);
        }
        let mut active: Vec<&'static str> = DIMENSIONS
            .into_iter()
            .filter(|n| self.states.get(n).is_some_and(|s| s.active))
            .collect();
        if self.system.is_some() {
            active.push(SYSTEM);
        }
        self.status = DriftStatus {
            baseline: self.baseline_name.clone(),
            window_s: covered.as_secs_f64(),
            evaluations: self.status.evaluations + 1,
            baseline_requests: self.base.requests,
            live_requests: live.requests,
            min_samples: self.min_samples,
            drifted: !active.is_empty(),
            dimensions: stats
                .into_iter()
                .map(|stat| DimensionStatus {
                    reacceptance_required: active.contains(&stat.name),
                    stat,
                })
                .collect(),
            active,
            transitions,
            system: self.system.clone(),
        };
        self.status.clone()
    }

    /// The last evaluation (for `GET /api/v1/drift`).
    pub fn status(&self) -> &DriftStatus {
        &self.status
    }

    /// The newest requests in the live window (at most `window_max_requests`), in the
    /// order they finished (for [`super::write_snapshot`]).
    pub fn window_lines(&self) -> impl Iterator<Item = &ProfileLine> {
        let oldest = self.live.oldest_pane();
        self.lines
            .iter()
            .filter(move |h| h.pane >= oldest)
            .map(|h| &h.line)
    }

    /// Drops the held lines whose pane left the window (they finished in order, so from
    /// the front; one that finished late behind a newer one waits, filtered out).
    fn trim(&mut self) {
        let oldest = self.live.oldest_pane();
        while self.lines.front().is_some_and(|h| h.pane < oldest) {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some(h) = self.lines.pop_front() {
            self.hashes -= h.line.block_hashes.len();
        }
    }
}
