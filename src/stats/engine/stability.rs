//! Stability over time: for each window length W, a series of consecutive W-long intervals
//! kept for `history` (6h of 1m intervals = 360 points), per class and overall. A point is
//! closed when time moves past its interval (on the next observation, in-flight sample or
//! [`Engine::advance`]), from the slices still in the ring, and keeps scalars only (about
//! 70 bytes), so the series costs little next to the windows themselves.
//!
//! From a series the summary derives:
//! - `throughput_drift`: the least-squares line through the per-interval throughput, its
//!   change from the first to the last point divided by the mean throughput (+0.2 = the
//!   trend rose by 20% of the mean over the history); robust to a noisy endpoint.
//! - `p99_ttft_jitter`: the coefficient of variation (population σ / mean) of the
//!   per-interval P99 TTFT, over intervals that had TTFT samples.
//!
//! A record that arrives after its interval was closed still counts in the sliding window
//! but not in the closed point.

use std::{collections::VecDeque, time::Instant};

use serde::Serialize;

use super::{
    Engine,
    hist::{Merged, Percentiles},
    slice::Counts,
    summary::per_s,
};

/// Upper bound on points per series, whatever `history / window` says.
pub const MAX_POINTS: usize = 2048;

/// One closed interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Interval number (interval i covers slices i·n .. (i+1)·n).
    interval: u64,
    /// Seconds the interval covered.
    duration_s: f64,
    requests: u64,
    met: u64,
    missed: u64,
    output_tokens: u64,
    met_tokens: u64,
    p99_ttft_ms: Option<f64>,
}

/// A bounded series of closed intervals.
#[derive(Debug, Default)]
pub struct Series {
    points: VecDeque<Point>,
}

