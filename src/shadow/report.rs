//! The numbers of `GET /api/v1/shadow` for one SLO class: primary and shadow side by
//! side over the mirrored requests of a window, paired ratios with bootstrap confidence
//! intervals, and the verdict. Pure: the pairs and the class's targets are passed in.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::Serialize;

use super::{answers::Compared, logprobs::Close, samples::Sampled};
use crate::{measure::Outcome, quantile::nearest_rank};

/// The verdict's rule, as the API states it.
pub const RULE: &str = "insufficient while fewer than slo.min_samples pairs have both \
sides judged (met or missed); otherwise pass when the shadow's attainment over those pairs \
is at least the class's attainment target and, where the class sets error_rate_max, the \
shadow's error rate is at most that; else fail";

/// The answers verdict's rule, as the API states it (Twitter's Diffy, docs/SHADOW.md).
pub const ANSWERS_RULE: &str = "over the deterministic requests (temperature 0 or a seed) \
whose candidate and primary both answered in full: insufficient while fewer than \
slo.min_samples pairs; otherwise, with d the share of the candidate's answers that differ \
from the primary's and n the share of the secondary's that do (0 without a secondary), fail \
when d - n > shadow.answers_absolute and d - n > shadow.answers_relative * n, else pass. \
Sampled requests are compared by length and finish reason only, never word for word";

/// Diffy's thresholds (`shadow.answers_relative`, `shadow.answers_absolute`).
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub relative: f64,
    pub absolute: f64,
}

/// The 50th and 95th percentiles of a position.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Positions {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
}

impl Positions {
    fn of(mut v: Vec<f64>) -> Positions {
        v.sort_by(f64::total_cmp);
        Positions {
            p50: nearest_rank(&v, 0.5),
            p95: nearest_rank(&v, 0.95),
        }
    }
}

/// The answers half of a class's verdict (`answers` in `GET /api/v1/shadow`).
#[derive(Debug, Clone, Serialize)]
pub struct Answers {
    /// Deterministic candidate-vs-primary pairs compared.
    pub pairs: u64,
    /// Their share of exact matches.
    pub exact_match: Option<f64>,
    /// Deterministic secondary-vs-primary pairs compared, and their share of exact
    /// matches: the primary's own noise.
    pub noise_pairs: u64,
    pub noise_exact_match: Option<f64>,
    /// Where the differing deterministic answers first differ: in streamed tokens, and in
    /// characters.
    pub first_divergence_tokens: Positions,
    pub first_divergence_chars: Positions,
    /// Sampled (non-deterministic) pairs, compared by distribution only: their lengths
    /// and finish reasons by two-sample tests, the candidate's and the secondary's.
    pub sampled_pairs: u64,
    pub sampled: Sampled,
    pub noise_sampled: Option<Sampled>,
    /// The candidate's output length over the primary's, over every compared pair.
    pub length_ratio: Positions,
    /// Share of compared pairs with the same finish reason, candidate and secondary.
    pub finish_equal: Option<f64>,
    pub noise_finish_equal: Option<f64>,
    /// vLLM's top-5 rule between the candidate's and the secondary's tokens
    /// (`shadow.logprobs`), over the deterministic pairs both answered with them: how many,
    /// the share it accepts (the same tokens, or at the first difference each in the
    /// other's top 5), and the mean top-5 KL divergence up to the first difference.
    /// `null` without log-probabilities.
    pub close_pairs: u64,
    pub close_rate: Option<f64>,
    pub kl_mean: Option<f64>,
    pub verdict: Verdict,
    pub reason: String,
    pub rule: &'static str,
}

