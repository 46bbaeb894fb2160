//! The run's gates: it passes only when every gate passes, and report.json `gates` says
//! which failed and why, each with `pass`, `target` and `actual`.
//!
//! - `slo`: every class's verdict ([`super::report::verdict`]); target and actual are the
//!   attainment target and attainment of the class closest to failing.
//! - `quality`: `--probes` pass rate ≥ `--quality-min` (default 1.0); a run whose probes
//!   never got an answer to judge fails.
//! - `recovery`: `--fault-cmd` recovered within `--recovery-deadline`; a fault that never
//!   ran fails.
//! - `abnormal_input`: with `--inject`, every injected request got a 2xx or 4xx (a 5xx,
//!   no answer, a reset or a timeout fails), and the normal requests' attainment while an
//!   injected request was in flight is within `--isolation-max-drop` points of their
//!   attainment without.
//! - `resources`: no XID error on any GPU (`--gpu-metrics`), and a soak's engine and GPU
//!   memory did not drift past their limits.
//!
//! - `resources` fails on an XID error present before the run (non-zero at a GPU's first
//!   scrape) or raised during it, a GPU whose clock throttle reasons (idle and
//!   application-clock settings aside) were set in more than `--max-throttle-share` of
//!   its samples, an engine restart seen in its metrics, preemptions past
//!   `--max-preemptions` (default: none while the `slo` gate fails), host memory
//!   available below `--host-memory-min-share` (`--node-metrics`), and a soak's engine
//!   and GPU memory drifting past their limits.
//!
//! Each gate has a `state`: `pass`, `fail`, `unjudged` (asked for, but its inputs are
//! missing: no answered probe, an exporter that answered fewer than 90% of its scrapes,
//! ...) or `not requested` (the run did not ask for it: `judged: false`, and it passes).
//! No gate passes blind: an unjudged gate fails the run unless `--allow-unjudged GATE`
//! names it (`allowed_unjudged: true`). With `--repeat N`,
//! `slo`, `quality` and `abnormal_input` are judged on every repeat: each repeat's
//! actual, the worst and the 95% confidence interval are in `repeats`, and one failing
//! repeat fails the gate (`recovery` and `resources` are judged over the whole run: one
//! fault, and XID errors whenever they come).
//!
//! Gates read plain figures ([`Figures`], [`Thresholds`], [`ClassResult`],
//! [`ResourceFigures`]) that the report fills in: the report imports the gates, never
//! the reverse.

use serde::Serialize;

use super::{
    inject::{Injection, Kind},
    probes::{ProbeTally, Quality},
    recovery::Recovery,
    repeats::Ci,
    tally::Sample,
};
use crate::measure::Outcome;

mod resources;
pub use resources::{ResourceFigures, ScrapeCount, resources};

/// A gate's name (`--allow-unjudged GATE`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateName {
    #[value(name = "slo")]
    Slo,
    #[value(name = "quality")]
    Quality,
    #[value(name = "recovery")]
    Recovery,
    #[value(name = "abnormal_input")]
    AbnormalInput,
    #[value(name = "resources")]
    Resources,
}

impl GateName {
    pub fn as_str(self) -> &'static str {
        match self {
            GateName::Slo => "slo",
            GateName::Quality => "quality",
            GateName::Recovery => "recovery",
            GateName::AbnormalInput => "abnormal_input",
            GateName::Resources => "resources",
        }
    }
}

/// What became of a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pass,
    Fail,
    /// Asked for, but its inputs are missing: it cannot say the run is fine.
    Unjudged,
    /// The run did not ask for it (no `--probes`, no `--fault-cmd`, ...).
    NotRequested,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pass => "pass",
            State::Fail => "fail",
            State::Unjudged => "unjudged",
            State::NotRequested => "not requested",
        }
    }
}

