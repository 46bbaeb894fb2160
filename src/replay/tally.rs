//! From measured requests to the numbers of one step (or the whole run): counts, SLO
//! attainment per class, effective goodput, latency percentiles, TTFT by input length, the
//! generator's schedule lag, and the step's own spread (for `--compare`).
//!
//! Definitions are docs/DESIGN.md's: attainment = met / (met + missed) (client aborts have no
//! verdict); effective goodput = output tokens of requests that met their SLO (and, for
//! quality probes, answered correctly) / the measuring duration; errors = every outcome but `ok` and `client_abort`. Percentiles
//! are nearest-rank over every value (no histogram rounding), except ITL's: those come
//! from HDR histograms of every gap of every request ([`super::tables`]), each at most
//! 0.1% above the exact nearest rank (count, mean and max exact). Spread: the step's
//! measured requests are split in two halves by finish time and each number is computed
//! on both; spread = |first − second| / 2.

use serde::Serialize;

pub use buckets::{CacheTtft, InputBucket, OutputBucket, ShortTtft};
use buckets::{by_cache, by_input, by_output, short_ttft};

use super::tables::{GroupId, NO_GROUP, NameId, Tables};
use crate::{
    decode::FinishReason,
    measure::{
        Outcome, RequestRecord,
        verdict::{MissCause, MissReason},
    },
    slo::{LatencyMetric, Slo, SloClass},
};

/// One finished request of the run, as the report reads it: fixed-size fields and no
/// heap (a probe's verdict aside), so a long run holds about 100 bytes per request. Its
/// whole record went to `requests.jsonl` as it finished; the names it is grouped by are
/// ids into the run's [`Tables`], and a measured request's gaps were counted in its ITL
/// group there. Absent latencies are kept as NaN (a measured one never is) and absent
/// token counts as `u64::MAX`; read them through the accessors.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Sent and finished, seconds after the run started.
    pub sent_s: f64,
    pub ended_s: f64,
    lag_ms: f64,
    ttft_ms: f64,
    tpot_ms: f64,
    pub e2e_ms: f64,
    input_tokens: u64,
    output_tokens: u64,
    /// Index of the step it belongs to.
    pub step: usize,
    /// A quality probe's verdict (`--probes`); `None` for profile requests.
    pub probe: Option<Box<super::probes::ProbeResult>>,
    /// Its ITL group (measured requests), else [`NO_GROUP`].
    pub itl: GroupId,
    /// SLO class and model (`unknown` when the request named none), interned.
    pub class: NameId,
    pub model: NameId,
    /// In flight when it was sent, itself included.
    pub concurrency: u32,
    pub status: Option<u16>,
    pub outcome: Outcome,
    pub slo_met: Option<bool>,
    pub miss_reason: Option<MissReason>,
    pub miss_cause: Option<MissCause>,
    pub finish_reason: Option<FinishReason>,
    /// A long-input request was in flight when it was sent.
    pub long_in_flight: bool,
    /// The target reported cached input tokens (`Some(true)`), none (`Some(false)`), or
    /// nothing about its prefix cache.
    pub cache_hit: Option<bool>,
    /// Finished inside its step's measuring window.
    pub measured: bool,
    /// An injected or burst request (`--inject`, `--burst`), kept out of the steps.
    pub inject: Option<super::inject::Kind>,
    /// A 5xx whose body named out-of-memory.
    pub out_of_memory: bool,
}

const NO_COUNT: u64 = u64::MAX;