impl Answers {
    /// The numbers and the verdict over the compared pairs of a class.
    pub fn of(
        candidate: &[Compared],
        secondary: &[Compared],
        t: Thresholds,
        min_pairs: u64,
    ) -> Answers {
        let det = |v: &[Compared]| {
            v.iter()
                .filter(|c| c.deterministic)
                .copied()
                .collect::<Vec<_>>()
        };
        let (cd, sd) = (det(candidate), det(secondary));
        let share = |v: &[Compared], f: fn(&Compared) -> bool| {
            (!v.is_empty()).then(|| v.iter().filter(|c| f(c)).count() as f64 / v.len() as f64)
        };
        let exact_match = share(&cd, |c| c.exact);
        let noise_exact_match = share(&sd, |c| c.exact);
        let n = cd.len() as u64;
        let (verdict, reason) = match exact_match {
            _ if n < min_pairs => (
                Verdict::Insufficient,
                format!("{n} deterministic pairs, {min_pairs} needed"),
            ),
            None => (Verdict::Insufficient, "no deterministic pairs".to_owned()),
            Some(same) => {
                let d = 1.0 - same;
                let noise = 1.0 - noise_exact_match.unwrap_or(1.0);
                let over = d - noise;
                if over > t.absolute && over > t.relative * noise {
                    (
                        Verdict::Fail,
                        format!(
                            "{d:.4} of the candidate's answers differ against a noise of \
                             {noise:.4}, beyond {} relative and {} absolute",
                            t.relative, t.absolute
                        ),
                    )
                } else {
                    (
                        Verdict::Pass,
                        format!(
                            "{d:.4} of the candidate's answers differ against a noise of \
                             {noise:.4}, within {} relative or {} absolute",
                            t.relative, t.absolute
                        ),
                    )
                }
            }
        };
        let positions = |f: fn(&Compared) -> Option<u64>| {
            Positions::of(cd.iter().filter_map(|c| f(c).map(|v| v as f64)).collect())
        };
        Answers {
            pairs: n,
            exact_match,
            noise_pairs: sd.len() as u64,
            noise_exact_match,
            first_divergence_tokens: positions(|c| c.first_divergence_tokens),
            first_divergence_chars: positions(|c| c.first_divergence_chars),
            sampled_pairs: candidate.iter().filter(|c| !c.deterministic).count() as u64,
            sampled: Sampled::of(candidate),
            noise_sampled: (!secondary.is_empty()).then(|| Sampled::of(secondary)),
            length_ratio: Positions::of(candidate.iter().filter_map(|c| c.length_ratio).collect()),
            finish_equal: share(candidate, |c| c.finish_equal),
            noise_finish_equal: share(secondary, |c| c.finish_equal),
            close_pairs: 0,
            close_rate: None,
            kl_mean: None,
            verdict,
            reason,
            rule: ANSWERS_RULE,
        }
    }
}

impl Answers {
    /// With vLLM's rule between the copies' tokens (`shadow.logprobs`), over the
    /// deterministic pairs both copies answered with log-probabilities.
    pub fn with_close(mut self, closes: &[Close]) -> Answers {
        if !closes.is_empty() {
            let n = closes.len() as f64;
            self.close_pairs = closes.len() as u64;
            self.close_rate = Some(closes.iter().filter(|c| c.accepted).count() as f64 / n);
            let kls: Vec<f64> = closes.iter().filter_map(|c| c.kl).collect();
            self.kl_mean = (!kls.is_empty()).then(|| kls.iter().sum::<f64>() / kls.len() as f64);
        }
        self
    }
}

/// Bootstrap resamples for the ratio confidence intervals; 200 gives the 2.5th and 97.5th
/// percentiles to within a few resamples and costs milliseconds at the book's size.
const RESAMPLES: usize = 200;
/// Fixed, so the same pairs always give the same interval.
const SEED: u64 = 0x5EED_0A11;

/// One side of one mirrored request.
#[derive(Debug, Clone)]
pub struct Side {
    pub outcome: Outcome,
    /// `None` for client aborts and client errors (not judged).
    pub slo_met: Option<bool>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// The request's median inter-token gap.
    pub itl_ms: Option<f64>,
    pub output_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub mean: Option<f64>,
}

impl Percentiles {
    fn of(mut values: Vec<f64>) -> Percentiles {
        values.sort_by(f64::total_cmp);
        let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
        Percentiles {
            p50: nearest_rank(&values, 0.50),
            p90: nearest_rank(&values, 0.90),
            p95: nearest_rank(&values, 0.95),
            p99: nearest_rank(&values, 0.99),
            mean,
        }
    }
}

/// One side's numbers over the window.
#[derive(Debug, Clone, Serialize)]
pub struct SideStats {
    pub requests: u64,
    /// Met or missed (client aborts and client errors are not judged).
    pub judged: u64,
    pub met: u64,
    pub attainment: Option<f64>,
    /// Output tokens of requests that met their SLO, per second of the window.
    pub effective_goodput_tps: f64,
    /// Requests that met their SLO, per second of the window.
    pub request_goodput_rps: f64,
    /// `upstream_error`, `upstream_reset`, `timeout`, `proxy_error` over all requests.
    pub error_rate: Option<f64>,
    /// `rejected` over all requests.
    pub rejection_rate: Option<f64>,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    /// Over each request's median inter-token gap.
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub output_tokens: Percentiles,
}

