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
//! A gate with nothing to judge in this run (`judged: false`) passes. With `--repeat N`,
//! `slo`, `quality` and `abnormal_input` are judged on every repeat: each repeat's
//! actual, the worst and the 95% confidence interval are in `repeats`, and one failing
//! repeat fails the gate (`recovery` and `resources` are judged over the whole run: one
//! fault, and XID errors whenever they come).

use serde::Serialize;

use super::{
    attribution::AttributionOut,
    cli::{Mode, ReplayArgs},
    gpu::{GpuFigures, GpuSoak, ResourcesOut},
    inject::{Injection, Kind},
    probes::Quality,
    recovery::Recovery,
    repeats::Ci,
    report::json::{StepOut, Verdict},
    tally::Sample,
};
use crate::measure::Outcome;

/// One gate.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub pass: bool,
    /// This run gave the gate something to judge (`false`: it passes untested).
    pub judged: bool,
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
        measure,
        target: None,
        actual: None,
        reason: Some(format!("not judged: {why}")),
        repeats: None,
        isolation: None,
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

/// The class closest to failing: (attainment target, attainment).
fn tightest(verdicts: &[Verdict]) -> Option<(f64, Option<f64>)> {
    verdicts
        .iter()
        .map(|v| (v.attainment_target, v.attainment))
        .min_by(|a, b| {
            let margin = |x: &(f64, Option<f64>)| x.1.map_or(f64::NEG_INFINITY, |a| a - x.0);
            margin(a).total_cmp(&margin(b))
        })
}