impl Serialize for State {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One gate.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub pass: bool,
    /// This run gave the gate something to judge (`false`: not requested, or unjudged).
    pub judged: bool,
    pub state: State,
    /// Unjudged, and accepted so by `--allow-unjudged`.
    pub allowed_unjudged: bool,
    /// The few words the terminal's verdict line gives a gate that failed
    /// (`12/21 probes`, `unjudged: gpu exporter unreachable`).
    #[serde(skip)]
    pub brief: String,
    /// What `target` and `actual` are.
    pub measure: &'static str,
    pub target: Option<f64>,
    pub actual: Option<f64>,
    pub reason: Option<String>,
    /// `--repeat N`: the gate judged on each repeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeats: Option<GateRepeats>,
    /// `abnormal_input`: the normal requests' attainment with an injected request in
    /// flight and without, and the drop in points against its limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// `quality`: each probe's answers and pass rate, for a comparison's flips.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_probe: Option<Vec<ProbeTally>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateRepeats {
    /// Each repeat's actual, in order.
    pub values: Vec<Option<f64>>,
    pub passed: Vec<bool>,
    /// The worst repeat's actual.
    pub worst: Option<f64>,
    pub ci: Ci,
}

#[derive(Debug, Clone, Serialize)]
pub struct Isolation {
    pub attainment_beside_injected: Option<f64>,
    pub attainment_alone: Option<f64>,
    pub drop_points: Option<f64>,
    pub max_drop_points: f64,
}

/// report.json `gates`.
#[derive(Debug, Clone, Serialize)]
pub struct Gates {
    pub slo: Gate,
    pub quality: Gate,
    pub recovery: Gate,
    pub abnormal_input: Gate,
    pub resources: Gate,
}

impl Gates {
    /// Every unjudged gate named in `allowed` passes, marked `allowed_unjudged`.
    pub fn allow_unjudged(&mut self, allowed: &[GateName]) {
        for name in allowed {
            let g = match name {
                GateName::Slo => &mut self.slo,
                GateName::Quality => &mut self.quality,
                GateName::Recovery => &mut self.recovery,
                GateName::AbnormalInput => &mut self.abnormal_input,
                GateName::Resources => &mut self.resources,
            };
            if g.state == State::Unjudged {
                g.pass = true;
                g.allowed_unjudged = true;
            }
        }
    }

    /// The terminal's last line: `PASSED`, or `FAILED:` and each failed gate in brief
    /// (`FAILED: quality (12/21 probes), resources (unjudged: gpu exporter unreachable)`).
    pub fn verdict_line(&self) -> String {
        let failed: Vec<String> = self
            .all()
            .iter()
            .filter(|(_, g)| !g.pass)
            .map(|(n, g)| format!("{n} ({})", g.brief))
            .collect();
        if failed.is_empty() {
            let allowed: Vec<&str> = self
                .all()
                .iter()
                .filter(|(_, g)| g.allowed_unjudged)
                .map(|(n, _)| *n)
                .collect();
            if allowed.is_empty() {
                "PASSED".to_owned()
            } else {
                format!("PASSED (unjudged, allowed: {})", allowed.join(", "))
            }
        } else {
            format!("FAILED: {}", failed.join(", "))
        }
    }

