//! The *shape* of some traffic: what `summarize` prints and what drift detection compares.
//! Built from [`Sample`]s, which come from profile files ([`samples_of`]) or from the live
//! window ([`super::drift::Monitor`]), so both sides are measured the same way.

use std::collections::{BTreeMap, HashSet};

use super::{
    read::{BlockId, Profile},
    stats,
};

/// One request, reduced to what shapes are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Arrival, Unix ms.
    pub at_ms: i64,
    pub model: String,
    pub api: String,
    pub stream: bool,
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub e2e_ms: f64,
    /// Prompt blocks, and how many of them had been seen before (prefix reuse).
    pub blocks: u32,
    pub reused: u32,
    pub outcome: String,
    pub slo_met: Option<bool>,
}

/// Samples of a profile, in arrival order; a block counts as reused when the same block
/// (by [`Profile::block_identities`]) arrived earlier in the profile.
pub fn samples_of(profile: &Profile) -> Vec<Sample> {
    let identities = profile.block_identities();
    let mut seen: HashSet<BlockId> = HashSet::new();
    profile
        .entries
        .iter()
        .zip(identities)
        // Only generation traffic is profiled; older files may hold scrapes and probes
        // (`api` unknown), which would shift every shape and drift statistic.
        .filter(|(l, _)| crate::decode::is_generation_label(&l.entry.api))
        .map(|(l, ids)| {
            let reused = ids.iter().filter(|id| !seen.insert(**id)).count();
            let e = &l.entry;
            Sample {
                at_ms: l.at_ms,
                model: e.model.clone().unwrap_or_else(|| "unknown".into()),
                api: e.api.clone(),
                stream: e.stream,
                input: e.input_tokens,
                output: e.output_tokens,
                e2e_ms: e.e2e_ms,
                blocks: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                reused: u32::try_from(reused).unwrap_or(u32::MAX),
                outcome: e.outcome.clone(),
                slo_met: e.slo_met,
            }
        })
        .collect()
}

/// Distributions and rates of a set of samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    pub requests: usize,
    /// Seconds covered: first to last arrival, or the live window.
    pub duration_s: f64,
    pub rate_mean: f64,
    /// Most arrivals within one wall-clock second.
    pub rate_peak: u64,
    pub burstiness: Option<f64>,
    /// Sorted.
    pub input: Vec<f64>,
    /// Sorted.
    pub output: Vec<f64>,
    pub models: BTreeMap<String, u64>,
    pub apis: BTreeMap<String, u64>,
    pub stream_share: f64,
    /// Share of prompt blocks seen before; `None` without hash_ids.
    pub prefix_reuse: Option<f64>,
    /// Time-averaged requests in flight (Σ e2e / duration).
    pub concurrency: Option<f64>,
    pub outcomes: BTreeMap<String, u64>,
    pub slo_met: u64,
    pub slo_missed: u64,
}

impl Shape {
    /// `window_s`: the duration to rate over when known (a live window); otherwise the
    /// span of the arrivals (at least one second).
    pub fn of(samples: &[Sample], window_s: Option<f64>) -> Shape {
        let mut arrivals: Vec<i64> = samples.iter().map(|s| s.at_ms).collect();
        arrivals.sort_unstable();
        let span_s = match (arrivals.first(), arrivals.last()) {
            (Some(a), Some(b)) => (b - a) as f64 / 1000.0,
            _ => 0.0,
        };
        let duration_s = window_s.unwrap_or(span_s).max(1.0);
        let mut per_second: BTreeMap<i64, u64> = BTreeMap::new();
        for a in &arrivals {
            *per_second.entry(a.div_euclid(1000)).or_insert(0) += 1;
        }
        let sorted = |f: fn(&Sample) -> Option<u64>| {
            let mut v: Vec<f64> = samples.iter().filter_map(f).map(|n| n as f64).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let count = |f: fn(&Sample) -> &str| {
            let mut m = BTreeMap::new();
            for s in samples {
                *m.entry(f(s).to_owned()).or_insert(0) += 1;
            }
            m
        };
        let blocks: u64 = samples.iter().map(|s| u64::from(s.blocks)).sum();
        let reused: u64 = samples.iter().map(|s| u64::from(s.reused)).sum();
        let n = samples.len();
        Shape {
            requests: n,
            duration_s,
            rate_mean: n as f64 / duration_s,
            rate_peak: per_second.values().copied().max().unwrap_or(0),
            burstiness: stats::interarrival_cv(&arrivals),
            input: sorted(|s| s.input),
            output: sorted(|s| s.output),
            models: count(|s| &s.model),
            apis: count(|s| &s.api),
            stream_share: if n == 0 {
                0.0
            } else {
                samples.iter().filter(|s| s.stream).count() as f64 / n as f64
            },
            prefix_reuse: (blocks > 0).then(|| reused as f64 / blocks as f64),
            concurrency: (n > 0).then(|| {
                samples.iter().map(|s| s.e2e_ms.max(0.0)).sum::<f64>() / 1000.0 / duration_s
            }),
            outcomes: count(|s| &s.outcome),
            slo_met: samples.iter().filter(|s| s.slo_met == Some(true)).count() as u64,
            slo_missed: samples.iter().filter(|s| s.slo_met == Some(false)).count() as u64,
        }
    }

    /// Share of judged requests that met their SLO.
    pub fn attainment(&self) -> Option<f64> {
        let judged = self.slo_met + self.slo_missed;
        (judged > 0).then(|| self.slo_met as f64 / judged as f64)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(at_ms: i64, input: u64, output: u64) -> Sample {
        Sample {
            at_ms,
            model: "m".into(),
            api: "chat_completions".into(),
            stream: true,
            input: Some(input),
            output: Some(output),
            e2e_ms: 500.0,
            blocks: 0,
            reused: 0,
            outcome: "ok".into(),
            slo_met: Some(true),
        }
    }

    #[test]
    fn rates_spans_and_concurrency() {
        let samples: Vec<Sample> = (0..10).map(|i| sample(i * 100, 10, 20)).collect();
        let s = Shape::of(&samples, None);
        assert_eq!(s.requests, 10);
        assert_eq!(s.duration_s, 1.0); // 0.9 s span, floored at 1 s
        assert_eq!(s.rate_peak, 10);
        assert_eq!(s.burstiness, Some(0.0));
        assert_eq!(s.concurrency, Some(5.0));
        assert_eq!(s.attainment(), Some(1.0));
        let w = Shape::of(&samples, Some(10.0));
        assert_eq!(w.rate_mean, 1.0);
        assert!(Shape::of(&[], None).concurrency.is_none());
    }
}
