//! The statistics profiles are described and compared with, shared by `summarize`, `diff`
//! and live drift detection. Pure functions over plain numbers.
//!
//! - Length distributions are binned on a log scale: bin 0 holds 0, then half-octave bins
//!   `[√2^k, √2^(k+1))` (1, 1.41, 2, 2.83, 4, ...), fine enough to see a 30% shift and
//!   coarse enough that a few hundred samples fill them.
//! - PSI (population stability index) = Σ (p − q) · ln(p / q) over those bins, with 0.5
//!   added to every bin count on both sides where either side has samples, so an empty
//!   bin costs a bounded amount instead of infinity.
//! - KS = the largest distance between the two empirical CDFs.
//! - TVD (total variation distance) = ½ Σ |p − q| over categories.
//!
//! Noise floors: with few samples these statistics are large even when nothing moved.
//! [`psi_noise_floor`] and [`ks_noise_floor`] give the value a same-distribution resample
//! exceeds with probability about 0.1%, and thresholds are raised to them (so small
//! windows stay quiet rather than page someone).

use std::collections::BTreeMap;

/// A sample as its distinct values, sorted, each with how often it occurs: lengths are
/// integers, so this is exact and holds one entry per distinct length, not per request.
/// Percentiles, PSI and KS over it equal those over the expanded sorted values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    values: Vec<(f64, u64)>,
    n: usize,
}

impl Counts {
    /// From sorted values.
    pub fn from_sorted(sorted: &[f64]) -> Counts {
        let mut values: Vec<(f64, u64)> = Vec::new();
        for v in sorted {
            match values.last_mut() {
                Some((last, k)) if *last == *v => *k += 1,
                _ => values.push((*v, 1)),
            }
        }
        Counts {
            values,
            n: sorted.len(),
        }
    }

    /// From integer values and their counts.
    pub fn from_map(m: &BTreeMap<u64, u64>) -> Counts {
        Counts {
            values: m.iter().map(|(v, k)| (*v as f64, *k)).collect(),
            n: m.values().map(|k| *k as usize).sum(),
        }
    }

    /// How many values (with repeats).
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn max(&self) -> Option<f64> {
        self.values.last().map(|(v, _)| *v)
    }

    /// Distinct values and their counts, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.values.iter().copied()
    }

    /// Nearest-rank percentile, as [`percentile`] of the expanded values.
    pub fn percentile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = crate::quantile::rank(self.n, q) as u64;
        let mut seen = 0u64;
        for (v, k) in &self.values {
            seen += k;
            if seen >= rank {
                return Some(*v);
            }
        }
        self.max()
    }
}

/// Nearest-rank percentile of sorted values; `None` when empty.
pub use crate::quantile::nearest_rank as percentile;

pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Coefficient of variation (population σ / mean); `None` with fewer than 2 values or a
/// zero mean.
pub fn cv(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let m = mean(values)?;
    if m <= 0.0 {
        return None;
    }
    let var = values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / values.len() as f64;
    Some(var.sqrt() / m)
}

/// Burstiness: the CV of the gaps between consecutive sorted arrival times (ms). 1 for
/// Poisson arrivals, 0 for a metronome, above 1 for bursts.
pub fn interarrival_cv(sorted_ms: &[i64]) -> Option<f64> {
    let gaps: Vec<f64> = sorted_ms.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
    cv(&gaps)
}

/// The log bin of a length (see the module doc).
pub fn log_bin(v: f64) -> usize {
    if v < 1.0 {
        0
    } else {
        1 + (2.0 * v.log2()).floor() as usize
    }
}

fn histogram(values: &Counts) -> BTreeMap<usize, f64> {
    let mut h = BTreeMap::new();
    for (v, k) in values.iter() {
        *h.entry(log_bin(v)).or_insert(0.0) += k as f64;
    }
    h
}