    pub fn all(&self) -> [(&'static str, &Gate); 5] {
        [
            ("slo", &self.slo),
            ("quality", &self.quality),
            ("recovery", &self.recovery),
            ("abnormal_input", &self.abnormal_input),
            ("resources", &self.resources),
        ]
    }

    pub fn pass(&self) -> bool {
        self.all().iter().all(|(_, g)| g.pass)
    }

    /// `name: reason` of each failed gate.
    pub fn failures(&self) -> Vec<String> {
        self.all()
            .iter()
            .filter(|(_, g)| !g.pass)
            .map(|(n, g)| format!("{n}: {}", g.reason.as_deref().unwrap_or("failed")))
            .collect()
    }
}

fn untested(measure: &'static str, why: &str) -> Gate {
    Gate {
        pass: true,
        judged: false,
        state: State::NotRequested,
        allowed_unjudged: false,
        brief: format!("not requested: {why}"),
        measure,
        target: None,
        actual: None,
        reason: Some(format!("not judged: {why}")),
        repeats: None,
        isolation: None,
        by_probe: None,
    }
}

/// Asked for, but with nothing to judge it by: fails unless allowed.
fn unjudged(measure: &'static str, why: String) -> Gate {
    Gate {
        pass: false,
        judged: false,
        state: State::Unjudged,
        brief: format!("unjudged: {why}"),
        reason: Some(format!("unjudged: {why}")),
        ..untested(measure, "")
    }
}

/// A judged gate: it passes when `why` is empty, else fails for those reasons (the first
/// being the brief one unless `brief` says otherwise).
fn judged(
    measure: &'static str,
    target: Option<f64>,
    actual: Option<f64>,
    why: Vec<String>,
    brief: Option<String>,
) -> Gate {
    let pass = why.is_empty();
    Gate {
        pass,
        judged: true,
        state: if pass { State::Pass } else { State::Fail },
        allowed_unjudged: false,
        brief: brief.unwrap_or_else(|| why.first().cloned().unwrap_or_default()),
        measure,
        target,
        actual,
        reason: (!pass).then(|| why.join("; ")),
        repeats: None,
        isolation: None,
        by_probe: None,
    }
}

fn repeats_of(values: Vec<Option<f64>>, passed: Vec<bool>, lower_is_worse: bool) -> GateRepeats {
    let present: Vec<f64> = values.iter().flatten().copied().collect();
    let worst = if lower_is_worse {
        present.iter().copied().reduce(f64::min)
    } else {
        present.iter().copied().reduce(f64::max)
    };
    GateRepeats {
        ci: Ci::of(present),
        values,
        passed,
        worst,
    }
}

/// One SLO class's verdict at the judged load.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassResult {
    pub class: String,
    pub pass: bool,
    pub attainment: Option<f64>,
    pub attainment_target: f64,
    pub reason: Option<String>,
}

/// The class closest to failing: (attainment target, attainment).
fn tightest(classes: &[ClassResult]) -> Option<(f64, Option<f64>)> {
    classes
        .iter()
        .map(|v| (v.attainment_target, v.attainment))
        .min_by(|a, b| {
            let margin = |x: &(f64, Option<f64>)| x.1.map_or(f64::NEG_INFINITY, |a| a - x.0);
            margin(a).total_cmp(&margin(b))
        })
}

/// `slo`: `classes` at the judged load; `per_repeat`, with `--repeat N`, the classes
/// at each repeat's step at that load.
pub fn slo(classes: &[ClassResult], per_repeat: Option<&[Vec<ClassResult>]>) -> Gate {
    const MEASURE: &str = "attainment of the class closest to failing, at the judged load";
    if classes.is_empty() {
        return unjudged(MEASURE, "no measured request".into());
    }
    let failed: Vec<&ClassResult> = classes.iter().filter(|v| !v.pass).collect();
    let why: Vec<String> = failed
        .iter()
        .map(|v| format!("{}: {}", v.class, v.reason.as_deref().unwrap_or("failed")))
        .collect();
    let brief = (!failed.is_empty()).then(|| {
        let names: Vec<&str> = failed.iter().map(|v| v.class.as_str()).collect();
        format!("class {} failed", names.join(", "))
    });
    let (target, actual) = tightest(classes).unwrap_or((0.0, None));
    let mut g = judged(MEASURE, Some(target), actual, why, brief);
    if let Some(reps) = per_repeat.filter(|r| r.len() > 1) {
        let passed: Vec<bool> = reps
            .iter()
            .map(|v| !v.is_empty() && v.iter().all(|v| v.pass))
            .collect();
        let values = reps.iter().map(|v| tightest(v).and_then(|t| t.1)).collect();
        fail_repeats(&mut g, &passed, "failed its SLO");
        g.repeats = Some(repeats_of(values, passed, true));
    }
    g
}

