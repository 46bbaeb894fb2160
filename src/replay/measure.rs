//! From measured requests to the numbers of one step (or the whole run): counts, SLO
//! attainment per class, effective goodput, latency percentiles, TTFT by input length, the
//! generator's schedule lag, and the step's own spread (for `--compare`).
//!
//! Definitions are docs/DESIGN.md's: attainment = met / (met + missed) (client aborts have no
//! verdict); effective goodput = output tokens of requests that met their SLO / the
//! measuring duration; errors = every outcome but `ok` and `client_abort`. Percentiles
//! are nearest-rank over every value (no histogram rounding): ITL over every gap of
//! every request. Spread: the step's measured requests are split in two halves by
//! finish time and each number is computed on both; spread = |first − second| / 2.

use serde::Serialize;

use crate::{
    config::{
        Slo,
        slo::{LatencyMetric, SloClass},
    },
    measure::{Outcome, RequestRecord},
    stats::engine::{bucket_labels, bucket_of},
};

/// One finished request of the run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Judged (`slo_class`, `slo_met` set).
    pub record: RequestRecord,
    pub gaps_us: Vec<u32>,
    /// Sent and finished, seconds after the run started.
    pub sent_s: f64,
    pub ended_s: f64,
    /// Sent this long after its scheduled time (open loop only).
    pub lag_ms: Option<f64>,
    /// Index of the step it belongs to.
    pub step: usize,
    /// Finished inside its step's measuring window.
    pub measured: bool,
    /// A quality probe's verdict (`--probes`); `None` for profile requests.
    pub probe: Option<super::probes::ProbeResult>,
    /// An injected or burst request (`--inject`, `--burst`), kept out of the steps.
    pub inject: Option<super::inject::Kind>,
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

#[derive(Debug, Clone, Serialize)]
pub struct InputBucket {
    pub bucket: String,
    pub requests: usize,
    pub ttft_ms: Pcts,
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

fn values(s: &[&Sample], f: impl Fn(&RequestRecord) -> Option<f64>) -> Vec<f64> {
    s.iter().filter_map(|s| f(&s.record)).collect()
}

fn itl_values(s: &[&Sample]) -> Vec<f64> {
    s.iter()
        .flat_map(|s| s.gaps_us.iter().map(|g| f64::from(*g) / 1000.0))
        .collect()
}

/// Significant digits of the ITL histogram: each percentile within 0.1% of the exact
/// nearest-rank value.
const ITL_SIGFIG: u8 = 3;

/// ITL percentiles of every gap of `s`, from an HDR histogram of the gaps in µs rather
/// than a list of them (a request has one gap per token: the list would be the largest
/// thing a report holds). Count, mean and max are exact; P50..P99 within 0.1%.
fn itl(s: &[&Sample]) -> Pcts {
    let exact = || Pcts::of(itl_values(s));
    let Ok(mut h) =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, u64::from(u32::MAX), ITL_SIGFIG)
    else {
        return exact();
    };
    let (mut sum, mut max) = (0u64, None::<u32>);
    for &g in s.iter().flat_map(|s| s.gaps_us.iter()) {
        h.saturating_record(u64::from(g));
        sum += u64::from(g);
        max = Some(max.map_or(g, |m| m.max(g)));
    }
    let n = h.len();
    let ms = |us: u64| us as f64 / 1000.0;
    let q = |q: f64| (n > 0).then(|| ms(h.value_at_quantile(q).min(u64::from(max.unwrap_or(0)))));
    Pcts {
        count: n as usize,
        mean: (n > 0).then(|| sum as f64 / n as f64 / 1000.0),
        p50: q(0.5),
        p90: q(0.9),
        p95: q(0.95),
        p99: q(0.99),
        max: max.map(|m| ms(u64::from(m))),
    }
}