/// `slo`: `verdicts` at the judged load; `per_repeat`, with `--repeat N`, the verdicts
/// of each repeat's step at that load.
pub fn slo(verdicts: &[Verdict], per_repeat: Option<&[Vec<Verdict>]>) -> Gate {
    const MEASURE: &str = "attainment of the class closest to failing, at the judged load";
    if verdicts.is_empty() {
        let mut g = untested(MEASURE, "no measured request");
        g.pass = false;
        return g;
    }
    let failed: Vec<String> = verdicts
        .iter()
        .filter(|v| v.verdict != "pass")
        .map(|v| format!("{}: {}", v.class, v.reason.as_deref().unwrap_or("failed")))
        .collect();
    let (target, actual) = tightest(verdicts).unwrap_or((0.0, None));
    let mut g = Gate {
        pass: failed.is_empty(),
        judged: true,
        measure: MEASURE,
        target: Some(target),
        actual,
        reason: (!failed.is_empty()).then(|| failed.join("; ")),
        repeats: None,
        isolation: None,
    };
    if let Some(reps) = per_repeat.filter(|r| r.len() > 1) {
        let passed: Vec<bool> = reps
            .iter()
            .map(|v| !v.is_empty() && v.iter().all(|v| v.verdict == "pass"))
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
    let holds = |q: &Quality| q.pass_rate.is_some_and(|r| r + 1e-9 >= min);
    let mut g = Gate {
        pass: holds(q),
        judged: true,
        measure: MEASURE,
        target: Some(min),
        actual: q.pass_rate,
        reason: match q.pass_rate {
            None => Some("no probe got an answer to judge".into()),
            Some(r) if !holds(q) => Some(format!(
                "{} of {} probes passed ({:.1}%), below --quality-min {:.1}%",
                q.passed,
                q.probes,
                r * 100.0,
                min * 100.0
            )),
            Some(_) => None,
        },
        repeats: None,
        isolation: None,
    };
    if let Some(reps) = per_repeat.filter(|r| r.len() > 1) {
        let passed: Vec<bool> = reps.iter().map(holds).collect();
        if passed.iter().any(|p| !p) && g.pass {
            g.pass = false;
            g.reason = Some("a repeat's probe pass rate is below --quality-min".into());
        }
        let values = reps.iter().map(|q| q.pass_rate).collect();
        g.repeats = Some(repeats_of(values, passed, true));
    }
    g
}

/// `recovery`: the fault's analysis, when `--fault-cmd` was given.
pub fn recovery(r: Option<&Recovery>) -> Gate {
    const MEASURE: &str = "seconds from the fault to recovery";
    let Some(r) = r else {
        return untested(MEASURE, "no --fault-cmd");
    };
    let reason = if r.fault_at_s.is_none() {
        Some("the fault never ran: the load ended before it was due".to_owned())
    } else if !r.recovered {
        Some(match r.recovery_time_s {
            Some(t) => format!(
                "recovered after {t:.1}s, past the {:.0}s deadline",
                r.recovery_deadline_s
            ),
            None => format!(
                "not recovered when the run ended ({:.0}s deadline)",
                r.recovery_deadline_s
            ),
        })
    } else {
        None
    };
    Gate {
        pass: reason.is_none(),
        judged: true,
        measure: MEASURE,
        target: Some(r.recovery_deadline_s),
        actual: r.recovery_time_s,
        reason,
        repeats: None,
        isolation: None,
    }
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
    let judged: Vec<&&Sample> = injected
        .iter()
        .filter(|s| s.outcome != Outcome::ClientAbort)
        .filter(|s| s.inject.is_some_and(|k| k != Kind::Burst))
        .collect();
    let ok = judged.iter().filter(|s| answered(s)).count();
    let actual = (!judged.is_empty()).then(|| ok as f64 / judged.len() as f64);
    let (beside, alone) = (
        inj.normal_beside_injected.attainment,
        inj.normal_alone.attainment,
    );
    let drop = beside.zip(alone).map(|(b, a)| (a - b) * 100.0);
    let mut why = Vec::new();
    if judged.is_empty() {
        why.push("no injected request finished to judge".to_owned());
    } else if ok < judged.len() {
        why.push(format!(
            "{} of {} injected requests got a 5xx, no answer or a timeout",
            judged.len() - ok,
            judged.len()
        ));
    }
    if let Some(d) = drop.filter(|d| *d > max_drop_points + 1e-9) {
        why.push(format!(
            "normal requests' attainment dropped {d:.1} points beside injected ones (limit {max_drop_points})"
        ));
    }
    Gate {
        pass: why.is_empty(),
        judged: true,
        measure: MEASURE,
        target: Some(1.0),
        actual,
        reason: (!why.is_empty()).then(|| why.join("; ")),
        repeats: None,
        isolation: Some(Isolation {
            attainment_beside_injected: beside,
            attainment_alone: alone,
            drop_points: drop,
            max_drop_points,
        }),
    }
}

/// `resources`: the GPUs' XID errors over the run, a soak's GPU memory and the engine's
/// soak drift (`engine_soak`: its `holds` and reasons).
pub fn resources(
    gpu: Option<&GpuFigures>,
    gpu_soak: Option<&GpuSoak>,
    engine_soak: Option<(Option<bool>, &[String])>,
) -> Gate {
    const MEASURE: &str = "XID errors on the GPUs";
    if gpu.is_none() && engine_soak.is_none() {
        return untested(MEASURE, "no --gpu-metrics and no soak drift to check");
    }
    let mut why = Vec::new();
    let xid = gpu.and_then(|g| g.gpu_xid_errors);
    if let Some(n) = xid.filter(|n| *n > 0) {
        why.push(format!("{n} XID errors on the GPUs"));
    }
    if let Some(s) = gpu_soak.filter(|s| s.holds == Some(false)) {
        why.extend(s.reasons.iter().cloned());
    }
    if let Some((Some(false), reasons)) = engine_soak {
        why.push(format!(
            "the engine's resources drifted: {}",
            reasons.join("; ")
        ));
    }
    Gate {
        pass: why.is_empty(),
        judged: true,
        measure: MEASURE,
        target: gpu.map(|_| 0.0),
        actual: xid.map(|n| n as f64),
        reason: (!why.is_empty()).then(|| why.join("; ")),
        repeats: None,
        isolation: None,
    }
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

/// What the gates of a run are judged from.
pub struct RunGates<'a> {
    pub args: &'a ReplayArgs,
    pub steps: &'a [StepOut],
    pub verdicts: &'a [Verdict],
    pub per_repeat: Option<&'a [Vec<Verdict>]>,
    pub quality: Option<&'a Quality>,
    pub recovery: Option<&'a Recovery>,
    pub injected: &'a [&'a Sample],
    pub injection: Option<&'a Injection>,
    /// `--repeat N`: each repeat's injected requests and their analysis.
    pub injection_per_repeat: Option<Vec<(Vec<&'a Sample>, Injection)>>,
    pub resources: Option<&'a ResourcesOut>,
    pub attribution: Option<&'a AttributionOut>,
}

/// Every gate of a run.
pub fn of_run(r: RunGates<'_>) -> Gates {
    let a = r.args;
    let n = a.repeat.max(1) as usize;
    // Repeat k of a level is step index ≡ k (mod n) (see the steps mode's session).
    let quality_per_repeat: Option<Vec<Quality>> = (a.mode == Mode::Steps && n > 1).then(|| {
        (0..n)
            .map(|k| {
                let mut q = Quality::default();
                for s in r.steps.iter().filter(|s| s.index % n == k) {
                    if let Some(sq) = &s.quality {
                        q.probes += sq.probes;
                        q.passed += sq.passed;
                    }
                }
                q.pass_rate = (q.probes > 0).then(|| q.passed as f64 / q.probes as f64);
                q
            })
            .collect()
    });
    let engine_soak = r
        .attribution
        .and_then(|at| at.soak.as_ref())
        .map(|s| (s.holds, s.reasons.as_slice()));
    Gates {
        slo: slo(r.verdicts, r.per_repeat),
        quality: quality(
            r.quality,
            quality_per_repeat.as_deref(),
            a.quality_min().unwrap_or(1.0),
        ),
        recovery: recovery(r.recovery),
        abnormal_input: {
            let g = abnormal_input(r.injected, r.injection, a.isolation_max_drop);
            let reps: Vec<Gate> = r
                .injection_per_repeat
                .iter()
                .flatten()
                .map(|(inj, analysis)| abnormal_input(inj, Some(analysis), a.isolation_max_drop))
                .collect();
            with_repeats(g, &reps)
        },
        resources: resources(
            r.resources.map(|res| &res.overall),
            r.resources.and_then(|res| res.soak.as_ref()),
            engine_soak,
        ),
    }
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
        let why = format!("repeat {} {what}", bad.join(", "));
        g.reason = Some(
            g.reason
                .take()
                .map_or(why.clone(), |r| format!("{r}; {why}")),
        );
    }
}

#[cfg(test)]
mod tests;