impl Sample {
    /// The report's view of a judged record (`slo_class`, `slo_met` set), its names
    /// interned in `t`; not measured, in no ITL group, step 0, sent and ended at 0.
    pub fn of(r: &RequestRecord, t: &mut Tables) -> Sample {
        let count = |n: Option<u64>| n.map_or(NO_COUNT, |n| n.min(NO_COUNT - 1));
        Sample {
            sent_s: 0.0,
            ended_s: 0.0,
            lag_ms: f64::NAN,
            ttft_ms: r.ttft_ms.unwrap_or(f64::NAN),
            tpot_ms: r.tpot_ms.unwrap_or(f64::NAN),
            e2e_ms: r.e2e_ms,
            input_tokens: count(r.input_tokens),
            output_tokens: count(r.output_tokens),
            step: 0,
            probe: None,
            itl: NO_GROUP,
            class: t.intern(&r.slo_class),
            model: t.intern(r.model.as_deref().unwrap_or("unknown")),
            concurrency: r.arrival.concurrency,
            status: r.status,
            outcome: r.outcome,
            slo_met: r.slo_met,
            miss_reason: r.slo_miss_reason.and_then(MissReason::parse),
            miss_cause: MissCause::of(r),
            finish_reason: r.finish_reason,
            long_in_flight: r.arrival.long_in_flight,
            cache_hit: r.cached_input_tokens.map(|n| n > 0),
            measured: false,
            inject: None,
            out_of_memory: false,
        }
    }

    pub fn ttft_ms(&self) -> Option<f64> {
        (!self.ttft_ms.is_nan()).then_some(self.ttft_ms)
    }

    /// Effective output: it met its SLO and, if a quality probe, answered correctly (a
    /// wrong answer is no output, however fast).
    pub fn effective(&self) -> bool {
        self.slo_met == Some(true) && self.probe.as_ref().is_none_or(|p| p.passed)
    }

    pub fn tpot_ms(&self) -> Option<f64> {
        (!self.tpot_ms.is_nan()).then_some(self.tpot_ms)
    }

    /// Sent this long after its scheduled time (open loop only).
    pub fn lag_ms(&self) -> Option<f64> {
        (!self.lag_ms.is_nan()).then_some(self.lag_ms)
    }

    pub fn set_lag_ms(&mut self, lag: Option<f64>) {
        self.lag_ms = lag.unwrap_or(f64::NAN);
    }

    pub fn input_tokens(&self) -> Option<u64> {
        (self.input_tokens != NO_COUNT).then_some(self.input_tokens)
    }

    pub fn output_tokens(&self) -> Option<u64> {
        (self.output_tokens != NO_COUNT).then_some(self.output_tokens)
    }
}

/// Nearest-rank percentiles in ms; `null`s without values.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Pcts {
    pub count: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Pcts {
    pub fn of(mut v: Vec<f64>) -> Pcts {
        v.retain(|x| x.is_finite());
        v.sort_by(f64::total_cmp);
        let q = |q: f64| quantile(&v, q);
        Pcts {
            count: v.len(),
            mean: (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64),
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            max: v.last().copied(),
        }
    }
}

/// Nearest-rank quantile of sorted values.
pub use crate::quantile::nearest_rank as quantile;

/// A class's percentile target and whether it held.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub metric: &'static str,
    pub quantile: f64,
    pub max_ms: f64,
    pub value_ms: Option<f64>,
    pub holds: Option<bool>,
}

/// One SLO class over a set of requests.
#[derive(Debug, Clone, Serialize)]
pub struct ClassStats {
    pub name: String,
    pub requests: u64,
    pub slo_met: u64,
    pub slo_missed: u64,
    pub attainment: Option<f64>,
    pub attainment_target: f64,
    pub percentile_targets: Vec<TargetCheck>,
    pub effective_goodput_tokens_per_s: f64,
    /// `upstream_error`, `upstream_reset` and `proxy_error` over all requests, as the
    /// live summary's.
    pub error_rate: Option<f64>,
    /// `rejected` (429, 503) over all requests.
    pub rejection_rate: Option<f64>,
    pub error_rate_max: Option<f64>,
    /// Attainment, every percentile target and `error_rate_max` hold (`null` without
    /// samples).
    pub holds: Option<bool>,
    /// At least `[slo] min_samples` requests with a verdict: enough to say so.
    pub enough_samples: bool,
}

/// Half the difference between the step's two halves (see the module doc).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    pub ttft_p95_ms: Option<f64>,
    pub tpot_p95_ms: Option<f64>,
    pub e2e_p95_ms: Option<f64>,
    pub effective_goodput_tokens_per_s: Option<f64>,
    pub attainment: Option<f64>,
}

