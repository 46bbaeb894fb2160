//! The acceptance numbers: the capacity curve, max stable concurrency and knee (computed
//! by the proxy's own windowed [`Engine`] from the replay's measured requests, so a replay
//! and the live `/api/v1/capacity` agree by construction), the verdict per SLO class at
//! the required load, and the headline goodput and unit cost.
//!
//! Where the verdict is judged:
//! - trace, soak: over every measured request;
//! - steps: at the first step whose concurrency reaches the required concurrency
//!   (`--required-concurrency`, default the profile's time-averaged concurrency × rate
//!   scale, rounded up); a run whose steps stop below it fails ("not tested");
//! - ramp: at the first step whose rate reaches the required rate (`--required-rate`,
//!   default the profile's mean rate × rate scale); failing before reaching it fails.
//!
//! A class passes when its attainment reaches its target and every percentile target it
//! sets holds, over its requests at that load, with at least `[slo] min_samples` of them
//! (fewer cannot say so); a class with no request there fails.

use std::time::{Duration, Instant};

use super::json::{CostOut, Knee, StepOut, Verdict};
use crate::{
    config::{Config, Cost},
    replay::{
        cli::Mode,
        tables::Tables,
        tally::{Sample, Stats},
    },
    stats::engine::{Capacity, Engine, HOURS_PER_MONTH, Observation},
};

/// Engine window long enough to hold any replay in one capacity slice set.
const ENGINE_SPAN: Duration = Duration::from_secs(7 * 24 * 3600);

/// The engine's capacity curves (pooled, then per class with traffic) over `samples`,
/// each counted at the concurrency `level` gives it.
pub fn capacity(
    cfg: &Config,
    samples: &[&Sample],
    t: &Tables,
    level: impl Fn(&Sample) -> u32,
    t0: Instant,
) -> (Option<Capacity>, Vec<Capacity>) {
    let mut ec = crate::stats::engine_config(cfg);
    ec.windows = vec![ENGINE_SPAN];
    ec.history = ENGINE_SPAN;
    let mut engine = Engine::new(ec);
    let at = |s: f64| t0 + Duration::from_secs_f64(s.max(0.0));
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.ended_s.total_cmp(&b.ended_s));
    let mut now = t0;
    for s in sorted {
        engine.observe(&Observation {
            started: at(s.sent_s),
            finished: at(s.ended_s),
            class: t.name(s.class),
            model: t.name(s.model),
            outcome: s.outcome,
            slo_met: s.slo_met,
            ttft_ms: s.ttft_ms(),
            tpot_ms: s.tpot_ms(),
            e2e_ms: s.e2e_ms,
            // The capacity curve reads no ITL (its levels keep TTFT and TPOT only).
            itl_us: &[],
            input_tokens: s.input_tokens(),
            output_tokens: s.output_tokens(),
            concurrency_at_start: level(s),
            long_in_flight_at_start: s.long_in_flight,
            miss_cause: s.miss_cause,
            finish_reason: s.finish_reason,
            cached_input_tokens: None,
            engine_parts: Default::default(),
            miss_component: None,
        });
        now = now.max(at(s.ended_s));
    }
    let names: Vec<String> = engine.classes().map(str::to_owned).collect();
    let by_class = names
        .iter()
        .filter_map(|c| engine.capacity(Some(c), now))
        .filter(|c| !c.levels.is_empty())
        .collect();
    (engine.capacity(None, now), by_class)
}

/// An engine level (reported by its lowest concurrency) as the step concurrency it holds
/// (steps mode), or as itself.
pub fn as_step(cap: &Capacity, level: Option<u32>, steps: &[StepOut], mode: Mode) -> Option<u32> {
    let lo = level?;
    if mode != Mode::Steps {
        return Some(lo);
    }
    let l = cap.levels.iter().find(|l| l.concurrency == lo)?;
    let hi = l.concurrency_max.unwrap_or(u32::MAX);
    steps
        .iter()
        .filter_map(|s| s.concurrency)
        .filter(|c| (lo..=hi).contains(c))
        .max()
}