impl Stats {
    pub fn of(samples: &[&Sample], duration_s: f64, slo: &Slo) -> Stats {
        let count = |o: Outcome| samples.iter().filter(|s| s.record.outcome == o).count() as u64;
        let requests = samples.len() as u64;
        let client_aborts = count(Outcome::ClientAbort);
        let errors = requests - count(Outcome::Ok) - client_aborts;
        let met: Vec<&Sample> = samples
            .iter()
            .copied()
            .filter(|s| s.record.slo_met == Some(true))
            .collect();
        let missed = samples
            .iter()
            .filter(|s| s.record.slo_met == Some(false))
            .count() as u64;
        let tokens = |s: &[&Sample]| s.iter().filter_map(|s| s.record.output_tokens).sum::<u64>();
        let (output_tokens, effective) = (tokens(samples), tokens(&met));
        let missed_output_tokens = samples
            .iter()
            .filter(|s| s.record.slo_met == Some(false))
            .filter_map(|s| s.record.output_tokens)
            .sum::<u64>();
        let concurrency: Vec<f64> = samples
            .iter()
            .map(|s| f64::from(s.record.arrival.concurrency))
            .collect();
        let lags: Vec<f64> = samples.iter().filter_map(|s| s.lag_ms).collect();
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
            missed_output_tokens,
            effective_goodput_tokens_per_s: per_s(effective, duration_s),
            raw_output_tokens_per_s: per_s(output_tokens, duration_s),
            requests_per_s: per_s(requests, duration_s),
            mean_concurrency: Pcts::of(concurrency).mean,
            ttft_ms: Pcts::of(values(samples, |r| r.ttft_ms)),
            tpot_ms: Pcts::of(values(samples, |r| r.tpot_ms)),
            itl_ms: itl(samples),
            e2e_ms: Pcts::of(values(samples, |r| Some(r.e2e_ms))),
            input_tokens: Pcts::of(values(samples, |r| r.input_tokens.map(|n| n as f64))),
            output_tokens_per_request: Pcts::of(values(samples, |r| {
                r.output_tokens.map(|n| n as f64)
            })),
            ttft_ms_by_input: by_input(samples, &slo.input_buckets),
            short_ttft_ms: short_ttft(samples, &slo.input_buckets),
            classes: slo
                .all_classes()
                .map(|c| class_stats(c, samples, duration_s, slo.min_samples))
                .filter(|c| c.requests > 0)
                .collect(),
            schedule_lag_ms: (!lags.is_empty()).then(|| Pcts::of(lags)),
        }
    }
}

/// Short requests' TTFT with and without a long request in flight.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ShortTtft {
    /// Short means at most this many input tokens.
    pub short_max_input_tokens: Option<u64>,
    pub with_long_in_flight: Pcts,
    pub without: Pcts,
}

fn short_ttft(samples: &[&Sample], bounds: &[u64]) -> ShortTtft {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for s in samples {
        let short = s
            .record
            .input_tokens
            .is_some_and(|n| bucket_of(bounds, n) == 0);
        match (short, s.record.ttft_ms, s.record.arrival.long_in_flight) {
            (true, Some(t), true) => with.push(t),
            (true, Some(t), false) => without.push(t),
            _ => {}
        }
    }
    ShortTtft {
        short_max_input_tokens: bounds.first().copied(),
        with_long_in_flight: Pcts::of(with),
        without: Pcts::of(without),
    }
}

fn by_input(samples: &[&Sample], bounds: &[u64]) -> Vec<InputBucket> {
    let labels = bucket_labels(bounds);
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    let mut counts = vec![0usize; labels.len()];
    for s in samples {
        if let Some(n) = s.record.input_tokens {
            let b = bucket_of(bounds, n).min(labels.len() - 1);
            counts[b] += 1;
            ttfts[b].extend(s.record.ttft_ms);
        }
    }
    labels
        .into_iter()
        .zip(counts)
        .zip(ttfts)
        .filter(|((_, n), _)| *n > 0)
        .map(|((bucket, requests), v)| InputBucket {
            bucket,
            requests,
            ttft_ms: Pcts::of(v),
        })
        .collect()
}