/// `quality`: `overall` over every measured probe, `per_repeat` with `--repeat N`.
pub fn quality(overall: Option<&Quality>, per_repeat: Option<&[Quality]>, min: f64) -> Gate {
    const MEASURE: &str = "probe pass rate";
    let Some(q) = overall else {
        return untested(MEASURE, "no --probes");
    };
    let Some(rate) = q.pass_rate else {
        return unjudged(MEASURE, "no probe got an answer to judge".into());
    };
    let holds = |q: &Quality| q.pass_rate.is_some_and(|r| r + 1e-9 >= min);
    let why = if holds(q) {
        Vec::new()
    } else {
        vec![format!(
            "{} of {} probes passed ({:.1}%), below --quality-min {:.1}%",
            q.passed,
            q.probes,
            rate * 100.0,
            min * 100.0
        )]
    };
    let brief = format!("{}/{} probes", q.passed, q.probes);
    let mut g = judged(MEASURE, Some(min), Some(rate), why, Some(brief));
    g.by_probe = Some(q.by_probe.clone());
    if let Some(reps) = per_repeat.filter(|r| r.len() > 1) {
        let passed: Vec<bool> = reps.iter().map(holds).collect();
        if passed.iter().any(|p| !p) && g.pass {
            fail(
                &mut g,
                "a repeat's probe pass rate is below --quality-min".into(),
            );
        }
        let values = reps.iter().map(|q| q.pass_rate).collect();
        g.repeats = Some(repeats_of(values, passed, true));
    }
    g
}

/// Fails a gate that passed, for `why`.
fn fail(g: &mut Gate, why: String) {
    g.pass = false;
    g.state = State::Fail;
    if g.brief.is_empty() {
        g.brief = why.clone();
    }
    g.reason = Some(why);
}

/// `recovery`: the fault's analysis, when `--fault-cmd` was given.
pub fn recovery(r: Option<&Recovery>) -> Gate {
    const MEASURE: &str = "seconds from the fault to recovery";
    let Some(r) = r else {
        return untested(MEASURE, "no --fault-cmd");
    };
    if r.fault_at_s.is_none() {
        let mut g = unjudged(
            MEASURE,
            "the fault never ran: the load ended before it was due".into(),
        );
        g.target = Some(r.recovery_deadline_s);
        return g;
    }
    let why = if r.recovered {
        Vec::new()
    } else {
        vec![match r.recovery_time_s {
            Some(t) => format!(
                "recovered after {t:.1}s, past the {:.0}s deadline",
                r.recovery_deadline_s
            ),
            None => format!(
                "not recovered when the run ended ({:.0}s deadline)",
                r.recovery_deadline_s
            ),
        }]
    };
    judged(
        MEASURE,
        Some(r.recovery_deadline_s),
        r.recovery_time_s,
        why,
        None,
    )
}

/// An injected request was answered as a healthy target answers bad input: 2xx or 4xx.
fn answered(s: &Sample) -> bool {
    !matches!(s.outcome, Outcome::Timeout | Outcome::UpstreamReset)
        && s.status.is_some_and(|c| (200..500).contains(&c))
}

/// `abnormal_input`: `injected` are the `--inject` requests of the reported steps
/// (bursts aside), `injection` their analysis.
pub fn abnormal_input(
    injected: &[&Sample],
    injection: Option<&Injection>,
    max_drop_points: f64,
) -> Gate {
    const MEASURE: &str = "share of injected requests answered with a 2xx or 4xx";
    let Some(inj) = injection.filter(|i| !i.shares.is_empty()) else {
        return untested(MEASURE, "no --inject");
    };
    let judged_now: Vec<&&Sample> = injected
        .iter()
        .filter(|s| s.outcome != Outcome::ClientAbort)
        .filter(|s| s.inject.is_some_and(|k| k != Kind::Burst))
        .collect();
    let (beside, alone) = (
        inj.normal_beside_injected.attainment,
        inj.normal_alone.attainment,
    );
    let drop = beside.zip(alone).map(|(b, a)| (a - b) * 100.0);
    let isolation = Some(Isolation {
        attainment_beside_injected: beside,
        attainment_alone: alone,
        drop_points: drop,
        max_drop_points,
    });
    if judged_now.is_empty() {
        let mut g = unjudged(MEASURE, "no injected request finished to judge".into());
        g.target = Some(1.0);
        g.isolation = isolation;
        return g;
    }
    let ok = judged_now.iter().filter(|s| answered(s)).count();
    let actual = Some(ok as f64 / judged_now.len() as f64);
    let mut why = Vec::new();
    if ok < judged_now.len() {
        why.push(format!(
            "{} of {} injected requests got a 5xx, no answer or a timeout",
            judged_now.len() - ok,
            judged_now.len()
        ));
    }
    if let Some(d) = drop.filter(|d| *d > max_drop_points + 1e-9) {
        why.push(format!(
            "normal requests' attainment dropped {d:.1} points beside injected ones (limit {max_drop_points})"
        ));
    }
    let mut g = judged(MEASURE, Some(1.0), actual, why, None);
    g.isolation = isolation;
    g
}

