//! The acceptance report: built once from what ran ([`build`]), written as `report.json`
//! (the contract, [`json`]); for people, built once as [`sections`] (prose, tables and
//! charts) and rendered as `report.md` ([`md`]) and a self-contained `report.html` with
//! inline SVG plots ([`html`], drawn by [`svg`]).

mod charts;
mod checks;
mod contract;
pub mod html;
pub mod json;
pub mod md;
mod resources;
pub mod sections;
mod steps;
pub mod svg;
pub mod table;
pub mod verdict;

use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
    time::{Instant, SystemTime},
};

pub use contract::NAMED_FIELDS;
use json::{Generator, REPORT_FORMAT, Report, StepOut};
use resources::{Judges, resource_figures, resources};
pub use steps::{MIN_REQUESTS_P95, MIN_REQUESTS_P99};

use super::{
    cli::{Mode, ReplayArgs},
    gates,
    load::{Load, StepRun},
    plan::Workload,
    tables::Tables,
    tally::{Sample, Stats, timeline},
};
use crate::{config::Config, profile::Profile};

/// Schedule lag P99 above which the generator is said not to have kept up.
pub const LAG_P99_LIMIT_MS: f64 = 10.0;

/// Everything a report is made from.
pub struct Inputs<'a> {
    pub args: &'a ReplayArgs,
    pub target: &'a str,
    pub profile: &'a Profile,
    pub profile_hash: String,
    pub workload: &'a Workload,
    pub config: &'a Config,
    pub runs: &'a [StepRun],
    pub samples: &'a [Sample],
    /// What `samples` point into.
    pub tables: &'a Tables,
    pub started_at: SystemTime,
    pub t0: Instant,
    pub interrupted: bool,
    pub saturated: bool,
    pub sent: u64,
    pub required_concurrency: Option<u32>,
    pub required_rate: Option<f64>,
    pub soak_rate: Option<f64>,
    pub prompt_lengths: String,
    pub notes: Vec<String>,
    pub recovery: Option<super::recovery::Recovery>,
    pub probes: Option<&'a super::probes::Probes>,
    /// The target engine's metrics scraped during the run (`None`: not scraped).
    pub scrapes: Option<&'a super::attribution::Scrapes>,
    /// `--gpu-metrics`: the exporters' readings.
    pub telemetry: Option<&'a super::gpu::Telemetry>,
    /// `--node-metrics`: the node exporters' readings.
    pub hosts: Option<&'a super::gpu::Telemetry<super::host::HostReading>>,
    pub reproducibility: super::describe::Reproducibility,
    /// `--mode limits`: what the probes found (the ceiling is filled in here).
    pub limits: Option<super::limits::LimitsOut>,
}

/// The measured requests of the reported steps (a soak's quick ramp is not one of them).
fn measured<'a>(i: &Inputs<'a>) -> Vec<&'a Sample> {
    let reported: HashSet<usize> = i.runs.iter().map(|r| r.spec.index).collect();
    i.samples
        .iter()
        .filter(|s| s.measured && reported.contains(&s.step))
        .collect()
}

/// The capacity curve, the knee, the max stable step and the verdicts (per repeat too).
struct Judged {
    capacity: Option<crate::stats::engine::Capacity>,
    by_class: Vec<crate::stats::engine::Capacity>,
    stable: Option<u32>,
    knee: json::Knee,
    verdicts: Vec<json::Verdict>,
    /// `--repeat N`: the verdicts at each repeat of the judged level.
    per_repeat: Option<Vec<Vec<json::Verdict>>>,
}

