//! Timings against noise: how far a side's times are from the primary's, with the
//! primary's own spread beside them. Pure numbers, no state.
//!
//! - [`Shift::of`]: the paired Hodges–Lehmann shift (the median of the Walsh averages of
//!   the per-request differences, other − primary), its 95 % interval from the Wilcoxon
//!   signed-rank distribution (normal approximation: the `C`-th Walsh averages from each
//!   end), and the two-sided Mann–Whitney p-value of the two sides' values taken as two
//!   samples (normal approximation with tie correction and continuity correction).
//!   Hollander & Wolfe, *Nonparametric Statistical Methods*, §3.2 and §4.1.
//! - [`mann_whitney`] is also the length test of sampled answers (`answers`).

use serde::Serialize;

/// Pairs the Walsh averages are taken over at most: 1,000 pairs are 500,500 averages, a
/// few milliseconds to sort; past it the pairs are thinned evenly (the shift of a
/// thinned sample is as unbiased, its interval a little wider).
const MAX_PAIRS: usize = 1_000;
/// z of a two-sided 95 % interval.
const Z95: f64 = 1.959_963_985;

/// One side's shift from the primary, in milliseconds (`ttft_shift`, `tpot_shift`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Shift {
    /// Pairs both sides timed.
    pub pairs: usize,
    /// Hodges–Lehmann estimate of other − primary.
    pub shift_ms: Option<f64>,
    /// Its 95 % interval; `null` below 6 pairs (too few for one).
    pub ci95: Option<[f64; 2]>,
    /// Two-sided Mann–Whitney p-value: the chance of two samples this far apart when both
    /// sides' times come from one distribution.
    pub p_value: Option<f64>,
}

impl Shift {
    /// `pairs` of (primary, other) times of the same requests.
    pub fn of(pairs: &[(f64, f64)]) -> Shift {
        let pairs: Vec<(f64, f64)> = pairs
            .iter()
            .copied()
            .filter(|(p, o)| p.is_finite() && o.is_finite())
            .collect();
        let n = pairs.len();
        if n == 0 {
            return Shift::default();
        }
        let thinned: Vec<f64> = if n > MAX_PAIRS {
            (0..MAX_PAIRS)
                .map(|i| pairs[i * n / MAX_PAIRS])
                .map(|(p, o)| o - p)
                .collect()
        } else {
            pairs.iter().map(|(p, o)| o - p).collect()
        };
        let m = thinned.len();
        let mut walsh = Vec::with_capacity(m * (m + 1) / 2);
        for i in 0..m {
            for j in i..m {
                walsh.push((thinned[i] + thinned[j]) / 2.0);
            }
        }
        walsh.sort_by(f64::total_cmp);
        let (primary, other): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
        Shift {
            pairs: n,
            shift_ms: median(&walsh),
            ci95: signed_rank_interval(&walsh, m),
            p_value: mann_whitney(&other, &primary),
        }
    }
}

/// The median of sorted `v` (the mean of the middle two for an even count).
fn median(v: &[f64]) -> Option<f64> {
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The 95 % interval of the shift from `m` differences' sorted Walsh averages: from the
/// `C+1`-th smallest to the `C+1`-th largest, `C` the signed-rank statistic's lower 2.5 %
/// point.
fn signed_rank_interval(walsh: &[f64], m: usize) -> Option<[f64; 2]> {
    let m = m as f64;
    let mean = m * (m + 1.0) / 4.0;
    let sd = (m * (m + 1.0) * (2.0 * m + 1.0) / 24.0).sqrt();
    let c = (mean - Z95 * sd).floor();
    if c < 1.0 {
        return None;
    }
    let c = c as usize;
    Some([*walsh.get(c)?, *walsh.get(walsh.len().checked_sub(c + 1)?)?])
}

/// Two-sided Mann–Whitney p-value of samples `a` and `b`; `None` when either is empty or
/// every value is the same.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<f64> {
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|v| (*v, true))
        .chain(b.iter().map(|v| (*v, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = all.len();
    let (mut rank_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < total {
        let mut j = i;
        while j + 1 < total && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1 ..= j+1 share their mean.
        let rank = (i + j + 2) as f64 / 2.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_a += rank * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let (n1, n2, n) = (n1 as f64, n2 as f64, total as f64);
    let u = rank_a - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)).max(1.0));
    if var <= 0.0 {
        return None;
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    Some(erfc(z / std::f64::consts::SQRT_2).min(1.0))
}

/// The complementary error function (Numerical Recipes' Chebyshev fit, relative error
/// under 1.2e-7 everywhere).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122),
            (1.0, 0.157_299_207),
            (2.0, 0.004_677_735),
            (-1.0, 1.842_700_793),
        ] {
            assert!((erfc(x) - want).abs() < 1e-6, "erfc({x}) = {}", erfc(x));
        }
    }

    #[test]
    fn the_shift_of_a_constant_difference_is_that_difference() {
        let pairs: Vec<(f64, f64)> = (0..50)
            .map(|i| (f64::from(i), f64::from(i) + 2.0))
            .collect();
        let s = Shift::of(&pairs);
        assert_eq!(s.pairs, 50);
        assert_eq!(s.shift_ms, Some(2.0));
        assert_eq!(s.ci95, Some([2.0, 2.0]));
        // Two samples 0..50 and 2..52 overlap almost whole: not told apart as samples (the
        // paired shift is what sees it).
        assert!(s.p_value.is_some_and(|p| p > 0.5), "{s:?}");
        assert_eq!(Shift::of(&[]), Shift::default());
        assert!(Shift::of(&pairs[..5]).ci95.is_none());
    }

    #[test]
    fn the_interval_covers_the_shift_and_the_p_value_sees_a_real_one() {
        // Differences 1..=20 (a spread), primary times all near 100, other near 200.
        let pairs: Vec<(f64, f64)> = (1..=20)
            .map(|i| (100.0 + f64::from(i), 200.0 + f64::from(i) * 2.0))
            .collect();
        let s = Shift::of(&pairs);
        let (Some(shift), Some([lo, hi])) = (s.shift_ms, s.ci95) else {
            panic!("{s:?}")
        };
        assert_eq!(shift, 110.5);
        assert!(lo < shift && shift < hi, "{s:?}");
        assert!(s.p_value.is_some_and(|p| p < 1e-6), "{s:?}");
        // Thinned past MAX_PAIRS, the estimate stays where it was.
        let many: Vec<(f64, f64)> = (0..5_000)
            .map(|i| (f64::from(i % 100), f64::from(i % 100) + 3.0))
            .collect();
        assert_eq!(Shift::of(&many).shift_ms, Some(3.0));
    }

    #[test]
    fn mann_whitney_follows_its_textbook_example() {
        // Identical samples: p = 1; all tied: undefined.
        assert_eq!(mann_whitney(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]), Some(1.0));
        assert_eq!(mann_whitney(&[1.0, 1.0], &[1.0, 1.0]), None);
        assert_eq!(mann_whitney(&[], &[1.0]), None);
        // n1 = n2 = 10, fully separated: U = 0, z = (50 - 0.5) / 13.229, p ≈ 0.000183.
        let a: Vec<f64> = (0..10).map(f64::from).collect();
        let b: Vec<f64> = (10..20).map(f64::from).collect();
        let p = mann_whitney(&a, &b).unwrap_or(f64::NAN);
        assert!((p - 0.000_183).abs() < 5e-6, "{p}");
    }
}
