//! Latency distributions. Values are microseconds in an HDR histogram (`Histogram<u32>`,
//! 2 significant figures, 1 µs ..= 1 h, auto-resize off; larger values are clamped to 1 h,
//! NaN is not recorded, negatives count as 0). Histograms are mergeable, which is what lets
//! a window be the sum of its time slices and `overall` the sum of the classes.
//!
//! A dense histogram over that range is 3,328 counters = 13 KB, which is a lot for a time
//! slice that saw a handful of requests. So a slice's [`Hist`] starts empty (no allocation),
//! keeps up to [`SPARSE_MAX`] raw values (≤ 1 KB), and only then turns into the dense
//! histogram. Queries always go through a dense [`Merged`], so a sparse slice reports
//! exactly what a dense one would: the precision is the histogram's either way.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Lowest discernible value, µs.
pub const LOWEST_US: u64 = 1;
/// Highest trackable value, µs (1 h). Larger values are recorded as this.
pub const HIGHEST_US: u64 = 3_600_000_000;
/// Significant figures: values are kept within 1% (HDR "2 significant digits").
pub const SIGFIG: u8 = 2;
/// Raw values a slice keeps before switching to a dense histogram (4 bytes each).
pub const SPARSE_MAX: usize = 256;
/// Heap bytes of one dense histogram: 3,328 `u32` counters plus the struct.
pub const DENSE_BYTES: usize = 3328 * 4 + 96;

fn dense() -> Option<Histogram<u32>> {
    // Cannot fail for these constant bounds (a test checks); if it ever did, values would be
    // dropped rather than panic.
    Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, SIGFIG).ok()
}

/// Milliseconds (as the record carries them) to recordable microseconds.
pub fn ms_to_us(ms: f64) -> Option<u64> {
    if ms.is_nan() {
        return None;
    }
    // `as` saturates; the clamp keeps infinities and huge values inside the histogram.
    Some((ms * 1000.0).clamp(0.0, HIGHEST_US as f64).round() as u64)
}

/// One time slice's distribution of one metric.
#[derive(Debug, Default)]
pub enum Hist {
    #[default]
    Empty,
    Sparse(Vec<u32>),
    Dense(Box<Histogram<u32>>),
}

impl Hist {
    pub fn record_us(&mut self, us: u64) {
        let v = us.min(HIGHEST_US);
        match self {
            Hist::Empty => *self = Hist::Sparse(vec![small(v)]),
            Hist::Sparse(vals) if vals.len() < SPARSE_MAX => vals.push(small(v)),
            Hist::Sparse(vals) => {
                if let Some(mut h) = dense() {
                    for &x in vals.iter() {
                        h.saturating_record(u64::from(x));
                    }
                    h.saturating_record(v);
                    *self = Hist::Dense(Box::new(h));
                }
            }
            Hist::Dense(h) => h.saturating_record(v),
        }
    }

    pub fn record_ms(&mut self, ms: f64) {
        if let Some(us) = ms_to_us(ms) {
            self.record_us(us);
        }
    }

    /// Empties the slice for reuse, keeping its allocation.
    pub fn reset(&mut self) {
        match self {
            Hist::Empty => {}
            Hist::Sparse(vals) => vals.clear(),
            Hist::Dense(h) => h.reset(),
        }
    }

    pub fn heap_bytes(&self) -> usize {
        match self {
            Hist::Empty => 0,
            Hist::Sparse(vals) => vals.capacity() * 4,
            Hist::Dense(_) => DENSE_BYTES,
        }
    }
}