/// PSI over log bins with 0.5 smoothing; also returns the bins used (for the noise floor).
pub fn psi(base: &Counts, live: &Counts) -> Option<(f64, usize)> {
    if base.is_empty() || live.is_empty() {
        return None;
    }
    let (hb, hl) = (histogram(base), histogram(live));
    let mut bins: Vec<usize> = hb.keys().chain(hl.keys()).copied().collect();
    bins.sort_unstable();
    bins.dedup();
    let smooth = 0.5;
    let nb = base.len() as f64 + smooth * bins.len() as f64;
    let nl = live.len() as f64 + smooth * bins.len() as f64;
    let value = bins
        .iter()
        .map(|b| {
            let p = (hb.get(b).copied().unwrap_or(0.0) + smooth) / nb;
            let q = (hl.get(b).copied().unwrap_or(0.0) + smooth) / nl;
            (q - p) * (q / p).ln()
        })
        .sum();
    Some((value, bins.len()))
}

/// The PSI a same-distribution resample exceeds with probability ≈ 0.1%: PSI is about
/// (1/n + 1/m) · χ²(bins − 1), and χ²'s 99.9th percentile is approximated by
/// Wilson–Hilferty.
pub fn psi_noise_floor(n: usize, m: usize, bins: usize) -> f64 {
    if n == 0 || m == 0 {
        return f64::INFINITY;
    }
    let df = bins.saturating_sub(1).max(1) as f64;
    let z = 3.09; // one-sided 99.9%
    let chi = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    chi * (1.0 / n as f64 + 1.0 / m as f64)
}

/// Two-sample Kolmogorov–Smirnov statistic.
pub fn ks(a: &Counts, b: &Counts) -> Option<f64> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (a, b) = (&a.values, &b.values);
    let (n, m) = (
        a.iter().map(|x| x.1).sum::<u64>(),
        b.iter().map(|x| x.1).sum::<u64>(),
    );
    let (n, m) = (n as f64, m as f64);
    // i, j: how many values of each side are ≤ x (as the expanded walk counts them).
    let (mut ia, mut ib, mut i, mut j, mut d) = (0usize, 0usize, 0u64, 0u64, 0f64);
    while ia < a.len() && ib < b.len() {
        let x = a[ia].0.min(b[ib].0);
        while ia < a.len() && a[ia].0 <= x {
            i += a[ia].1;
            ia += 1;
        }
        while ib < b.len() && b[ib].0 <= x {
            j += b[ib].1;
            ib += 1;
        }
        d = d.max((i as f64 / n - j as f64 / m).abs());
    }
    Some(d)
}

/// The KS statistic a same-distribution resample exceeds with probability ≈ 0.1%:
/// c(α) · √((n + m) / (n·m)) with c = 1.95.
pub fn ks_noise_floor(n: usize, m: usize) -> f64 {
    if n == 0 || m == 0 {
        return f64::INFINITY;
    }
    let (n, m) = (n as f64, m as f64);
    1.95 * ((n + m) / (n * m)).sqrt()
}