fn class_stats(c: &SloClass, all: &[&Sample], duration_s: f64, min_samples: u64) -> ClassStats {
    let s: Vec<&Sample> = all
        .iter()
        .copied()
        .filter(|s| s.record.slo_class == c.name)
        .collect();
    let met = s.iter().filter(|s| s.record.slo_met == Some(true));
    let met_tokens: u64 = met.clone().filter_map(|s| s.record.output_tokens).sum();
    let met = met.count() as u64;
    let missed = s.iter().filter(|s| s.record.slo_met == Some(false)).count() as u64;
    let attainment = ratio(met, met + missed);
    let count = |outcomes: &[Outcome]| {
        s.iter()
            .filter(|s| outcomes.contains(&s.record.outcome))
            .count() as u64
    };
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
        .map(|t| {
            let mut v = match t.metric {
                LatencyMetric::Ttft => values(&s, |r| r.ttft_ms),
                LatencyMetric::Tpot => values(&s, |r| r.tpot_ms),
                LatencyMetric::E2e => values(&s, |r| Some(r.e2e_ms)),
                // A verdict: the exact nearest rank over every gap.
                LatencyMetric::Itl => itl_values(&s),
            };
            v.sort_by(f64::total_cmp);
            let value_ms = quantile(&v, t.quantile);
            TargetCheck {
                metric: t.metric.as_str(),
                quantile: t.quantile,
                max_ms: t.max_ms,
                value_ms,
                holds: value_ms.map(|v| v <= t.max_ms),
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
        name: c.name.clone(),
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
pub fn spread(samples: &[&Sample], duration_s: f64, slo: &Slo) -> Spread {
    let mut sorted: Vec<&Sample> = samples.to_vec();
    sorted.sort_by(|a, b| a.ended_s.total_cmp(&b.ended_s));
    let (a, b) = sorted.split_at(sorted.len() / 2);
    if a.len() < 2 || b.len() < 2 {
        return Spread::default();
    }
    let (sa, sb) = (
        Stats::of(a, duration_s / 2.0, slo),
        Stats::of(b, duration_s / 2.0, slo),
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
pub fn timeline(samples: &[Sample], run_s: f64, slo: &Slo) -> Vec<TimePoint> {
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
            let st = Stats::of(b, width, slo);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Pcts::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (p.p50, p.p95, p.p99, p.max),
            (Some(50.0), Some(95.0), Some(99.0), Some(100.0))
        );
        assert_eq!(p.count, 100);
        assert_eq!(Pcts::of(vec![f64::NAN]).p50, None);
        let json = serde_json::to_value(Pcts::of(vec![1.0])).unwrap();
        for key in ["p50", "p90", "p95", "p99", "max"] {
            assert_eq!(json[key], 1.0, "{key}");
        }
    }

    #[test]
    fn itl_from_the_histogram_is_within_its_stated_error_of_the_exact_computation() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let samples: Vec<Sample> = (0..300)
            .map(|i| Sample {
                record: crate::profile::line::tests::record(),
                // Skewed: mostly 5–25 ms, some stalls up to 2 s, a few zeros.
                gaps_us: (0..(i % 50))
                    .map(|k| {
                        let r = next();
                        match (k + i) % 97 {
                            0 => 0,
                            1 => (r % 2_000_000) as u32,
                            _ => 5_000 + (r % 20_000) as u32,
                        }
                    })
                    .collect(),
                sent_s: 0.0,
                ended_s: 1.0,
                lag_ms: None,
                step: 0,
                measured: true,
                probe: None,
                inject: None,
            })
            .collect();
        let refs: Vec<&Sample> = samples.iter().collect();
        let (h, e) = (itl(&refs), Pcts::of(itl_values(&refs)));
        assert_eq!(h.count, e.count);
        assert!(e.count > 5_000);
        assert_eq!(h.max, e.max);
        assert!((h.mean.unwrap() - e.mean.unwrap()).abs() < 1e-9);
        for (a, b) in [
            (h.p50, e.p50),
            (h.p90, e.p90),
            (h.p95, e.p95),
            (h.p99, e.p99),
        ] {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!((a - b).abs() <= b * 1e-3 + 1e-3, "{a} vs exact {b}");
        }
        let none = itl(&[]);
        assert_eq!((none.count, none.p50, none.max), (0, None, None));
    }
}
