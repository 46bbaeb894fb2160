//! The acceptance report: built once from what ran ([`build`]), written as `report.json`
//! (the contract, [`json`]), `report.md` ([`md`]) and a self-contained `report.html` with
//! inline SVG plots ([`html`], drawn by [`svg`]).

pub mod html;
pub mod json;
pub mod md;
pub mod svg;
pub mod table;
pub mod verdict;

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Instant, SystemTime},
};

use json::{
    ClassTargets, Contract, CostConfigOut, Drift, Generator, LoadOut, PercentileOut, ProfileId,
    REPORT_FORMAT, Report, StepOut,
};

use super::{
    cli::{Mode, ReplayArgs},
    load::{Load, StepRun},
    measure::{Sample, Stats, spread, timeline},
    plan::Workload,
    tables::{Tables, slice_of},
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
}

/// The probes among `samples` that have a verdict, as `quality`.
fn quality(
    samples: &[&Sample],
    probes: &super::probes::Probes,
    label: &dyn Fn(usize) -> String,
) -> super::probes::Quality {
    let mut q = super::probes::Quality::default();
    for s in samples {
        let Some(p) = &s.probe else { continue };
        q.probes += 1;
        if p.passed {
            q.passed += 1;
        } else {
            q.failures.push(super::probes::Failure {
                name: probes.name(p.probe).to_owned(),
                step: label(s.step),
                request_id: p.request_id.clone(),
                reason: p.reason.clone().unwrap_or_default(),
                answer: p.excerpt.clone().unwrap_or_default(),
            });
        }
    }
    q.pass_rate = (q.probes > 0).then(|| q.passed as f64 / q.probes as f64);
    q
}

/// Finish reasons of the requests that report one, and the share cut by a length limit.
fn finish_reasons(samples: &[&Sample]) -> (BTreeMap<&'static str, u64>, Option<f64>) {
    let mut m = BTreeMap::new();
    for r in samples.iter().filter_map(|s| s.finish_reason) {
        *m.entry(r.as_str()).or_insert(0u64) += 1;
    }
    let total: u64 = m.values().sum();
    let length = m.get("length").copied().unwrap_or(0);
    let share = (total > 0).then(|| length as f64 / total as f64);
    (m, share)
}

fn step_out(run: &StepRun, samples: &[&Sample], config: &Config, t: &Tables) -> StepOut {
    let (concurrency, rate) = match run.spec.load {
        Load::Concurrency(c) => (Some(c), None),
        Load::Rate(r) => (None, Some(r)),
        Load::Trace(_) => (None, None),
    };
    let d = run.duration_s();
    let mut stats = Stats::of(samples, d, &config.slo, t);
    if rate.is_none() && concurrency.is_none() {
        // trace: the achieved rate, for the throughput–latency curve.
        stats.requests_per_s = if d > 0.0 {
            samples.len() as f64 / d
        } else {
            0.0
        };
    }
    let (finish_reasons, length_share) = finish_reasons(samples);
    let mut miss_reasons = BTreeMap::new();
    for r in samples.iter().filter_map(|s| s.miss_reason) {
        *miss_reasons.entry(r.as_str()).or_insert(0u64) += 1;
    }
    StepOut {
        finish_reasons,
        miss_reasons,
        length_share,
        quality: None,
        index: run.spec.index,
        label: run.spec.label.clone(),
        concurrency,
        rate: rate.or((concurrency.is_none()).then_some(stats.requests_per_s)),
        started_s: run.started_s,
        warmup_s: run.spec.warmup.as_secs_f64(),
        duration_s: d,
        cut_short: run.cut_short,
        spread: spread(samples, d, &config.slo, t),
        stats,
    }
}