/// Total variation distance between two categorical count maps.
pub fn tvd(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Option<f64> {
    let (na, nb) = (a.values().sum::<u64>(), b.values().sum::<u64>());
    if na == 0 || nb == 0 {
        return None;
    }
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let sum: f64 = keys
        .into_iter()
        .map(|k| {
            let p = a.get(k).copied().unwrap_or(0) as f64 / na as f64;
            let q = b.get(k).copied().unwrap_or(0) as f64 / nb as f64;
            (p - q).abs()
        })
        .sum();
    Some(sum / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 1.0), Some(100.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn log_bins_are_half_octaves() {
        assert_eq!(log_bin(0.0), 0);
        assert_eq!(log_bin(1.0), 1);
        assert_eq!(log_bin(1.5), 2);
        assert_eq!(log_bin(2.0), 3);
        assert_eq!(log_bin(512.0), 19);
        assert_eq!(log_bin(723.0), 19);
        assert_eq!(log_bin(724.1), 20);
    }

    fn counts(v: &[f64]) -> Counts {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        Counts::from_sorted(&v)
    }

    #[test]
    fn psi_ks_and_tvd_see_shifts_not_copies() {
        let a: Vec<f64> = (0..1000).map(|i| 100.0 + f64::from(i % 100)).collect();
        let (ca, cb) = (
            counts(&a),
            counts(&a.iter().map(|v| v * 3.0).collect::<Vec<_>>()),
        );
        let (same, _) = psi(&ca, &ca).unwrap();
        assert!(same.abs() < 1e-12);
        let (moved, bins) = psi(&ca, &cb).unwrap();
        assert!(
            moved > 1.0 && moved > psi_noise_floor(1000, 1000, bins),
            "{moved}"
        );
        assert_eq!(ks(&ca, &ca), Some(0.0));
        assert_eq!(ks(&ca, &cb), Some(1.0));
        assert_eq!(psi(&ca, &Counts::default()), None);
        let m1 = BTreeMap::from([("a".to_string(), 50), ("b".to_string(), 50)]);
        let m2 = BTreeMap::from([("a".to_string(), 100)]);
        assert_eq!(tvd(&m1, &m2), Some(0.5));
        assert_eq!(tvd(&m1, &m1), Some(0.0));
    }

    /// KS and percentiles over counts equal the walk over every value.
    #[test]
    fn counts_give_what_the_expanded_values_give() {
        fn ks_expanded(a: &[f64], b: &[f64]) -> f64 {
            let (mut i, mut j, mut d) = (0usize, 0usize, 0f64);
            let (n, m) = (a.len() as f64, b.len() as f64);
            while i < a.len() && j < b.len() {
                let x = a[i].min(b[j]);
                while i < a.len() && a[i] <= x {
                    i += 1;
                }
                while j < b.len() && b[j] <= x {
                    j += 1;
                }
                d = d.max((i as f64 / n - j as f64 / m).abs());
            }
            d
        }
        let mut seed = 7u64;
        let mut draw = |n: usize, scale: u64| -> Vec<f64> {
            let mut v: Vec<f64> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 33) % scale) as f64
                })
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        for (n, m, scale) in [(1, 1, 3), (500, 300, 40), (1000, 2000, 900), (50, 5000, 7)] {
            let (a, b) = (draw(n, scale), draw(m, scale + 5));
            let (ca, cb) = (Counts::from_sorted(&a), Counts::from_sorted(&b));
            assert_eq!(ks(&ca, &cb), Some(ks_expanded(&a, &b)));
            assert_eq!(ca.len(), n);
            assert_eq!(ca.max(), a.last().copied());
            for q in [0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 1.0] {
                assert_eq!(ca.percentile(q), percentile(&a, q), "q {q} n {n}");
            }
            let map: BTreeMap<u64, u64> = ca.iter().map(|(v, k)| (v as u64, k)).collect();
            assert_eq!(Counts::from_map(&map), ca);
        }
        assert_eq!(Counts::default().percentile(0.5), None);
    }

    #[test]
    fn noise_floors_shrink_with_samples() {
        assert!(ks_noise_floor(100, 100) > 0.25);
        assert!(ks_noise_floor(10_000, 10_000) < 0.03);
        assert!(psi_noise_floor(100, 100, 12) > 0.5);
        assert!(psi_noise_floor(5000, 5000, 12) < 0.02);
    }

    #[test]
    fn burstiness() {
        let regular: Vec<i64> = (0..100).map(|i| i * 10).collect();
        assert_eq!(interarrival_cv(&regular), Some(0.0));
        let bursty = [0, 1, 2, 3, 1000, 1001, 1002, 2000];
        assert!(interarrival_cv(&bursty).unwrap() > 1.0);
        assert_eq!(cv(&[1.0]), None);
    }
}
