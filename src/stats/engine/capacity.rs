//! Capacity from live traffic: every request is attributed to the in-flight concurrency it
//! started at (`concurrency_at_start`, itself included), bucketed into levels, over the
//! longest configured window (levels need samples; short windows rarely have enough).
//!
//! Levels: exact 1..=16, then ranges 17–24, 25–32, 33–48, ... 769–1024, then one open
//! level above 1024. A level is reported by its lowest concurrency, so a range that is
//! stable yields the conservative number.
//!
//! Per level: samples (requests with a verdict), attainment, P95 TTFT and TPOT, and a
//! throughput estimate. Throughput is Little's law: a request at level c delivered its
//! tokens over its e2e time while c requests were in flight, so the system rate is
//! `mean concurrency × Σ output tokens / Σ e2e seconds` over the level's requests (ratio of
//! sums, so long requests weigh by their duration, and errors that produced nothing pull it
//! down as they should).
//!
//! `max_stable_concurrency` walks the levels upward, skipping those with fewer than
//! `min_samples` samples, and stops at the first one that misses the attainment target: the
//! answer is the last level before that. A high level that happens to look good after a
//! failing one is a lucky point, not capacity: the service fell out of its SLO on the way
//! there, and load arrives by passing through the lower levels.
//!
//! `knee`: over the same levels with enough samples, the initial slope is the first
//! level's throughput / concurrency (from the origin). Walking upward, the knee is the last
//! level before one whose marginal throughput gain per added concurrency falls below
//! [`KNEE_SLOPE_FRACTION`] of that initial slope, or (classes only) that violates one of the
//! class's TTFT/TPOT percentile targets. Beyond the knee, more concurrency buys latency,
//! not throughput.
//!
//! `overall` pools the classes; its target is the traffic-weighted class target at each
//! level (misses allowed = Σ samples × (1 − target) over classes), so it holds whenever
//! every class holds, but one class can hide behind another: the class views are the
//! authoritative ones. The overall knee uses the throughput rule only.

use super::{
    config::{LatencyMetric, Observation, PercentileTarget},
    hist::{Hist, Merged},
    ring::{Ring, Slice},
    slice::ratio,
};

/// Slices of the capacity window (coarser than the sliding windows: capacity is a slow view
/// and each slice holds two histograms per level).
pub const CAPACITY_SLICES: u64 = 6;
/// The knee is where the marginal throughput gain falls below this share of the initial.
pub const KNEE_SLOPE_FRACTION: f64 = 0.5;
/// Exact levels 1..=EXACT_LEVELS.
const EXACT_LEVELS: u32 = 16;
/// Upper bounds of the ranges above the exact levels (roughly ×1.5 / ×1.33 steps).
const RANGE_BOUNDS: [u32; 12] = [24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024];
/// Number of levels: exact, ranges, and one open level above the last bound.
pub const LEVELS: usize = EXACT_LEVELS as usize + RANGE_BOUNDS.len() + 1;
/// Attainment comparisons tolerate float rounding (99/100 against a 0.99 target).
const EPS: f64 = 1e-9;

/// The level a concurrency falls in (0 counts as 1).
pub fn level_of(concurrency: u32) -> usize {
    let c = concurrency.max(1);
    if c <= EXACT_LEVELS {
        return (c - 1) as usize;
    }
    let range = RANGE_BOUNDS
        .iter()
        .position(|&b| c <= b)
        .unwrap_or(RANGE_BOUNDS.len());
    EXACT_LEVELS as usize + range
}

/// Lowest and highest concurrency of a level (`None` = open-ended).
pub fn level_bounds(level: usize) -> (u32, Option<u32>) {
    let exact = EXACT_LEVELS as usize;
    if level < exact {
        let c = level as u32 + 1;
        return (c, Some(c));
    }
    let j = level - exact;
    let lo = match j.checked_sub(1).and_then(|p| RANGE_BOUNDS.get(p)) {
        Some(prev) => prev + 1,
        None if j == 0 => EXACT_LEVELS + 1,
        None => u32::MAX,
    };
    (lo, RANGE_BOUNDS.get(j).copied())
}

/// One level in one slice.
#[derive(Debug, Default)]
pub struct LevelStats {
    requests: u64,
    met: u64,
    missed: u64,
    concurrency_sum: u64,
    tokens: u64,
    busy_s: f64,
    ttft: Hist,
    tpot: Hist,
}