/// The numbers of one set of requests over `duration_s` seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub requests: u64,
    pub errors: u64,
    pub client_aborts: u64,
    pub error_rate: Option<f64>,
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
    pub slo_met: u64,
    pub slo_missed: u64,
    pub attainment: Option<f64>,
    pub output_tokens: u64,
    pub effective_output_tokens: u64,
    /// Requests that met their SLO and, if a quality probe, answered correctly.
    pub effective_requests: u64,
    /// Output tokens of requests that missed their SLO (wasted spend).
    pub missed_output_tokens: u64,
    pub effective_goodput_tokens_per_s: f64,
    pub raw_output_tokens_per_s: f64,
    pub requests_per_s: f64,
    /// In flight when each request was sent (itself included), mean.
    pub mean_concurrency: Option<f64>,
    pub ttft_ms: Pcts,
    pub tpot_ms: Pcts,
    pub itl_ms: Pcts,
    pub e2e_ms: Pcts,
    pub input_tokens: Pcts,
    pub output_tokens_per_request: Pcts,
    pub ttft_ms_by_input: Vec<InputBucket>,
    /// E2E by output length (the live summary's buckets).
    pub e2e_ms_by_output: Vec<OutputBucket>,
    /// TTFT of prefix-cache hits and misses, where the target reports cached tokens.
    pub ttft_ms_by_cache: CacheTtft,
    pub input_tokens_total: u64,
    pub input_tokens_per_s: f64,
    /// TTFT of short requests (the first input bucket) sent while a long request (body
    /// of at least `[slo] long_input_bytes`) was in flight, and of those sent without.
    pub short_ttft_ms: ShortTtft,
    pub classes: Vec<ClassStats>,
    /// Scheduled-to-sent delay of open-loop requests.
    pub schedule_lag_ms: Option<Pcts>,
}