/// `g` judged again on each repeat (`reps`, in order): one failing repeat fails it.
pub fn with_repeats(mut g: Gate, reps: &[Gate]) -> Gate {
    if reps.len() < 2 || !g.judged {
        return g;
    }
    let passed: Vec<bool> = reps.iter().map(|r| r.pass).collect();
    fail_repeats(&mut g, &passed, "failed");
    g.repeats = Some(repeats_of(
        reps.iter().map(|r| r.actual).collect(),
        passed,
        true,
    ));
    g
}

/// The run's limits, as the gates read them.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    pub quality_min: f64,
    pub isolation_max_drop: f64,
    pub max_throttle_share: f64,
    /// `None`: none while the SLO gate fails, any while it holds.
    pub max_preemptions: Option<f64>,
    pub host_memory_min_share: f64,
    pub allow_unjudged: Vec<GateName>,
}

/// What the gates of a run are judged from.
pub struct Figures<'a> {
    pub thresholds: &'a Thresholds,
    pub classes: &'a [ClassResult],
    /// `--repeat N`: the classes at each repeat of the judged level.
    pub classes_per_repeat: Option<&'a [Vec<ClassResult>]>,
    pub quality: Option<&'a Quality>,
    pub quality_per_repeat: Option<&'a [Quality]>,
    pub recovery: Option<&'a Recovery>,
    pub injected: &'a [&'a Sample],
    pub injection: Option<&'a Injection>,
    /// `--repeat N`: each repeat's injected requests and their analysis.
    pub injection_per_repeat: Option<Vec<(Vec<&'a Sample>, Injection)>>,
    pub resources: ResourceFigures,
}

/// Every gate of a run.
pub fn of_run(r: Figures<'_>) -> Gates {
    let t = r.thresholds;
    let slo = slo(r.classes, r.classes_per_repeat);
    let slo_failed = !slo.pass;
    let mut gates = Gates {
        quality: quality(r.quality, r.quality_per_repeat, t.quality_min),
        recovery: recovery(r.recovery),
        abnormal_input: {
            let g = abnormal_input(r.injected, r.injection, t.isolation_max_drop);
            let reps: Vec<Gate> = r
                .injection_per_repeat
                .iter()
                .flatten()
                .map(|(inj, analysis)| abnormal_input(inj, Some(analysis), t.isolation_max_drop))
                .collect();
            with_repeats(g, &reps)
        },
        resources: resources(&r.resources, t, slo_failed),
        slo,
    };
    gates.allow_unjudged(&t.allow_unjudged);
    gates
}

/// Fails `g` when any repeat did not pass, naming them (`repeat #2, #3 failed`) after
/// whatever reason it already had.
fn fail_repeats(g: &mut Gate, passed: &[bool], what: &str) {
    let bad: Vec<String> = passed
        .iter()
        .enumerate()
        .filter(|(_, p)| !**p)
        .map(|(i, _)| format!("#{}", i + 1))
        .collect();
    if !bad.is_empty() {
        g.pass = false;
        g.state = State::Fail;
        let why = format!("repeat {} {what}", bad.join(", "));
        if g.brief.is_empty() {
            g.brief = why.clone();
        }
        g.reason = Some(
            g.reason
                .take()
                .map_or(why.clone(), |r| format!("{r}; {why}")),
        );
    }
}

#[cfg(test)]
mod tests;