/// The knee: steps by concurrency (the engine's slope rule), ramp by rate (the last step
/// whose every class held), trace and soak by the engine over observed concurrency.
pub fn knee(cap: Option<&Capacity>, steps: &[StepOut], mode: Mode) -> Knee {
    let concurrency = cap.and_then(|c| as_step(c, c.knee, steps, mode));
    let rate = (mode == Mode::Ramp)
        .then(|| {
            let before_break = steps.iter().take_while(|s| !s.stats.breaks());
            before_break.filter(|s| step_holds(s)).last()
        })
        .flatten()
        .and_then(|s| s.rate);
    let step = match mode {
        Mode::Steps => steps
            .iter()
            .find(|s| s.concurrency.is_some() && s.concurrency == concurrency),
        Mode::Ramp => steps.iter().find(|s| s.rate.is_some() && s.rate == rate),
        _ => None,
    };
    let level = cap.and_then(|c| c.levels.iter().find(|l| Some(l.concurrency) == c.knee));
    Knee {
        concurrency,
        rate,
        throughput_tokens_per_s: step
            .map(|s| s.stats.raw_output_tokens_per_s)
            .or(level.and_then(|l| l.throughput_tokens_per_s)),
        ttft_p95_ms: step
            .and_then(|s| s.stats.ttft_ms.p95)
            .or(level.and_then(|l| l.ttft_p95_ms)),
        rule: match mode {
            Mode::Ramp => "highest rate before a class with enough samples missed its targets",
            _ => {
                "last concurrency before the marginal throughput gain falls below half the initial slope or a percentile target breaks"
            }
        },
    }
}

/// The step demonstrably held (see [`crate::replay::tally::Stats::holds`]).
pub fn step_holds(s: &StepOut) -> bool {
    s.stats.holds()
}

/// The step the verdict is judged at (see the module doc); `Err` names why none is.
pub fn judged_step(
    steps: &[StepOut],
    mode: Mode,
    required_c: Option<u32>,
    required_rate: Option<f64>,
) -> Result<Option<usize>, String> {
    match mode {
        Mode::Trace | Mode::Soak => Ok(None),
        Mode::Steps | Mode::Limits => {
            let want = required_c.unwrap_or(1);
            steps
                .iter()
                .position(|s| s.concurrency.is_some_and(|c| c >= want))
                .map(Some)
                .ok_or_else(|| format!("required concurrency {want} was not tested"))
        }
        Mode::Ramp => {
            let want = required_rate.unwrap_or(0.0);
            steps
                .iter()
                .position(|s| s.rate.is_some_and(|r| r + 1e-9 >= want))
                .map(Some)
                .ok_or_else(|| format!("the ramp broke before the required rate {want:.3}/s"))
        }
    }
}

/// One verdict per class that had measured requests anywhere in the run.
pub fn verdicts(
    classes: &[String],
    judged: Result<Option<&StepOut>, String>,
    overall: &crate::replay::tally::Stats,
    by_class: &[Capacity],
    target_of: impl Fn(&str) -> f64,
) -> Vec<Verdict> {
    classes
        .iter()
        .map(|name| {
            let (stats, at) = match &judged {
                Ok(Some(step)) => (Some(&step.stats), step.label.clone()),
                Ok(None) => (Some(overall), "run".to_owned()),
                Err(_) => (None, "-".to_owned()),
            };
            let c = stats.and_then(|s| s.classes.iter().find(|c| &c.name == name));
            let pass = c.is_some_and(|c| c.holds == Some(true) && c.enough_samples);
            let reason = match (&judged, c) {
                (Err(why), _) => Some(why.clone()),
                (Ok(_), None) => Some("no completed request of this class at that load".into()),
                (Ok(_), Some(c)) if !c.enough_samples => Some(format!(
                    "only {} requests with a verdict, fewer than [slo] min_samples",
                    c.slo_met + c.slo_missed
                )),
                (Ok(_), Some(c)) if !pass => Some(miss_reason(c)),
                _ => None,
            };
            Verdict {
                class: name.clone(),
                verdict: if pass { "pass" } else { "fail" },
                judged_at: at,
                requests: c.map_or(0, |c| c.requests),
                attainment: c.and_then(|c| c.attainment),
                attainment_target: c.map_or(target_of(name), |c| c.attainment_target),
                percentile_targets: c.map(|c| c.percentile_targets.clone()).unwrap_or_default(),
                max_stable_concurrency: by_class
                    .iter()
                    .find(|cap| &cap.class == name)
                    .and_then(|cap| cap.max_stable_concurrency),
                reason,
            }
        })
        .collect()
}

