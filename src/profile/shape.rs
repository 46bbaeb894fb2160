//! The *shape* of some traffic: what `summarize` prints and what drift detection compares.
//! Built from [`Sample`]s, which come from profile files ([`samples_of`]) or from the live
//! window ([`super::drift::Monitor`]), so both sides are measured the same way.

use std::collections::BTreeMap;

use super::{
    read::{BlockId, Loaded, Profile},
    sorted::{SortError, Sorted, Span},
    stats::{self, Counts},
    table::BlockSet,
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
    let mut seen = BlockSet::default();
    profile
        .entries
        .iter()
        .zip(identities)
        .filter_map(|(l, ids)| sample_of(l, &ids, &mut seen))
        .collect()
}

/// One request as a sample, `None` unless it is generation traffic: only that is
/// profiled; older files may hold scrapes and probes (`api` unknown), which would shift
/// every shape and drift statistic. `seen`: the blocks of the requests before it.
pub fn sample_of(l: &Loaded, ids: &[BlockId], seen: &mut BlockSet) -> Option<Sample> {
    let e = &l.entry;
    if !crate::decode::is_generation_label(&e.api) {
        return None;
    }
    let reused = ids.iter().filter(|id| !seen.insert(**id)).count();
    Some(Sample {
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
    })
}

/// The shape of profile files read in arrival order ([`Sorted`]), one request at a
/// time: the same [`Shape`] as `Shape::of(&samples_of(..), None)`, bit for bit (sums are
/// taken in the same order), holding counts instead of samples. Memory: the distinct
/// lengths, the distinct prompt blocks (for prefix reuse) and the keys the reader keeps.
pub fn shape_of_sorted(sorted: &Sorted) -> Result<Shape, SortError> {
    let span = sorted.generation();
    let linked = sorted.profile().common_salt_id().is_some();
    let mut seen = BlockSet::default();
    let mut acc = Accumulator::new(span);
    sorted.for_each(&mut |profile, l| {
        let ids = profile.compact_identities_of(&l, linked);
        if let Some(s) = sample_of(&l, &ids, &mut seen) {
            acc.push(&s);
        }
        Ok::<_, SortError>(())
    })?;
    Ok(acc.finish())
}

/// A [`Shape`] under construction from samples in arrival order.
struct Accumulator {
    n: usize,
    span_ms: i64,
    /// The mean gap between arrivals, known ahead from the span (the gaps add up to it
    /// exactly), so their variance is summed in one pass in the order `stats::cv` sums.
    mean_gap: f64,
    prev: Option<i64>,
    gap_sq: f64,
    second: Option<(i64, u64)>,
    peak: u64,
    input: BTreeMap<u64, u64>,
    output: BTreeMap<u64, u64>,
    models: BTreeMap<String, u64>,
    apis: BTreeMap<String, u64>,
    outcomes: BTreeMap<String, u64>,
    streamed: usize,
    blocks: u64,
    reused: u64,
    e2e_ms: f64,
    slo_met: u64,
    slo_missed: u64,
}

impl Accumulator {
    fn new(span: Span) -> Accumulator {
        let gaps = span.count.saturating_sub(1);
        Accumulator {
            n: 0,
            span_ms: span.last - span.first,
            mean_gap: (span.last - span.first) as f64 / gaps.max(1) as f64,
            prev: None,
            // `Iterator::sum` of floats starts from -0.0.
            gap_sq: -0.0,
            second: None,
            peak: 0,
            input: BTreeMap::new(),
            output: BTreeMap::new(),
            models: BTreeMap::new(),
            apis: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            streamed: 0,
            blocks: 0,
            reused: 0,
            e2e_ms: -0.0,
            slo_met: 0,
            slo_missed: 0,
        }
    }

    fn push(&mut self, s: &Sample) {
        self.n += 1;
        if let Some(prev) = self.prev {
            self.gap_sq += ((s.at_ms - prev) as f64 - self.mean_gap).powi(2);
        }
        self.prev = Some(s.at_ms);
        let sec = s.at_ms.div_euclid(1000);
        self.second = match self.second {
            Some((cur, k)) if cur == sec => Some((cur, k + 1)),
            _ => Some((sec, 1)),
        };
        if let Some((_, k)) = self.second {
            self.peak = self.peak.max(k);
        }
        for (v, m) in [(s.input, &mut self.input), (s.output, &mut self.output)] {
            if let Some(v) = v {
                *m.entry(v).or_insert(0) += 1;
            }
        }
        for (k, m) in [
            (&s.model, &mut self.models),
            (&s.api, &mut self.apis),
            (&s.outcome, &mut self.outcomes),
        ] {
            match m.get_mut(k) {
                Some(c) => *c += 1,
                None => {
                    m.insert(k.clone(), 1);
                }
            }
        }
        self.streamed += usize::from(s.stream);
        self.blocks += u64::from(s.blocks);
        self.reused += u64::from(s.reused);
        self.e2e_ms += s.e2e_ms.max(0.0);
        match s.slo_met {
            Some(true) => self.slo_met += 1,
            Some(false) => self.slo_missed += 1,
            None => {}
        }
    }

    fn finish(self) -> Shape {
        let n = self.n;
        let duration_s = (self.span_ms as f64 / 1000.0).max(1.0);
        let gaps = n.saturating_sub(1);
        let burstiness = (gaps >= 2 && self.mean_gap > 0.0)
            .then(|| (self.gap_sq / gaps as f64).sqrt() / self.mean_gap);
        Shape {
            requests: n,
            duration_s,
            rate_mean: n as f64 / duration_s,
            rate_peak: self.peak,
            burstiness,
            input: Counts::from_map(&self.input),
            output: Counts::from_map(&self.output),
            models: self.models,
            apis: self.apis,
            stream_share: if n == 0 {
                0.0
            } else {
                self.streamed as f64 / n as f64
            },
            prefix_reuse: (self.blocks > 0).then(|| self.reused as f64 / self.blocks as f64),
            concurrency: (n > 0).then(|| self.e2e_ms / 1000.0 / duration_s),
            outcomes: self.outcomes,
            slo_met: self.slo_met,
            slo_missed: self.slo_missed,
        }
    }
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
    /// Input lengths (one count per distinct length).
    pub input: Counts,
    /// Output lengths.
    pub output: Counts,
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
            Counts::from_sorted(&v)
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
