//! The nearest-rank percentile every exact view uses (profiles, replay reports, the demo):
//! the smallest value with at least a share `q` of the values at or below it. The live
//! views use HDR histograms instead (`stats::engine::hist`), within their stated precision.

/// The 1-based rank of the `q` quantile among `n` values (`n` > 0), clamped to `1..=n`.
pub fn rank(n: usize, q: f64) -> usize {
    ((q * n as f64).ceil() as usize).clamp(1, n)
}

/// Nearest-rank percentile of ascending `sorted` values; `None` when there are none.
pub fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[rank(sorted.len(), q) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_of_known_values() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 0.5), Some(5.0));
        assert_eq!(nearest_rank(&v, 0.95), Some(10.0));
        assert_eq!(nearest_rank(&v, 0.91), Some(10.0));
        assert_eq!(nearest_rank(&v, 0.9), Some(9.0));
        assert_eq!(nearest_rank(&v, 0.0), Some(1.0));
        assert_eq!(nearest_rank(&v, 1.0), Some(10.0));
        assert_eq!(nearest_rank(&[], 0.5), None);
        assert_eq!(nearest_rank(&[7.0], 0.99), Some(7.0));
    }

    #[test]
    fn rank_is_clamped() {
        assert_eq!(rank(3, 0.0), 1);
        assert_eq!(rank(3, 2.0), 3);
        assert_eq!(rank(100, 0.99), 99);
    }
}