/// One class's levels in one slice of the capacity window.
#[derive(Debug)]
pub struct CapSlice {
    levels: Vec<LevelStats>,
}

impl CapSlice {
    pub fn new() -> CapSlice {
        CapSlice {
            levels: (0..LEVELS).map(|_| LevelStats::default()).collect(),
        }
    }

    pub fn record(&mut self, obs: &Observation<'_>) {
        let Some(l) = self.levels.get_mut(level_of(obs.concurrency_at_start)) else {
            return;
        };
        l.requests = l.requests.saturating_add(1);
        match obs.slo_met {
            Some(true) => l.met = l.met.saturating_add(1),
            Some(false) => l.missed = l.missed.saturating_add(1),
            None => {}
        }
        l.concurrency_sum = l
            .concurrency_sum
            .saturating_add(u64::from(obs.concurrency_at_start.max(1)));
        if let Some(tokens) = obs.output_tokens
            && obs.e2e_ms.is_finite()
            && obs.e2e_ms > 0.0
        {
            l.tokens = l.tokens.saturating_add(tokens);
            l.busy_s += obs.e2e_ms / 1000.0;
        }
        if let Some(v) = obs.ttft_ms {
            l.ttft.record_ms(v);
        }
        if let Some(v) = obs.tpot_ms {
            l.tpot.record_ms(v);
        }
    }
}

impl Slice for CapSlice {
    fn reset(&mut self) {
        for l in &mut self.levels {
            let (mut ttft, mut tpot) = (std::mem::take(&mut l.ttft), std::mem::take(&mut l.tpot));
            ttft.reset();
            tpot.reset();
            *l = LevelStats {
                ttft,
                tpot,
                ..LevelStats::default()
            };
        }
    }
    fn heap_bytes(&self) -> usize {
        let own = self.levels.capacity() * std::mem::size_of::<LevelStats>();
        own + self
            .levels
            .iter()
            .map(|l| l.ttft.heap_bytes() + l.tpot.heap_bytes())
            .sum::<usize>()
    }
}

/// One level summed over the window (and, for overall, over classes).
#[derive(Debug, Default)]
pub struct LevelAgg {
    pub requests: u64,
    pub met: u64,
    pub missed: u64,
    /// Σ samples × target over the classes summed in (the weighted target's numerator).
    pub target_weight: f64,
    pub concurrency_sum: u64,
    pub tokens: u64,
    pub busy_s: f64,
    pub ttft: Merged,
    pub tpot: Merged,
}

impl LevelAgg {
    pub fn samples(&self) -> u64 {
        self.met.saturating_add(self.missed)
    }

    pub fn meets_target(&self) -> Option<bool> {
        let att = ratio(self.met, self.samples())?;
        Some(att + EPS >= self.target_weight / self.samples() as f64)
    }

    pub fn mean_concurrency(&self) -> Option<f64> {
        ratio(self.concurrency_sum, self.requests)
    }

    pub fn throughput(&self) -> Option<f64> {
        let busy = Some(self.busy_s).filter(|b| *b > 0.0 && b.is_finite())?;
        Some(self.mean_concurrency()? * self.tokens as f64 / busy)
    }

    fn add(&mut self, o: &LevelAgg) {
        self.requests = self.requests.saturating_add(o.requests);
        self.met = self.met.saturating_add(o.met);
        self.missed = self.missed.saturating_add(o.missed);
        self.target_weight += o.target_weight;
        self.concurrency_sum = self.concurrency_sum.saturating_add(o.concurrency_sum);
        self.tokens = self.tokens.saturating_add(o.tokens);
        self.busy_s += o.busy_s;
        self.ttft.add_merged(&o.ttft);
        self.tpot.add_merged(&o.tpot);
    }

    fn latency_ok(&self, targets: &[PercentileTarget]) -> bool {
        targets.iter().all(|t| {
            let h = match t.metric {
                LatencyMetric::Ttft => &self.ttft,
                LatencyMetric::Tpot => &self.tpot,
                LatencyMetric::Itl | LatencyMetric::E2e => return true,
            };
            h.quantile_ms(t.quantile).is_none_or(|v| v <= t.max_ms)
        })
    }
}