fn small(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A query-time merge of slices (and classes): always dense, allocated on first use.
#[derive(Debug, Default)]
pub struct Merged {
    h: Option<Histogram<u32>>,
}

impl Merged {
    fn get(&mut self) -> Option<&mut Histogram<u32>> {
        if self.h.is_none() {
            self.h = dense();
        }
        self.h.as_mut()
    }

    pub fn add(&mut self, src: &Hist) {
        match src {
            Hist::Empty => {}
            Hist::Sparse(vals) if vals.is_empty() => {}
            Hist::Sparse(vals) => {
                if let Some(h) = self.get() {
                    for &x in vals {
                        h.saturating_record(u64::from(x));
                    }
                }
            }
            Hist::Dense(d) if d.is_empty() => {}
            Hist::Dense(d) => {
                if let Some(h) = self.get() {
                    // Same bounds on both sides, so the addition cannot run out of range.
                    h.add(&**d).ok();
                }
            }
        }
    }

    pub fn add_merged(&mut self, other: &Merged) {
        if let Some(o) = other.h.as_ref().filter(|o| !o.is_empty())
            && let Some(h) = self.get()
        {
            h.add(o).ok();
        }
    }

    pub fn count(&self) -> u64 {
        self.h.as_ref().map_or(0, Histogram::len)
    }

    /// The value at quantile `q` (clamped to [0, 1]) in ms; `None` without samples.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let h = self.h.as_ref().filter(|h| !h.is_empty())?;
        if q.is_nan() {
            return None;
        }
        Some(h.value_at_quantile(q.clamp(0.0, 1.0)) as f64 / 1000.0)
    }

    pub fn percentiles(&self) -> Percentiles {
        Percentiles {
            count: self.count(),
            p50: self.quantile_ms(0.50),
            p90: self.quantile_ms(0.90),
            p95: self.quantile_ms(0.95),
            p99: self.quantile_ms(0.99),
            max: self.quantile_ms(1.0),
        }
    }
}

/// Percentiles in milliseconds; `null` when there are no samples. Each is the highest value
/// equivalent (within 1%) to the true percentile, as HDR histograms report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_histogram_builds_and_matches_its_size_estimate() {
        let h = dense().unwrap();
        assert_eq!(h.distinct_values() * 4 + 96, DENSE_BYTES);
        assert!(!h.is_auto_resize());
    }

    #[test]
    fn sparse_and_dense_report_the_same() {
        let mut sparse = Hist::default();
        let mut big = Hist::default();
        for v in 1..=200u64 {
            sparse.record_us(v * 997);
        }
        for _ in 0..3 {
            for v in 1..=200u64 {
                big.record_us(v * 997);
            }
        }
        assert!(matches!(sparse, Hist::Sparse(_)));
        assert!(matches!(big, Hist::Dense(_)));
        let (mut a, mut b) = (Merged::default(), Merged::default());
        a.add(&sparse);
        b.add(&big);
        assert_eq!(a.count() * 3, b.count());
        for q in [0.5, 0.9, 0.99, 1.0] {
            assert_eq!(a.quantile_ms(q), b.quantile_ms(q));
        }
    }

    #[test]
    fn extremes_are_clamped_not_panicking() {
        let mut h = Hist::default();
        for ms in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -5.0, 0.0, 1e300] {
            h.record_ms(ms);
        }
        h.record_us(u64::MAX);
        let mut m = Merged::default();
        m.add(&h);
        assert_eq!(m.count(), 6, "NaN is the only value not recorded");
        let max = m.quantile_ms(1.0).unwrap();
        assert!(
            (3_600_000.0..3_640_000.0).contains(&max),
            "clamped to 1 h: {max}"
        );
        assert_eq!(m.quantile_ms(0.0), Some(0.0));
        assert_eq!(m.quantile_ms(f64::NAN), None);
    }

    #[test]
    fn reset_keeps_the_allocation() {
        let mut h = Hist::default();
        for v in 0..1000 {
            h.record_us(v);
        }
        h.reset();
        assert_eq!(h.heap_bytes(), DENSE_BYTES);
        let mut m = Merged::default();
        m.add(&h);
        assert_eq!(m.count(), 0);
        assert_eq!(m.percentiles().p50, None);
    }
}