/// soak: the one long step cut into `interval`-second steps, for drift (at the points the
/// runner kept the step's gaps by, [`slice_of`]).
fn soak_steps(
    run: &StepRun,
    measured: &[&Sample],
    config: &Config,
    t: &Tables,
    interval: f64,
) -> Vec<StepOut> {
    let (lo, hi) = (run.window_start_s, run.window_end_s);
    // A sliver of a last interval (timer slack) joins the one before.
    let n = (((hi - lo) / interval - 0.05).ceil().max(1.0)) as usize;
    (0..n)
        .map(|i| {
            let a = lo + i as f64 * interval;
            let b = if i + 1 == n { hi } else { a + interval };
            let part: Vec<&Sample> = measured
                .iter()
                .copied()
                .filter(|s| (slice_of(s.ended_s, lo, interval) as usize).min(n - 1) == i)
                .collect();
            let mut sub = run.clone();
            sub.spec.index = i;
            sub.spec.label = format!("t+{:.0}s", a - lo);
            (sub.window_start_s, sub.window_end_s, sub.started_s) = (a, b, a);
            sub.spec.warmup = std::time::Duration::ZERO;
            step_out(&sub, &part, config, t)
        })
        .collect()
}

fn change(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (a.abs() > f64::EPSILON).then(|| (b - a) / a)
}

fn drift(steps: &[StepOut], interval: f64) -> Option<Drift> {
    let mut busy = steps.iter().filter(|s| s.stats.requests > 0);
    let first = busy.next()?;
    let last = busy.next_back().unwrap_or(first);
    let (f, l) = (&first.stats, &last.stats);
    Some(Drift {
        interval_s: interval,
        intervals: steps.len(),
        raw_throughput_change: change(
            Some(f.raw_output_tokens_per_s),
            Some(l.raw_output_tokens_per_s),
        ),
        effective_goodput_change: change(
            Some(f.effective_goodput_tokens_per_s),
            Some(l.effective_goodput_tokens_per_s),
        ),
        ttft_p95_change: change(f.ttft_ms.p95, l.ttft_ms.p95),
        e2e_p95_change: change(f.e2e_ms.p95, l.e2e_ms.p95),
        error_rate_first: f.error_rate,
        error_rate_last: l.error_rate,
    })
}