/// A class's levels over slices `lo ..= hi`; histograms are merged only when `latency`.
pub fn collect(
    ring: &Ring<CapSlice>,
    lo: u64,
    hi: u64,
    target: f64,
    latency: bool,
) -> Vec<LevelAgg> {
    let mut out = empty_levels();
    for slice in ring.range(lo, hi) {
        for (a, l) in out.iter_mut().zip(&slice.levels) {
            a.requests = a.requests.saturating_add(l.requests);
            a.met = a.met.saturating_add(l.met);
            a.missed = a.missed.saturating_add(l.missed);
            a.concurrency_sum = a.concurrency_sum.saturating_add(l.concurrency_sum);
            a.tokens = a.tokens.saturating_add(l.tokens);
            a.busy_s += l.busy_s;
            if latency {
                a.ttft.add(&l.ttft);
                a.tpot.add(&l.tpot);
            }
        }
    }
    for a in &mut out {
        a.target_weight = a.samples() as f64 * target;
    }
    out
}

/// Sums class levels into pooled ones.
pub fn pool(into: &mut [LevelAgg], levels: &[LevelAgg]) {
    for (a, l) in into.iter_mut().zip(levels) {
        a.add(l);
    }
}

/// Σ samples × target / Σ samples over all levels; `None` without samples.
pub fn weighted_target(levels: &[LevelAgg]) -> Option<f64> {
    let samples: u64 = levels.iter().map(LevelAgg::samples).sum();
    let weight: f64 = levels.iter().map(|l| l.target_weight).sum();
    (samples > 0).then(|| weight / samples as f64)
}

pub fn empty_levels() -> Vec<LevelAgg> {
    (0..LEVELS).map(|_| LevelAgg::default()).collect()
}

/// Levels with at least `min_samples` samples (and at least one), ascending.
fn eligible(levels: &[LevelAgg], min_samples: u64) -> impl Iterator<Item = (usize, &LevelAgg)> {
    levels
        .iter()
        .enumerate()
        .filter(move |(_, l)| l.samples() >= min_samples.max(1))
}

/// Index of the max stable level (see the module doc).
pub fn max_stable(levels: &[LevelAgg], min_samples: u64) -> Option<usize> {
    let mut best = None;
    for (i, l) in eligible(levels, min_samples) {
        if l.meets_target() != Some(true) {
            break;
        }
        best = Some(i);
    }
    best
}

pub fn max_stable_concurrency(levels: &[LevelAgg], min_samples: u64) -> Option<u32> {
    max_stable(levels, min_samples).map(|i| level_bounds(i).0)
}

/// Index of the knee (see the module doc). `targets` are the class's percentile targets
/// (empty for overall).
pub fn knee(levels: &[LevelAgg], min_samples: u64, targets: &[PercentileTarget]) -> Option<usize> {
    let mut pts = eligible(levels, min_samples).filter_map(|(i, l)| {
        Some((
            i,
            l.mean_concurrency()?,
            l.throughput()?,
            l.latency_ok(targets),
        ))
    });
    let (first, c0, t0, ok0) = pts.next()?;
    if !ok0 {
        return None;
    }
    let initial = t0 / c0;
    let (mut knee, mut prev) = (first, (c0, t0));
    for (i, c, t, ok) in pts {
        let marginal = (t - prev.1) / (c - prev.0);
        if !ok || marginal.is_nan() || marginal < KNEE_SLOPE_FRACTION * initial {
            break;
        }
        (knee, prev) = (i, (c, t));
    }
    Some(knee)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_exact_then_ranges() {
        assert_eq!(level_of(0), 0);
        assert_eq!(level_of(1), 0);
        assert_eq!(level_of(16), 15);
        assert_eq!((level_of(17), level_of(24), level_of(25)), (16, 16, 17));
        assert_eq!(level_of(1024), LEVELS - 2);
        assert_eq!(level_of(u32::MAX), LEVELS - 1);
        assert_eq!(level_bounds(0), (1, Some(1)));
        assert_eq!(level_bounds(16), (17, Some(24)));
        assert_eq!(level_bounds(17), (25, Some(32)));
        assert_eq!(level_bounds(LEVELS - 1), (1025, None));
        for c in [1, 9, 17, 30, 100, 1000, 5000] {
            let (lo, hi) = level_bounds(level_of(c));
            assert!(lo <= c && hi.is_none_or(|hi| c <= hi), "{c}");
        }
    }
}