fn miss_reason(c: &crate::replay::tally::ClassStats) -> String {
    let mut why = Vec::new();
    if let Some(a) = c.attainment
        && a + 1e-9 < c.attainment_target
    {
        why.push(format!(
            "attainment {:.2}% < target {:.2}%",
            a * 100.0,
            c.attainment_target * 100.0
        ));
    }
    if let Some((max, rate)) = c.error_rate_max.zip(c.error_rate)
        && rate > max + 1e-9
    {
        why.push(format!(
            "error rate {:.2}% > max {:.2}%",
            rate * 100.0,
            max * 100.0
        ));
    }
    for t in c
        .percentile_targets
        .iter()
        .filter(|t| t.holds == Some(false))
    {
        why.push(format!(
            "P{} {} {:.1} ms > {:.1} ms",
            t.quantile * 100.0,
            t.metric,
            t.value_ms.unwrap_or(f64::NAN),
            t.max_ms
        ));
    }
    why.join("; ")
}

/// Unit cost at an operating point of `goodput` effective and `raw` output tokens/s;
/// `measured_kw`: the accelerators' mean power over the run (`--gpu-metrics`), priced at
/// `[cost] energy_price_per_kwh` in place of a configured `kw`.
pub fn cost(
    cost: Option<&Cost>,
    point: Option<&Stats>,
    stable: Option<u32>,
    measured_kw: Option<f64>,
) -> Option<CostOut> {
    let c = cost?;
    let measured = measured_kw
        .filter(|kw| kw.is_finite() && *kw >= 0.0)
        .and_then(|kw| c.with_measured_power(kw).map(|m| (kw, m)));
    let (components, per_hour) = match &measured {
        Some((_, (components, per_hour))) => (components.clone(), *per_hour),
        None => (c.components.clone(), c.per_hour),
    };
    // What the operating point's traffic runs up per hour at the usage prices.
    let usage_per_hour = (c.usage.any()).then(|| {
        point.map_or(0.0, |p| {
            c.usage.cost(crate::config::cost::Used {
                requests: p.requests_per_s * 3600.0,
                input_tokens: p.input_tokens_per_s * 3600.0,
                cached_input_tokens: 0.0,
                output_tokens: p.raw_output_tokens_per_s * 3600.0,
            })
        })
    });
    let total_per_hour = per_hour + usage_per_hour.unwrap_or(0.0);
    let per_hour_over = |per_s: Option<f64>, unit: f64| {
        per_s
            .filter(|t| *t > 0.0 && t.is_finite())
            .map(|t| total_per_hour / (t * 3600.0) * unit)
    };
    // Effective = met its SLO and, for a quality probe, answered correctly: a wrong
    // answer is paid for and worth nothing.
    let effective_requests_per_s = point.map(|p| {
        if p.requests == 0 {
            0.0
        } else {
            p.requests_per_s * p.effective_requests as f64 / p.requests as f64
        }
    });
    Some(CostOut {
        currency: c.currency.clone(),
        per_hour,
        components: components.into_iter().collect(),
        measured_power_kw: measured.as_ref().map(|(kw, _)| *kw),
        one_time: c.one_time.iter().cloned().collect(),
        usage: c.usage.any().then_some(c.usage),
        usage_per_hour,
        cost_per_million_effective_tokens: per_hour_over(
            point.map(|p| p.effective_goodput_tokens_per_s),
            1e6,
        ),
        cost_per_million_raw_tokens: per_hour_over(point.map(|p| p.raw_output_tokens_per_s), 1e6),
        cost_per_request: per_hour_over(point.map(|p| p.requests_per_s), 1.0),
        cost_per_effective_request: per_hour_over(effective_requests_per_s, 1.0),
        // Every output token that was not effective: missed SLOs, failed probes, errors.
        wasted_share: point.filter(|p| p.output_tokens > 0).map(|p| {
            p.output_tokens.saturating_sub(p.effective_output_tokens) as f64
                / p.output_tokens as f64
        }),
        cost_per_stable_user_per_month: stable
            .filter(|s| *s > 0)
            .map(|s| total_per_hour * HOURS_PER_MONTH / f64::from(s)),
    })
}