impl Series {
    fn push(&mut self, p: Point, cap: usize) {
        if cap == 0 {
            return;
        }
        while self.points.len() >= cap {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    /// Keeps the newest `cap` points.
    pub fn trim(&mut self, cap: usize) {
        let excess = self.points.len().saturating_sub(cap);
        self.points.drain(..excess);
    }

    pub fn heap_bytes(&self) -> usize {
        self.points.capacity() * std::mem::size_of::<Point>()
    }
}

fn point(interval: u64, duration_s: f64, c: &Counts, ttft: &Merged) -> Point {
    Point {
        interval,
        duration_s,
        requests: c.requests,
        met: c.met,
        missed: c.missed,
        output_tokens: c.output_tokens,
        met_tokens: c.met_tokens,
        p99_ttft_ms: ttft.quantile_ms(0.99),
    }
}

impl Engine {
    /// Closes intervals `from .. to` of window `w` (only the last `series_cap` of them:
    /// older ones would be evicted at once).
    pub(super) fn close_intervals(&mut self, w: usize, from: u64, to: u64) {
        let Some(epoch) = self.epoch else { return };
        let Some(win) = self.windows.get_mut(w) else {
            return;
        };
        let (g, cap) = (win.geom, win.series_cap);
        let from = from.max(to.saturating_sub(cap as u64));
        for interval in from..to {
            let lo = interval.saturating_mul(g.n);
            let hi = lo.saturating_add(g.n - 1);
            let start = g.start(epoch, lo);
            let end = g.start(epoch, hi.saturating_add(1));
            let secs = end.saturating_duration_since(start).as_secs_f64();
            let (mut all, mut all_ttft) = (Counts::default(), Merged::default());
            for class in &mut self.classes {
                let (Some(Some(ring)), Some(series)) =
                    (class.rings.get(w), class.series.get_mut(w))
                else {
                    continue;
                };
                let (mut c, mut ttft) = (Counts::default(), Merged::default());
                for s in ring.range(lo, hi) {
                    c.add(&s.counts);
                    ttft.add(&s.ttft);
                }
                series.push(point(interval, secs, &c, &ttft), cap);
                all.add(&c);
                all_ttft.add_merged(&ttft);
            }
            win.series.push(point(interval, secs, &all, &all_ttft), cap);
        }
    }
}

/// The stability block of a summary object.
#[derive(Debug, Clone, Serialize)]
pub struct Stability {
    /// Length of each interval (the window's).
    pub interval: String,
    /// Closed intervals, oldest first.
    pub points: Vec<PointOut>,
    pub throughput_drift: Option<f64>,
    pub p99_ttft_jitter: Option<f64>,
    /// TTFT of short-input requests (first input bucket) that arrived while a long-input
    /// request was in flight, over the summary window.
    pub short_ttft_with_long_in_flight: Percentiles,
    /// The same for short-input requests that arrived with no long one in flight.
    pub short_ttft_without: Percentiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct PointOut {
    /// Seconds between the interval's end and the summary's `now`.
    pub ended_s_ago: f64,
    pub duration_s: f64,
    pub requests: u64,
    pub throughput_tokens_per_s: f64,
    pub effective_goodput_tokens_per_s: f64,
    pub attainment: Option<f64>,
    pub p99_ttft_ms: Option<f64>,
}

/// Builds the block; `interval_end(i)` is when interval `i` ended.
pub fn stability(
    label: &str,
    series: &Series,
    interval_end: impl Fn(u64) -> Instant,
    now: Instant,
    short: (&Merged, &Merged),
) -> Stability {
    let points: Vec<PointOut> = series
        .points
        .iter()
        .map(|p| PointOut {
            ended_s_ago: now
                .saturating_duration_since(interval_end(p.interval))
                .as_secs_f64(),
            duration_s: p.duration_s,
            requests: p.requests,
            throughput_tokens_per_s: per_s(p.output_tokens, p.duration_s),
            effective_goodput_tokens_per_s: per_s(p.met_tokens, p.duration_s),
            attainment: super::slice::ratio(p.met, p.met.saturating_add(p.missed)),
            p99_ttft_ms: p.p99_ttft_ms,
        })
        .collect();
    let throughput: Vec<f64> = points.iter().map(|p| p.throughput_tokens_per_s).collect();
    let p99s: Vec<f64> = points.iter().filter_map(|p| p.p99_ttft_ms).collect();
    Stability {
        interval: label.to_owned(),
        throughput_drift: drift(&throughput),
        p99_ttft_jitter: coefficient_of_variation(&p99s),
        points,
        short_ttft_with_long_in_flight: short.0.percentiles(),
        short_ttft_without: short.1.percentiles(),
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// Least-squares change over the series relative to its mean; `None` for fewer than two
/// points or a zero mean.
pub fn drift(ys: &[f64]) -> Option<f64> {
    let n = ys.len();
    let my = mean(ys).filter(|m| *m > 0.0 && n >= 2)?;
    let mx = (n - 1) as f64 / 2.0;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - mx;
        sxy += dx * (y - my);
        sxx += dx * dx;
    }
    let slope = sxy / sxx;
    Some(slope * (n - 1) as f64 / my).filter(|d| d.is_finite())
}

/// Population σ / mean; `None` for fewer than two values or a zero mean.
pub fn coefficient_of_variation(xs: &[f64]) -> Option<f64> {
    let m = mean(xs).filter(|m| *m > 0.0 && xs.len() >= 2)?;
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64;
    Some(var.sqrt() / m).filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_of_a_line_is_its_relative_change() {
        // 10 → 20 over the series; mean 15; change 10 → 10/15.
        let d = drift(&[10.0, 12.5, 15.0, 17.5, 20.0]).unwrap();
        assert!((d - 10.0 / 15.0).abs() < 1e-12);
        assert_eq!(drift(&[5.0, 5.0, 5.0]), Some(0.0));
        assert_eq!(drift(&[5.0]), None);
        assert_eq!(drift(&[0.0, 0.0]), None);
    }

    #[test]
    fn jitter_is_the_coefficient_of_variation() {
        // mean 100, population σ 20.
        let cv = coefficient_of_variation(&[80.0, 120.0, 80.0, 120.0]).unwrap();
        assert!((cv - 0.2).abs() < 1e-12);
        assert_eq!(coefficient_of_variation(&[100.0]), None);
    }

    #[test]
    fn series_is_bounded() {
        let mut s = Series::default();
        let p = point(0, 60.0, &Counts::default(), &Merged::default());
        for i in 0..10 {
            s.push(Point { interval: i, ..p }, 4);
        }
        assert_eq!(
            s.points.iter().map(|p| p.interval).collect::<Vec<_>>(),
            [6, 7, 8, 9]
        );
        s.push(p, 0);
        assert_eq!(s.points.len(), 4);
    }
}