fn per_s(n: u64, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

fn values(s: &[&Sample], f: impl Fn(&Sample) -> Option<f64>) -> Vec<f64> {
    s.iter().filter_map(|s| f(s)).collect()
}

impl Stats {
    /// The numbers of `samples`, whose names and ITL groups are in `t`. ITL is read over
    /// their groups, so `samples` must make up whole groups: a step's measured requests,
    /// a soak interval's, the run's, a model's (see [`Tables`]).
    pub fn of(samples: &[&Sample], duration_s: f64, slo: &Slo, t: &Tables) -> Stats {
        Stats::build(samples, duration_s, slo, t, true)
    }

    /// As [`Stats::of`] with no ITL (count 0, no class ITL target value): for sets that
    /// cut across ITL groups (a step's halves, the timeline's intervals), whose ITL is
    /// not reported.
    pub fn without_itl(samples: &[&Sample], duration_s: f64, slo: &Slo, t: &Tables) -> Stats {
        Stats::build(samples, duration_s, slo, t, false)
    }

    fn build(samples: &[&Sample], duration_s: f64, slo: &Slo, t: &Tables, itl: bool) -> Stats {
        let count = |o: Outcome| samples.iter().filter(|s| s.outcome == o).count() as u64;
        let requests = samples.len() as u64;
        let client_aborts = count(Outcome::ClientAbort);
        let errors = requests - count(Outcome::Ok) - client_aborts;
        let met: Vec<&Sample> = samples
            .iter()
            .copied()
            .filter(|s| s.slo_met == Some(true))
            .collect();
        let missed = samples.iter().filter(|s| s.slo_met == Some(false)).count() as u64;
        let tokens = |s: &[&Sample]| s.iter().filter_map(|s| s.output_tokens()).sum::<u64>();
        let good: Vec<&Sample> = met.iter().copied().filter(|s| s.effective()).collect();
        let (output_tokens, effective) = (tokens(samples), tokens(&good));
        let missed_output_tokens = samples
            .iter()
            .filter(|s| s.slo_met == Some(false))
            .filter_map(|s| s.output_tokens())
            .sum::<u64>();
        let concurrency: Vec<f64> = samples.iter().map(|s| f64::from(s.concurrency)).collect();
        let input: u64 = samples.iter().filter_map(|s| s.input_tokens()).sum();
        let lags: Vec<f64> = samples.iter().filter_map(|s| s.lag_ms()).collect();
        Stats {
            requests,
            errors,
            client_aborts,
            error_rate: ratio(errors, requests),
            outcomes: Outcome::ALL
                .iter()
                .map(|o| (o.as_str(), count(*o)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            slo_met: met.len() as u64,
            slo_missed: missed,
            attainment: ratio(met.len() as u64, met.len() as u64 + missed),
            output_tokens,
            effective_output_tokens: effective,
            effective_requests: good.len() as u64,
            missed_output_tokens,
            effective_goodput_tokens_per_s: per_s(effective, duration_s),
            raw_output_tokens_per_s: per_s(output_tokens, duration_s),
            requests_per_s: per_s(requests, duration_s),
            mean_concurrency: Pcts::of(concurrency).mean,
            ttft_ms: Pcts::of(values(samples, Sample::ttft_ms)),
            tpot_ms: Pcts::of(values(samples, Sample::tpot_ms)),
            itl_ms: if itl {
                t.gaps(samples.iter().map(|s| s.itl)).pcts()
            } else {
                Pcts::default()
            },
            e2e_ms: Pcts::of(values(samples, |s| Some(s.e2e_ms))),
            input_tokens: Pcts::of(values(samples, |s| s.input_tokens().map(|n| n as f64))),
            output_tokens_per_request: Pcts::of(values(samples, |s| {
                s.output_tokens().map(|n| n as f64)
            })),
            ttft_ms_by_input: by_input(samples, &slo.input_buckets),
            e2e_ms_by_output: by_output(samples),
            ttft_ms_by_cache: by_cache(samples),
            input_tokens_total: input,
            input_tokens_per_s: per_s(input, duration_s),
            short_ttft_ms: short_ttft(samples, &slo.input_buckets),
            classes: slo
                .all_classes()
                .map(|c| class_stats(c, samples, duration_s, slo.min_samples, t, itl))
                .filter(|c| c.requests > 0)
                .collect(),
            schedule_lag_ms: (!lags.is_empty()).then(|| Pcts::of(lags)),
        }
    }
}

fn class_stats(
    c: &SloClass,
    all: &[&Sample],
    duration_s: f64,
    min_samples: u64,
    t: &Tables,
    itl: bool,
) -> ClassStats {
    let id = t.id(&c.name);
    let s: Vec<&Sample> = all
        .iter()
        .copied()
        .filter(|s| Some(s.class) == id)
        .collect();
    let met = s.iter().filter(|s| s.slo_met == Some(true));
    let met_tokens: u64 = met
        .clone()
        .filter(|s| s.effective())
        .filter_map(|s| s.output_tokens())
        .sum();
    let met = met.count() as u64;
    let missed = s.iter().filter(|s| s.slo_met == Some(false)).count() as u64;
    let attainment = ratio(met, met + missed);
    let count =
        |outcomes: &[Outcome]| s.iter().filter(|s| outcomes.contains(&s.outcome)).count() as u64;
    let requests = s.len() as u64;
    let error_rate = ratio(
        count(&[
            Outcome::UpstreamError,
            Outcome::UpstreamReset,
            Outcome::ProxyError,
        ]),
        requests,
    );
    let rejection_rate = ratio(count(&[Outcome::Rejected]), requests);
    let percentile_targets: Vec<TargetCheck> = c
        .percentiles
        .iter()
        .map(|p| {
            let mut v = match p.metric {
                LatencyMetric::Ttft => values(&s, Sample::ttft_ms),
                LatencyMetric::Tpot => values(&s, Sample::tpot_ms),
                LatencyMetric::E2e => values(&s, |s| Some(s.e2e_ms)),
                // From the class's ITL groups: at most 0.1% above the exact nearest rank,
                // never below it, so a target that holds here holds exactly.
                LatencyMetric::Itl => Vec::new(),
            };
            v.sort_by(f64::total_cmp);
            let value_ms = match p.metric {
                LatencyMetric::Itl if itl => {
                    t.gaps(s.iter().map(|s| s.itl)).quantile_ms(p.quantile)
                }
                LatencyMetric::Itl => None,
                _ => quantile(&v, p.quantile),
            };
            TargetCheck {
                metric: p.metric.as_str(),
                quantile: p.quantile,
                max_ms: p.max_ms,
                value_ms,
                holds: value_ms.map(|v| v <= p.max_ms),
            }
        })
        .collect();
    // Attainment comparisons tolerate float rounding (99/100 against 0.99), as the engine's.
    let holds = attainment.map(|a| {
        a + 1e-9 >= c.attainment
            && percentile_targets.iter().all(|t| t.holds != Some(false))
            && c.error_rate_max
                .zip(error_rate)
                .is_none_or(|(max, rate)| rate <= max + 1e-9)
    });
    ClassStats {
        name: c.name.to_string(),
        requests: s.len() as u64,
        slo_met: met,
        slo_missed: missed,
        attainment,
        attainment_target: c.attainment,
        percentile_targets,
        effective_goodput_tokens_per_s: per_s(met_tokens, duration_s),
        error_rate,
        rejection_rate,
        error_rate_max: c.error_rate_max,
        holds,
        enough_samples: met + missed >= min_samples.max(1),
    }
}

impl Stats {
    /// A class with enough samples missed its targets.
    pub fn breaks(&self) -> bool {
        self.classes
            .iter()
            .any(|c| c.enough_samples && c.holds == Some(false))
    }

    /// Nothing broke and at least one class had enough samples to say so.
    pub fn holds(&self) -> bool {
        !self.breaks() && self.classes.iter().any(|c| c.enough_samples)
    }
}

/// The split-half spread of a step's measured requests (see the module doc).
pub fn spread(samples: &[&Sample], duration_s: f64, slo: &Slo, t: &Tables) -> Spread {
    let mut sorted: Vec<&Sample> = samples.to_vec();
    sorted.sort_by(|a, b| a.ended_s.total_cmp(&b.ended_s));
    let (a, b) = sorted.split_at(sorted.len() / 2);
    if a.len() < 2 || b.len() < 2 {
        return Spread::default();
    }
    let (sa, sb) = (
        Stats::without_itl(a, duration_s / 2.0, slo, t),
        Stats::without_itl(b, duration_s / 2.0, slo, t),
    );
    let half = |x: Option<f64>, y: Option<f64>| Some((x? - y?).abs() / 2.0);
    Spread {
        ttft_p95_ms: half(sa.ttft_ms.p95, sb.ttft_ms.p95),
        tpot_p95_ms: half(sa.tpot_ms.p95, sb.tpot_ms.p95),
        e2e_p95_ms: half(sa.e2e_ms.p95, sb.e2e_ms.p95),
        effective_goodput_tokens_per_s: half(
            Some(sa.effective_goodput_tokens_per_s),
            Some(sb.effective_goodput_tokens_per_s),
        ),
        attainment: half(sa.attainment, sb.attainment),
    }
}

/// One interval of the run's timeline (every finished request, warm-up included).
#[derive(Debug, Clone, Serialize)]
pub struct TimePoint {
    /// Interval start, seconds after the run started.
    pub t_s: f64,
    pub requests: u64,
    pub errors: u64,
    pub error_rate: Option<f64>,
    pub attainment: Option<f64>,
    pub effective_goodput_tokens_per_s: f64,
    pub raw_output_tokens_per_s: f64,
    pub ttft_p95_ms: Option<f64>,
}

/// The run cut into about 60 intervals of whole seconds (by finish time).
pub fn timeline(samples: &[Sample], run_s: f64, slo: &Slo, t: &Tables) -> Vec<TimePoint> {
    let width = (run_s / 60.0).ceil().max(1.0);
    let n = ((run_s / width).ceil() as usize).max(1);
    let mut buckets: Vec<Vec<&Sample>> = vec![Vec::new(); n];
    for s in samples {
        let i = ((s.ended_s / width).floor().max(0.0) as usize).min(n - 1);
        buckets[i].push(s);
    }
    buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let st = Stats::without_itl(b, width, slo, t);
            TimePoint {
                t_s: i as f64 * width,
                requests: st.requests,
                errors: st.errors,
                error_rate: st.error_rate,
                attainment: st.attainment,
                effective_goodput_tokens_per_s: st.effective_goodput_tokens_per_s,
                raw_output_tokens_per_s: st.raw_output_tokens_per_s,
                ttft_p95_ms: st.ttft_ms.p95,
            }
        })
        .collect()
}

mod buckets;
#[cfg(test)]
mod tests;