fn judge(i: &Inputs<'_>, steps: &[StepOut], measured: &[&Sample], overall: &Stats) -> Judged {
    let a = i.args;
    let levels: BTreeMap<usize, u32> = i
        .runs
        .iter()
        .filter_map(|r| match r.spec.load {
            Load::Concurrency(c) => Some((r.spec.index, c)),
            _ => None,
        })
        .collect();
    let level = |s: &Sample| levels.get(&s.step).copied().unwrap_or(s.concurrency);
    let (capacity, by_class) = verdict::capacity(i.config, measured, i.tables, level, i.t0);
    let stable = capacity
        .as_ref()
        .and_then(|c| verdict::as_step(c, c.max_stable_concurrency, steps, a.mode));
    let knee = verdict::knee(capacity.as_ref(), steps, a.mode);
    let judged_at = verdict::judged_step(steps, a.mode, i.required_concurrency, i.required_rate);
    let classes: Vec<String> = i
        .config
        .slo
        .all_classes()
        .filter(|c| overall.classes.iter().any(|o| *o.name == *c.name))
        .map(|c| c.name.to_string())
        .collect();
    let target_of = |name: &str| {
        let all = i.config.slo.all_classes();
        all.filter(|c| &*c.name == name)
            .map(|c| c.attainment)
            .next()
            .unwrap_or(0.0)
    };
    let at = |k: Result<Option<usize>, String>| k.map(|k| k.and_then(|k| steps.get(k)));
    let verdicts = verdict::verdicts(
        &classes,
        at(judged_at.clone()),
        overall,
        &by_class,
        target_of,
    );
    // Repeats of a level are consecutive steps: the judged one is the first of its level.
    let n = a.repeat.max(1) as usize;
    let per_repeat = (a.mode == Mode::Steps && n > 1).then(|| {
        (0..n)
            .map(|r| {
                let step = judged_at.clone().and_then(|k| {
                    let first = k.and_then(|k| steps.get(k));
                    let this = k.and_then(|k| steps.get(k + r));
                    match (first, this) {
                        (Some(f), Some(s)) if s.concurrency == f.concurrency => Ok(Some(s)),
                        _ => Err(format!("repeat #{} of the judged level did not run", r + 1)),
                    }
                });
                verdict::verdicts(&classes, step, overall, &by_class, target_of)
            })
            .collect()
    });
    Judged {
        capacity,
        by_class,
        stable,
        knee,
        verdicts,
        per_repeat,
    }
}

/// The headline: at the max stable step (steps, ramp), else over the whole run; its
/// label, goodput and cost.
fn headline<'s>(
    i: &Inputs<'_>,
    steps: &'s [StepOut],
    overall: &'s Stats,
    j: &Judged,
) -> (Option<&'s Stats>, Option<String>) {
    let point = match i.args.mode {
        Mode::Steps | Mode::Limits => steps
            .iter()
            .find(|s| s.concurrency.is_some() && s.concurrency == j.stable),
        Mode::Ramp => steps
            .iter()
            .find(|s| s.rate.is_some() && s.rate == j.knee.rate),
        Mode::Trace | Mode::Soak => None,
    };
    match (i.args.mode, point) {
        (Mode::Trace | Mode::Soak, _) if overall.requests > 0 => {
            (Some(overall), Some("run".to_owned()))
        }
        (_, Some(p)) => (Some(&p.stats), Some(p.label.clone())),
        _ => (None, None),
    }
}

/// The per-model numbers over the whole measuring time.
fn by_model(i: &Inputs<'_>, measured: &[&Sample], measuring_s: f64) -> BTreeMap<String, Stats> {
    let mut models: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in measured {
        models.entry(i.tables.name(s.model)).or_default().push(s);
    }
    models
        .into_iter()
        .map(|(m, part)| {
            let stats = Stats::of(&part, measuring_s, &i.config.slo, i.tables);
            (m.to_owned(), stats)
        })
        .collect()
}

/// A soak whose engine resources drifted fails every class, naming the drift.
fn fail_on_soak_drift(
    verdicts: &mut [json::Verdict],
    attribution: Option<&super::attribution::AttributionOut>,
    notes: &mut Vec<String>,
) {
    let Some(soak) = attribution.and_then(|at| at.soak.as_ref()) else {
        return;
    };
    if soak.holds != Some(false) {
        return;
    }
    let why = format!(
        "the engine's resources drifted: {}",
        soak.reasons.join("; ")
    );
    for v in verdicts {
        v.verdict = "fail";
        v.reason = Some(match v.reason.take() {
            Some(r) => format!("{r}; {why}"),
            None => why.clone(),
        });
    }
    notes.push(format!("soak failed: {why}"));
}