impl SideStats {
    pub fn of<'a>(sides: impl Iterator<Item = &'a Side>, window_s: f64) -> SideStats {
        let sides: Vec<&Side> = sides.collect();
        let n = sides.len() as u64;
        let judged = sides.iter().filter(|s| s.slo_met.is_some()).count() as u64;
        let met: Vec<&&Side> = sides.iter().filter(|s| s.slo_met == Some(true)).collect();
        let effective: u64 = met.iter().filter_map(|s| s.output_tokens).sum();
        let rate = |k: usize| (n > 0).then(|| k as f64 / n as f64);
        let errors = sides.iter().filter(|s| is_error(s.outcome)).count();
        let rejections = sides
            .iter()
            .filter(|s| s.outcome == Outcome::Rejected)
            .count();
        let values = |f: &dyn Fn(&Side) -> Option<f64>| {
            Percentiles::of(sides.iter().filter_map(|s| f(s)).collect())
        };
        SideStats {
            requests: n,
            judged,
            met: met.len() as u64,
            attainment: (judged > 0).then(|| met.len() as f64 / judged as f64),
            effective_goodput_tps: effective as f64 / window_s.max(1e-9),
            request_goodput_rps: met.len() as f64 / window_s.max(1e-9),
            error_rate: rate(errors),
            rejection_rate: rate(rejections),
            ttft_ms: values(&|s| s.ttft_ms),
            tpot_ms: values(&|s| s.tpot_ms),
            itl_ms: values(&|s| s.itl_ms),
            e2e_ms: values(&|s| Some(s.e2e_ms)),
            output_tokens: values(&|s| s.output_tokens.map(|t| t as f64)),
        }
    }
}

/// The outcomes counted in an error rate (a rejection is counted apart).
fn is_error(o: Outcome) -> bool {
    matches!(
        o,
        Outcome::UpstreamError | Outcome::UpstreamReset | Outcome::Timeout | Outcome::ProxyError
    )
}

/// A statistic of the per-request ratios and its 95 % bootstrap interval.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Estimate {
    pub value: Option<f64>,
    /// 2.5th and 97.5th percentiles of the statistic over resamples of the pairs.
    pub ci95: Option<[f64; 2]>,
}

/// shadow / primary per request, over the requests both answered.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Ratio {
    pub pairs: usize,
    pub median: Estimate,
    pub p95: Estimate,
}

impl Ratio {
    pub fn of(ratios: Vec<f64>) -> Ratio {
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let (median, p95) = bootstrap(&ratios);
        Ratio {
            pairs: ratios.len(),
            median: Estimate {
                value: nearest_rank(&sorted, 0.5),
                ci95: median,
            },
            p95: Estimate {
                value: nearest_rank(&sorted, 0.95),
                ci95: p95,
            },
        }
    }
}

/// The bootstrap intervals of the median and the P95 of `values` (seeded).
fn bootstrap(values: &[f64]) -> (Option<[f64; 2]>, Option<[f64; 2]>) {
    if values.len() < 2 {
        return (None, None);
    }
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut sample = vec![0.0; values.len()];
    let (mut medians, mut p95s) = (Vec::with_capacity(RESAMPLES), Vec::with_capacity(RESAMPLES));
    for _ in 0..RESAMPLES {
        for slot in &mut sample {
            *slot = values[rng.random_range(0..values.len())];
        }
        sample.sort_by(f64::total_cmp);
        medians.extend(nearest_rank(&sample, 0.5));
        p95s.extend(nearest_rank(&sample, 0.95));
    }
    let interval = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        Some([nearest_rank(&v, 0.025)?, nearest_rank(&v, 0.975)?])
    };
    (interval(medians), interval(p95s))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    Insufficient,
}

/// What the verdict is held to, from the class's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Bar {
    pub attainment: f64,
    pub error_rate_max: Option<f64>,
    pub min_pairs: u64,
}

