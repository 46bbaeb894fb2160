//! The steps of a report: each step's numbers, a soak cut into intervals, a soak's drift,
//! the quality probes per step, and the notes steps earn.

use std::collections::BTreeMap;

use super::json::{Drift, StepOut};
use crate::{
    config::Config,
    replay::{
        cli::Mode,
        load::{Load, StepRun},
        probes::{Failure, Probes, Quality},
        tables::{Tables, slice_of},
        tally::{Sample, Stats, spread},
    },
};

/// The probes among `samples` that have a verdict, as `quality`.
pub(super) fn quality(
    samples: &[&Sample],
    probes: &Probes,
    label: &dyn Fn(usize) -> String,
) -> Quality {
    let mut q = Quality::default();
    for s in samples {
        let Some(p) = &s.probe else { continue };
        q.count(probes.name(p.probe), p.passed);
        if !p.passed {
            q.failures.push(Failure {
                name: probes.name(p.probe).to_owned(),
                step: label(s.step),
                request_id: p.request_id.clone(),
                reason: p.reason.clone().unwrap_or_default(),
                answer: p.excerpt.clone().unwrap_or_default(),
            });
        }
    }
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

pub(super) fn step_out(run: &StepRun, samples: &[&Sample], config: &Config, t: &Tables) -> StepOut {
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
        resources: None,
    }
}

/// soak: the one long step cut into `interval`-second steps, for drift (at the points the
/// runner kept the step's gaps by, [`slice_of`]).
pub(super) fn soak_steps(
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

pub(super) fn drift(steps: &[StepOut], interval: f64) -> Option<Drift> {
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
        p99_ttft_jitter: jitter(steps.iter().filter_map(|s| s.stats.ttft_ms.p99)),
        p99_itl_jitter: jitter(steps.iter().filter_map(|s| s.stats.itl_ms.p99)),
    })
}

/// Coefficient of variation (population σ / mean) of per-interval values, as the live
/// summary's `p99_ttft_jitter`; `None` with fewer than two.
fn jitter(values: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    (mean > 0.0).then(|| var.sqrt() / mean)
}

/// Requests a nearest-rank P99 needs to be more than the maximum (and P95 the top 5%).
pub const MIN_REQUESTS_P99: u64 = 100;
pub const MIN_REQUESTS_P95: u64 = 20;

pub(super) fn step_notes(steps: &[StepOut]) -> Vec<String> {
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

/// The name of step `k` as the report labels it.
pub(super) fn label_of(runs: &[StepRun], k: usize) -> String {
    runs.iter()
        .find(|r| r.spec.index == k)
        .map_or_else(|| k.to_string(), |r| r.spec.label.clone())
}

/// The steps of the run (a soak cut into its intervals), with their quality probes.
pub(super) fn of_run(i: &super::Inputs<'_>, measured: &[&Sample]) -> Vec<StepOut> {
    let of_step =
        |k: usize| -> Vec<&Sample> { measured.iter().copied().filter(|s| s.step == k).collect() };
    let soak = i.args.mode == Mode::Soak;
    let mut steps: Vec<StepOut> = match (soak, i.runs.first()) {
        (true, Some(run)) => soak_steps(
            run,
            &of_step(run.spec.index),
            i.config,
            i.tables,
            i.args.step_duration.as_secs_f64(),
        ),
        _ => i
            .runs
            .iter()
            .map(|r| step_out(r, &of_step(r.spec.index), i.config, i.tables))
            .collect(),
    };
    let Some(p) = i.probes else {
        return steps;
    };
    for s in &mut steps {
        s.quality = Some(if soak {
            let part: Vec<&Sample> = measured
                .iter()
                .copied()
                .filter(|m| m.ended_s >= s.started_s && m.ended_s < s.started_s + s.duration_s)
                .collect();
            quality(&part, p, &|_| s.label.clone())
        } else {
            quality(&of_step(s.index), p, &|k| label_of(i.runs, k))
        });
    }
    steps
}

/// Each step's measuring window, seconds after the start.
pub(super) fn windows(steps: &[StepOut]) -> Vec<(f64, f64)> {
    steps
        .iter()
        .map(|s| {
            let lo = s.started_s + s.warmup_s;
            (lo, lo + s.duration_s)
        })
        .collect()
}