/// A class's verdict as the `slo` gate reads it.
fn class_result(v: &json::Verdict) -> gates::ClassResult {
    gates::ClassResult {
        class: v.class.clone(),
        pass: v.verdict == "pass",
        attainment: v.attainment,
        attainment_target: v.attainment_target,
        reason: v.reason.clone(),
    }
}

/// The injection report, the probes' quality and the gates of the run.
fn checks_of(
    i: &Inputs<'_>,
    steps: &[StepOut],
    measured: &[&Sample],
    j: &Judged,
    with: Judges<'_>,
) -> (
    Option<super::inject::Injection>,
    Option<super::probes::Quality>,
    gates::Gates,
) {
    let a = i.args;
    let reported: HashSet<usize> = i.runs.iter().map(|r| r.spec.index).collect();
    let injected: Vec<&Sample> = i
        .samples
        .iter()
        .filter(|s| s.inject.is_some() && reported.contains(&s.step))
        .collect();
    let injection = (!a.inject.is_empty() || a.burst.is_some()).then(|| {
        super::inject::analyse(
            &injected,
            measured,
            i.runs,
            &a.inject,
            a.context_tokens,
            a.burst,
        )
    });
    let quality = i
        .probes
        .map(|p| steps::quality(measured, p, &|k| steps::label_of(i.runs, k)));
    // Repeat k of a level is step index ≡ k (mod n) (see the steps mode's session).
    let n = a.repeat.max(1) as usize;
    let injection_per_repeat =
        (a.mode == Mode::Steps && n > 1 && !a.inject.is_empty()).then(|| {
            (0..n)
                .map(|k| {
                    let runs: Vec<StepRun> = i
                        .runs
                        .iter()
                        .filter(|r| r.spec.index % n == k)
                        .cloned()
                        .collect();
                    let mine = |s: &&Sample| s.step % n == k;
                    let inj: Vec<&Sample> = injected.iter().copied().filter(mine).collect();
                    let normal: Vec<&Sample> = measured.iter().copied().filter(mine).collect();
                    let analysis = super::inject::analyse(
                        &inj,
                        &normal,
                        &runs,
                        &a.inject,
                        a.context_tokens,
                        a.burst,
                    );
                    (inj, analysis)
                })
                .collect()
        });
    // Repeat k of a level is step index ≡ k (mod n) (see the steps mode's session).
    let quality_per_repeat: Option<Vec<super::probes::Quality>> = (a.mode == Mode::Steps && n > 1)
        .then(|| {
            (0..n)
                .map(|k| {
                    let mut q = super::probes::Quality::default();
                    for s in steps.iter().filter(|s| s.index % n == k) {
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
    let classes: Vec<gates::ClassResult> = j.verdicts.iter().map(class_result).collect();
    let classes_per_repeat: Option<Vec<Vec<gates::ClassResult>>> =
        j.per_repeat.as_ref().map(|reps| {
            reps.iter()
                .map(|v| v.iter().map(class_result).collect())
                .collect()
        });
    let thresholds = a.thresholds();
    let gates = gates::of_run(gates::Figures {
        thresholds: &thresholds,
        classes: &classes,
        classes_per_repeat: classes_per_repeat.as_deref(),
        quality: quality.as_ref(),
        quality_per_repeat: quality_per_repeat.as_deref(),
        recovery: i.recovery.as_ref(),
        injected: &injected,
        injection: injection.as_ref(),
        injection_per_repeat,
        resources: resource_figures(with),
    });
    (injection, quality, gates)
}

/// Builds the whole report.
pub fn build(i: &Inputs<'_>) -> Report {
    let a = i.args;
    let measured = measured(i);
    let mut steps = steps::of_run(i, &measured);
    let windows = steps::windows(&steps);
    if i.telemetry.is_some() || i.hosts.is_some() {
        let none = Vec::new();
        let gpus = i.telemetry.map_or(&none, |t| &t.readings);
        for (s, (lo, hi)) in steps.iter_mut().zip(&windows) {
            let mut f = super::gpu::figures(gpus, *lo, *hi);
            f.host = i.hosts.map(|h| super::host::figures(&h.readings, *lo, *hi));
            s.resources = Some(f);
        }
    }
    let measuring_s: f64 = i.runs.iter().map(StepRun::duration_s).sum();
    let overall = Stats::of(&measured, measuring_s, &i.config.slo, i.tables);
    let mut j = judge(i, &steps, &measured, &overall);
    let (point_stats, operating_point) = headline(i, &steps, &overall, &j);
    let goodput = point_stats.map(|p| p.effective_goodput_tokens_per_s);
    let lags: Vec<f64> = i.samples.iter().filter_map(Sample::lag_ms).collect();
    let lag = (!lags.is_empty()).then(|| super::tally::Pcts::of(lags));
    let run_s = i.samples.iter().map(|s| s.ended_s).fold(0.0f64, f64::max);
    let mut notes = i.notes.clone();
    notes.extend(steps::step_notes(&steps));
    if let Some(r) = i.recovery.as_ref().filter(|r| r.fault_at_s.is_none()) {
        notes.push(format!(
            "the fault command was due {:.1}s after the start but the run ended first: no recovery measured",
            r.planned_fault_at_s
        ));
    }
    let repeats = (a.mode == Mode::Steps && a.repeat > 1).then(|| super::repeats::of(&steps));
    let attribution = i
        .scrapes
        .map(|sc| attribution(sc, &steps, &measured, i.runs, a));
    fail_on_soak_drift(&mut j.verdicts, attribution.as_ref(), &mut notes);
    let oom_answers = i.samples.iter().filter(|s| s.out_of_memory).count() as u64;
    let mut resources = match (i.telemetry, i.hosts) {
        (Some(t), h) => Some(resources(t, h, &windows, i.runs, a)),
        (None, Some(h)) => Some(resources(
            &super::gpu::Telemetry::default(),
            Some(h),
            &windows,
            i.runs,
            a,
        )),
        (None, None) => None,
    };
    if let (Some(r), Some(at)) = (resources.as_mut(), attribution.as_ref())
        && at.engine.is_some()
    {
        r.engine_restarts = Some(u64::from(at.overall.engine_restarted));
    }
    if let Some(r) = resources.as_mut() {
        r.engine_oom_answers = oom_answers;
    }
    // The accelerators' power over the run (mean per GPU × GPUs), for the energy cost.
    let measured_kw = resources.as_ref().and_then(|r| {
        r.overall
            .gpu_power_mean_w
            .map(|w| w * r.overall.gpus as f64 / 1000.0)
    });
    let cost = verdict::cost(i.config.cost.as_ref(), point_stats, j.stable, measured_kw);
    let (injection, quality, gates) = checks_of(
        i,
        &steps,
        &measured,
        &j,
        Judges {
            gpu_metrics: !a.gpu_metrics.is_empty(),
            oom_answers,
            attribution: attribution.as_ref(),
            resources: resources.as_ref(),
            target_changed: i.reproducibility.target_changed(),
        },
    );
    let failed = gates.failures();
    if !failed.is_empty() {
        notes.push(format!("failed gates: {}", failed.join("; ")));
    }
    Report {
        report_format: REPORT_FORMAT,
        goodput_version: env!("CARGO_PKG_VERSION").into(),
        generated_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        contract: contract::contract(i, &steps, run_s),
        interrupted: i.interrupted,
        passed: !j.verdicts.is_empty() && gates.pass(),
        verdict: j
            .verdicts
            .iter()
            .map(|v| (v.class.clone(), v.verdict))
            .collect(),
        verdicts: j.verdicts,
        gates,
        limits: i.limits.clone().map(|mut l| {
            l.ceiling_concurrency = j.stable;
            l
        }),
        max_stable_concurrency: j.stable,
        knee: j.knee,
        effective_goodput_tokens_per_s: goodput,
        operating_point,
        cost,
        generator: Generator {
            requests_sent: i.sent,
            kept_up: !i.saturated
                && lag.is_none_or(|l| l.p99.is_none_or(|p| p <= LAG_P99_LIMIT_MS)),
            schedule_lag_ms: lag,
            lag_p99_limit_ms: LAG_P99_LIMIT_MS,
            saturated: i.saturated,
        },
        drift: (a.mode == Mode::Soak)
            .then(|| steps::drift(&steps, a.step_duration.as_secs_f64()))
            .flatten(),
        steps,
        overall,
        by_model: by_model(i, &measured, measuring_s),
        capacity: j.capacity,
        capacity_by_class: j.by_class,
        timeline: timeline(i.samples, run_s, &i.config.slo, i.tables),
        recovery: i.recovery.clone(),
        repeats,
        attribution,
        resources,
        injection,
        quality,
        reproducibility: i.reproducibility.clone(),
        notes,
    }
}

/// report.json `attribution`: each step's measuring window, their union, and a soak's
/// first quarter against its last.
fn attribution(
    sc: &super::attribution::Scrapes,
    steps: &[StepOut],
    measured: &[&Sample],
    runs: &[StepRun],
    a: &ReplayArgs,
) -> super::attribution::AttributionOut {
    use super::attribution::{Acc, AttributionOut, SoakLimits, StepResources, soak};
    // The engine's e2e histogram counts the requests it finished: compare with the
    // replay's own answered requests, not its fast failures.
    let ok_e2e = |windows: &[(f64, f64)]| {
        let e2e: Vec<f64> = measured
            .iter()
            .filter(|s| s.outcome == crate::measure::Outcome::Ok)
            .filter(|s| {
                windows
                    .iter()
                    .any(|(lo, hi)| s.ended_s >= *lo && s.ended_s <= *hi)
            })
            .map(|s| s.e2e_ms)
            .collect();
        (!e2e.is_empty()).then(|| e2e.iter().sum::<f64>() / e2e.len() as f64)
    };
    let windows = steps::windows(steps);
    let mut all = Acc::default();
    let steps = steps
        .iter()
        .zip(&windows)
        .map(|(s, &(lo, hi))| {
            let acc = Acc::window(&sc.points, lo, hi);
            all.merge(&acc);
            StepResources {
                label: s.label.clone(),
                resources: acc.resources(ok_e2e(&[(lo, hi)])),
            }
        })
        .collect();
    // A restart between two steps' windows is in neither: look over the whole run.
    if let (Some(first), Some(last)) = (windows.first(), windows.last()) {
        all.note_restart(Acc::window(&sc.points, first.0, last.1).restarted());
    }
    let soak = match (a.mode, runs.first()) {
        (Mode::Soak, Some(run)) => Some(soak(
            &sc.points,
            run.window_start_s,
            run.window_end_s,
            SoakLimits {
                max_kv_growth: a.soak_max_kv_growth,
                max_waiting_growth: a.soak_max_waiting_growth,
                max_jitter_growth: a.soak_max_jitter_growth,
            },
        )),
        _ => None,
    };
    AttributionOut {
        url: sc.url.clone(),
        engine: sc.engine,
        interval_s: sc.interval_s,
        scrapes: sc.points.len(),
        failed_scrapes: sc.failed,
        last_error: sc.last_error.clone(),
        overall: all.resources(ok_e2e(&windows)),
        steps,
        soak,
    }
}

/// Writes report.json, report.md and report.html into `dir` (created if missing).
pub fn write(report: &Report, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    json::write(report, dir)?;
    std::fs::write(dir.join("report.md"), md::render(report))?;
    std::fs::write(dir.join("report.html"), html::render(report))
}