/// The verdict over `pairs` (primary, shadow) and why, per [`RULE`].
pub fn verdict(pairs: &[(&Side, &Side)], bar: Bar) -> (Verdict, String) {
    let judged: Vec<&Side> = pairs
        .iter()
        .filter(|(p, s)| p.slo_met.is_some() && s.slo_met.is_some())
        .map(|(_, s)| *s)
        .collect();
    let n = judged.len() as u64;
    if n < bar.min_pairs {
        return (
            Verdict::Insufficient,
            format!("{n} judged pairs, {} needed", bar.min_pairs),
        );
    }
    let met = judged.iter().filter(|s| s.slo_met == Some(true)).count();
    let attainment = met as f64 / n as f64;
    if attainment < bar.attainment {
        return (
            Verdict::Fail,
            format!(
                "shadow attainment {attainment:.4} over {n} pairs is below the target {}",
                bar.attainment
            ),
        );
    }
    if let Some(max) = bar.error_rate_max {
        let errors = pairs.iter().filter(|(_, s)| is_error(s.outcome)).count();
        let rate = errors as f64 / pairs.len() as f64;
        if rate > max {
            return (
                Verdict::Fail,
                format!("shadow error rate {rate:.4} is above error_rate_max {max}"),
            );
        }
    }
    (
        Verdict::Pass,
        format!(
            "shadow attainment {attainment:.4} over {n} pairs meets the target {}",
            bar.attainment
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(met: Option<bool>, ttft: f64, outcome: Outcome) -> Side {
        Side {
            outcome,
            slo_met: met,
            ttft_ms: Some(ttft),
            tpot_ms: Some(ttft / 10.0),
            e2e_ms: ttft * 2.0,
            itl_ms: Some(1.0),
            output_tokens: Some(10),
        }
    }

    const BAR: Bar = Bar {
        attainment: 0.9,
        error_rate_max: Some(0.05),
        min_pairs: 3,
    };

    #[test]
    fn the_verdict_follows_its_rule() {
        let ok = side(Some(true), 30.0, Outcome::Ok);
        let slow = side(Some(false), 600.0, Outcome::Ok);
        let gone = side(None, 30.0, Outcome::ClientAbort);
        let failed = side(Some(false), 30.0, Outcome::UpstreamError);
        // Too few pairs judged on both sides: the aborted ones do not count.
        let few = [(&ok, &ok), (&ok, &ok), (&gone, &ok)];
        assert_eq!(verdict(&few, BAR).0, Verdict::Insufficient);
        let good = [(&ok, &ok); 10];
        assert_eq!(verdict(&good, BAR).0, Verdict::Pass);
        let bad: Vec<_> = (0..10).map(|_| (&ok, &slow)).collect();
        let (v, why) = verdict(&bad, BAR);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("0.0000"), "{why}");
        // Attainment holds at 0.9, but the errors are above error_rate_max.
        let mut mixed = vec![(&ok, &ok); 9];
        mixed.push((&ok, &failed));
        assert_eq!(verdict(&mixed, BAR).0, Verdict::Fail);
    }

    #[test]
    fn side_stats_count_what_the_definitions_say() {
        let sides = [
            side(Some(true), 30.0, Outcome::Ok),
            side(Some(false), 600.0, Outcome::Ok),
            side(Some(false), 30.0, Outcome::Rejected),
            side(None, 30.0, Outcome::ClientAbort),
        ];
        let s = SideStats::of(sides.iter(), 10.0);
        assert_eq!((s.requests, s.judged, s.met), (4, 3, 1));
        assert_eq!(s.attainment, Some(1.0 / 3.0));
        assert_eq!(s.effective_goodput_tps, 1.0);
        assert_eq!(s.rejection_rate, Some(0.25));
        assert_eq!(s.error_rate, Some(0.0));
        assert_eq!(s.ttft_ms.p99, Some(600.0));
    }

    #[test]
    fn ratio_intervals_are_seeded_and_cover_the_estimate() {
        let ratios: Vec<f64> = (1..=100).map(|i| f64::from(i) / 10.0).collect();
        let a = Ratio::of(ratios.clone());
        let b = Ratio::of(ratios);
        assert_eq!(a.median.value, Some(5.0));
        assert_eq!(a.p95.value, Some(9.5));
        let Some([lo, hi]) = a.median.ci95 else {
            panic!("an interval")
        };
        assert!(lo <= 5.0 && 5.0 <= hi && lo < hi);
        assert_eq!(a.median.ci95, b.median.ci95);
        assert!(Ratio::of(vec![2.0]).median.ci95.is_none());
    }
}