/// Builds the whole report.
pub fn build(i: &Inputs<'_>) -> Report {
    let a = i.args;
    // Measured requests of the reported steps (a soak's quick ramp is not one of them).
    let reported: std::collections::HashSet<usize> = i.runs.iter().map(|r| r.spec.index).collect();
    let measured: Vec<&Sample> = i
        .samples
        .iter()
        .filter(|s| s.measured && reported.contains(&s.step))
        .collect();
    let of_step =
        |k: usize| -> Vec<&Sample> { measured.iter().copied().filter(|s| s.step == k).collect() };
    let steps: Vec<StepOut> = match (a.mode, i.runs.first()) {
        (Mode::Soak, Some(run)) => soak_steps(
            run,
            &of_step(run.spec.index),
            i.config,
            i.tables,
            a.step_duration.as_secs_f64(),
        ),
        _ => i
            .runs
            .iter()
            .map(|r| step_out(r, &of_step(r.spec.index), i.config, i.tables))
            .collect(),
    };
    let mut steps = steps;
    if let Some(p) = i.probes {
        let label = |k: usize| -> String {
            i.runs
                .iter()
                .find(|r| r.spec.index == k)
                .map_or_else(|| k.to_string(), |r| r.spec.label.clone())
        };
        if a.mode == Mode::Soak {
            for s in &mut steps {
                let part: Vec<&Sample> = measured
                    .iter()
                    .copied()
                    .filter(|m| m.ended_s >= s.started_s && m.ended_s < s.started_s + s.duration_s)
                    .collect();
                s.quality = Some(quality(&part, p, &|_| s.label.clone()));
            }
        } else {
            for s in &mut steps {
                s.quality = Some(quality(&of_step(s.index), p, &label));
            }
        }
    }
    let measuring_s: f64 = i.runs.iter().map(StepRun::duration_s).sum();
    let overall = Stats::of(&measured, measuring_s, &i.config.slo, i.tables);
    let mut models: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in &measured {
        models.entry(i.tables.name(s.model)).or_default().push(s);
    }
    let by_model = models
        .into_iter()
        .map(|(m, part)| {
            let stats = Stats::of(&part, measuring_s, &i.config.slo, i.tables);
            (m.to_owned(), stats)
        })
        .collect();
    let levels: BTreeMap<usize, u32> = i
        .runs
        .iter()
        .filter_map(|r| match r.spec.load {
            Load::Concurrency(c) => Some((r.spec.index, c)),
            _ => None,
        })
        .collect();
    let level = |s: &Sample| levels.get(&s.step).copied().unwrap_or(s.concurrency);
    let (capacity, by_class) = verdict::capacity(i.config, &measured, i.tables, level, i.t0);
    let stable = capacity
        .as_ref()
        .and_then(|c| verdict::as_step(c, c.max_stable_concurrency, &steps, a.mode));
    let knee = verdict::knee(capacity.as_ref(), &steps, a.mode);
    let judged = verdict::judged_step(&steps, a.mode, i.required_concurrency, i.required_rate)
        .map(|k| k.and_then(|k| steps.get(k)));
    let mut classes: Vec<String> = Vec::new();
    for c in i.config.slo.all_classes() {
        if overall.classes.iter().any(|o| o.name == c.name) {
            classes.push(c.name.clone());
        }
    }
    let target_of = |name: &str| {
        let all = i.config.slo.all_classes();
        all.filter(|c| c.name == name)
            .map(|c| c.attainment)
            .next()
            .unwrap_or(0.0)
    };
    let verdicts = verdict::verdicts(&classes, judged, &overall, &by_class, target_of);
    // The headline: at the max stable step (steps, ramp), else over the whole run.
    let point = match a.mode {
        Mode::Steps => steps
            .iter()
            .find(|s| s.concurrency.is_some() && s.concurrency == stable),
        Mode::Ramp => steps
            .iter()
            .find(|s| s.rate.is_some() && s.rate == knee.rate),
        Mode::Trace | Mode::Soak => None,
    };
    let (point_stats, operating_point) = match (a.mode, point) {
        (Mode::Trace | Mode::Soak, _) if overall.requests > 0 => {
            (Some(&overall), Some("run".to_owned()))
        }
        (_, Some(p)) => (Some(&p.stats), Some(p.label.clone())),
        _ => (None, None),
    };
    let goodput = point_stats.map(|p| p.effective_goodput_tokens_per_s);
    let cost = verdict::cost(i.config.cost.as_ref(), point_stats, stable);
    let lags: Vec<f64> = i.samples.iter().filter_map(Sample::lag_ms).collect();
    let lag = (!lags.is_empty()).then(|| super::measure::Pcts::of(lags));
    let run_s = i.samples.iter().map(|s| s.ended_s).fold(0.0f64, f64::max);
    let interval = a.step_duration.as_secs_f64();
    let mut notes = i.notes.clone();
    notes.extend(step_notes(&steps));
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
    let mut verdicts = verdicts;
    if let Some(soak) = attribution.as_ref().and_then(|at| at.soak.as_ref())
        && soak.holds == Some(false)
    {
        let why = format!(
            "the engine's resources drifted: {}",
            soak.reasons.join("; ")
        );
        for v in &mut verdicts {
            v.verdict = "fail";
            v.reason = Some(match v.reason.take() {
                Some(r) => format!("{r}; {why}"),
                None => why.clone(),
            });
        }
        notes.push(format!("soak failed: {why}"));
    }
    let passed = !verdicts.is_empty() && verdicts.iter().all(|v| v.verdict == "pass");
    Report {
        report_format: REPORT_FORMAT,
        goodput_version: env!("CARGO_PKG_VERSION").into(),
        generated_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        contract: contract(i, &steps, run_s),
        interrupted: i.interrupted,
        passed,
        verdict: verdicts
            .iter()
            .map(|v| (v.class.clone(), v.verdict))
            .collect(),
        verdicts,
        max_stable_concurrency: stable,
        knee,
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
            .then(|| drift(&steps, interval))
            .flatten(),
        steps,
        overall,
        by_model,
        capacity,
        capacity_by_class: by_class,
        timeline: timeline(i.samples, run_s, &i.config.slo, i.tables),
        recovery: i.recovery.clone(),
        repeats,
        attribution,
        injection: (!a.inject.is_empty() || a.burst.is_some()).then(|| {
            let extra: Vec<&Sample> = i
                .samples
                .iter()
                .filter(|s| s.inject.is_some() && reported.contains(&s.step))
                .collect();
            super::inject::analyse(
                &extra,
                &measured,
                i.runs,
                &a.inject,
                a.context_tokens,
                a.burst,
            )
        }),
        quality: i.probes.map(|p| {
            quality(&measured, p, &|k| {
                i.runs
                    .iter()
                    .find(|r| r.spec.index == k)
                    .map_or_else(|| k.to_string(), |r| r.spec.label.clone())
            })
        }),
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
    let windows: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| {
            let lo = s.started_s + s.warmup_s;
            (lo, lo + s.duration_s)
        })
        .collect();
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

/// Requests a nearest-rank P99 needs to be more than the maximum (and P95 the top 5%).
pub const MIN_REQUESTS_P99: u64 = 100;
pub const MIN_REQUESTS_P95: u64 = 20;

fn step_notes(steps: &[StepOut]) -> Vec<String> {
    let few = steps.iter().filter_map(|s| {
        let n = s.stats.requests;
        let which = if n < MIN_REQUESTS_P95 {
            "P95 and P99 are its slowest requests"
        } else if n < MIN_REQUESTS_P99 {
            "P99 is its slowest request"
        } else {
            return None;
        };
        Some(format!(
            "step {}: {n} requests, too few for its percentiles ({which}; P95 needs {MIN_REQUESTS_P95}, P99 {MIN_REQUESTS_P99})",
            s.label
        ))
    });
    let mut notes: Vec<String> = few.collect();
    notes.extend(steps
        .iter()
        .filter(|s| s.concurrency.is_some())
        .filter(|s| s.stats.e2e_ms.p50.is_some_and(|e| e / 1000.0 > s.duration_s / 4.0))
        .map(|s| {
            format!(
                "step {}: median e2e is over a quarter of the measuring window; use a longer --step-duration",
                s.label
            )
        }));
    notes
}

/// `--contract` keys with a field of their own besides the recorded six.
pub const NAMED_FIELDS: [&str; 14] = [
    "parameters",
    "architecture",
    "task",
    "batching",
    "prefix_cache",
    "kv_cache",
    "speculative_decoding",
    "cards",
    "nodes",
    "interconnect",
    "driver_version",
    "framework_version",
    "container_image",
    "run_id",
];

fn contract(i: &Inputs<'_>, steps: &[StepOut], run_s: f64) -> Contract {
    let a = i.args;
    let recorded = i
        .profile
        .files
        .first()
        .map(|f| f.header.contract.clone())
        .unwrap_or_default();
    let mut sources = BTreeMap::new();
    let mut extra: BTreeMap<String, String> = a.contract.iter().cloned().collect();
    let mut pick = |key: &str, recorded: &Option<String>| {
        if let Some(v) = extra.remove(key) {
            sources.insert(key.to_owned(), "flag");
            Some(v)
        } else {
            recorded.clone().inspect(|_| {
                sources.insert(key.to_owned(), "profile");
            })
        }
    };
    let model_revision = pick("model_revision", &recorded.model_revision);
    let engine = pick("engine", &recorded.engine);
    let engine_version = pick("engine_version", &recorded.engine_version);
    let hardware = pick("hardware", &recorded.hardware);
    let precision = pick("precision", &recorded.precision);
    let notes = pick("notes", &recorded.notes);
    let mut named: BTreeMap<&'static str, String> = BTreeMap::new();
    for key in NAMED_FIELDS {
        if let Some(v) = pick(key, &None) {
            named.insert(key, v);
        }
    }
    let mut take = |k: &'static str| named.remove(k);
    let run_id = take("run_id").unwrap_or_else(|| {
        let at = humantime::format_rfc3339_seconds(i.started_at).to_string();
        let compact: String = at.chars().filter(char::is_ascii_alphanumeric).collect();
        format!("{compact}-{:08x}", rand::random::<u32>())
    });
    let mut models: BTreeMap<String, u64> = BTreeMap::new();
    for s in i.samples {
        *models.entry(i.tables.name(s.model).to_owned()).or_insert(0) += 1;
    }
    let model = models
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(m, _)| m.clone());
    let slo = i
        .config
        .slo
        .all_classes()
        .map(|c| ClassTargets {
            name: c.name.clone(),
            ttft_ms: c.targets.ttft_ms,
            tpot_ms: c.targets.tpot_ms,
            e2e_ms: c.targets.e2e_ms,
            attainment: c.attainment,
            percentiles: c
                .percentiles
                .iter()
                .map(|p| PercentileOut {
                    metric: p.metric.as_str(),
                    quantile: p.quantile,
                    max_ms: p.max_ms,
                })
                .collect(),
        })
        .collect();
    Contract {
        target: i.target.to_owned(),
        model: a.model.clone().or(model),
        models,
        model_revision,
        engine,
        engine_version,
        hardware,
        precision,
        notes,
        parameters: take("parameters"),
        architecture: take("architecture"),
        task: take("task"),
        batching: take("batching"),
        prefix_cache: take("prefix_cache"),
        kv_cache: take("kv_cache"),
        speculative_decoding: take("speculative_decoding"),
        cards: take("cards"),
        nodes: take("nodes"),
        interconnect: take("interconnect"),
        driver_version: take("driver_version"),
        framework_version: take("framework_version"),
        container_image: take("container_image"),
        run_id,
        extra,
        sources,
        profile: ProfileId {
            files: i
                .profile
                .files
                .iter()
                .map(|f| f.path.display().to_string())
                .collect(),
            salt_id: i.profile.common_salt_id().map(str::to_owned),
            hash: i.profile_hash.clone(),
            requests: i.profile.entries.len(),
            recorded_contract: recorded,
            summary: crate::profile::Summary::of(i.profile),
        },
        load: LoadOut {
            mode: a.mode.as_str(),
            concurrency: (a.mode == Mode::Steps).then(|| a.concurrency.clone()),
            rates: (a.mode == Mode::Ramp).then(|| steps.iter().filter_map(|s| s.rate).collect()),
            rate_scale: a.rate_scale,
            step_duration_s: a.step_duration.as_secs_f64(),
            warmup_s: a.warmup.as_secs_f64(),
            soak_duration_s: (a.mode == Mode::Soak).then_some(a.soak_duration.as_secs_f64()),
            soak_rate: i.soak_rate,
            required_concurrency: i.required_concurrency,
            required_rate: i.required_rate,
            max_requests: a.max_requests,
            max_in_flight: a.max_in_flight,
            seed: a.seed,
            ignore_eos: a.ignore_eos,
            idle_timeout_s: a.idle_timeout.as_secs_f64(),
            prompt_lengths: i.prompt_lengths.clone(),
            block_bytes: i.workload.block_bytes,
        },
        started_at: humantime::format_rfc3339_millis(i.started_at).to_string(),
        duration_s: run_s,
        goodput_version: env!("CARGO_PKG_VERSION").into(),
        slo,
        cost: i.config.cost.as_ref().map(|c| CostConfigOut {
            currency: c.currency.clone(),
            per_hour: c.per_hour,
            components: c.components.iter().cloned().collect(),
        }),
    }
}

/// Writes report.json, report.md and report.html into `dir` (created if missing).
pub fn write(report: &Report, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    json::write(report, dir)?;
    std::fs::write(dir.join("report.md"), md::render(report))?;
    std::fs::write(dir.join("report.html"), html::render(report))
}
