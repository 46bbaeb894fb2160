//! Sampled answers (not deterministic: `temperature` above 0 and no `seed`) are never
//! compared word for word: two samples of one distribution differ anyway. Their lengths
//! and finish reasons are compared as distributions instead, by two-sample tests:
//! Mann–Whitney's on the answers' lengths in characters ([`super::shift::mann_whitney`])
//! and Pearson's chi-square test of homogeneity on the finish reasons.

use serde::Serialize;

use super::{answers::Compared, shift::mann_whitney};
use crate::decode::FinishReason;

/// One side's sampled answers against the primary's (`answers.sampled`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sampled {
    /// Sampled pairs both answered in full.
    pub pairs: u64,
    /// Two-sided Mann–Whitney p-value of the two sides' answer lengths.
    pub length_p_value: Option<f64>,
    /// Chi-square p-value of the two sides' finish reasons (`null` while every answer of
    /// both sides ended the same way).
    pub finish_p_value: Option<f64>,
}

impl Sampled {
    /// Over the sampled pairs of `compared`.
    pub fn of(compared: &[Compared]) -> Sampled {
        let sampled: Vec<&Compared> = compared.iter().filter(|c| !c.deterministic).collect();
        let (primary, copy): (Vec<f64>, Vec<f64>) = sampled
            .iter()
            .map(|c| (c.lengths.0 as f64, c.lengths.1 as f64))
            .unzip();
        let mut table = [[0u64; 2]; 6];
        let slot = |f: Option<FinishReason>| {
            f.and_then(|f| FinishReason::ALL.iter().position(|a| *a == f))
                .unwrap_or(FinishReason::ALL.len())
        };
        for c in &sampled {
            table[slot(c.finishes.0)][0] += 1;
            table[slot(c.finishes.1)][1] += 1;
        }
        Sampled {
            pairs: sampled.len() as u64,
            length_p_value: mann_whitney(&copy, &primary),
            finish_p_value: chi_square(&table),
        }
    }
}

/// Pearson's chi-square test of homogeneity of two samples' categories (`table[k]` =
/// the two counts of category k): its p-value, `None` with fewer than two categories
/// seen or an empty side.
pub fn chi_square(table: &[[u64; 2]]) -> Option<f64> {
    let rows: Vec<[f64; 2]> = table
        .iter()
        .filter(|r| r[0] + r[1] > 0)
        .map(|r| [r[0] as f64, r[1] as f64])
        .collect();
    let cols = [
        rows.iter().map(|r| r[0]).sum::<f64>(),
        rows.iter().map(|r| r[1]).sum::<f64>(),
    ];
    let n = cols[0] + cols[1];
    if rows.len() < 2 || cols[0] == 0.0 || cols[1] == 0.0 {
        return None;
    }
    let stat: f64 = rows
        .iter()
        .flat_map(|r| {
            let total = r[0] + r[1];
            (0..2).map(move |j| {
                let expected = total * cols[j] / n;
                (r[j] - expected).powi(2) / expected
            })
        })
        .sum();
    let df = (rows.len() - 1) as f64;
    Some(upper_gamma(df / 2.0, stat / 2.0))
}

/// The regularised upper incomplete gamma function Q(a, x), the chi-square survival
/// function at 2x with 2a degrees of freedom (Numerical Recipes `gammq`: a series below
/// a + 1, a continued fraction above).
fn upper_gamma(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let ln_front = -x + a * x.ln() - ln_gamma(a);
    if x < a + 1.0 {
        let (mut sum, mut term, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..500 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-14 {
                break;
            }
        }
        (1.0 - sum * ln_front.exp()).clamp(0.0, 1.0)
    } else {
        // Lentz's method.
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..500 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-14 {
                break;
            }
        }
        (ln_front.exp() * h).clamp(0.0, 1.0)
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let t = x + 7.5;
    let sum: f64 = G[0] + (1..9).map(|i| G[i] / (x + i as f64)).sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chi_square_p_values_match_the_tables() {
        // 1 degree of freedom: the statistic 3.841 is the 5 % point.
        assert!((upper_gamma(0.5, 3.841_459 / 2.0) - 0.05).abs() < 1e-5);
        // 4 degrees of freedom: 9.488 is the 5 % point.
        assert!((upper_gamma(2.0, 9.487_729 / 2.0) - 0.05).abs() < 1e-5);
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-10);
        // The same proportions: p = 1; far apart: small; one category: no test.
        assert!(chi_square(&[[10, 20], [30, 60]]).is_some_and(|p| (p - 1.0).abs() < 1e-9));
        assert!(chi_square(&[[90, 10], [10, 90]]).is_some_and(|p| p < 1e-10));
        assert_eq!(chi_square(&[[10, 10], [0, 0]]), None);
    }

    #[test]
    fn sampled_pairs_are_tested_by_length_and_finish_reason() {
        let pair = |p: u64, c: u64, pf, cf| Compared {
            exact: false,
            first_divergence_chars: Some(0),
            first_divergence_tokens: None,
            length_ratio: None,
            finish_equal: pf == cf,
            deterministic: false,
            lengths: (p, c),
            finishes: (Some(pf), Some(cf)),
        };
        use FinishReason::{Length, Stop};
        // The candidate's answers run three times as long and hit the length limit.
        let v: Vec<Compared> = (0..40)
            .map(|i| pair(100 + i, 300 + i, Stop, Length))
            .collect();
        let s = Sampled::of(&v);
        assert_eq!(s.pairs, 40);
        assert!(s.length_p_value.is_some_and(|p| p < 1e-6), "{s:?}");
        assert!(s.finish_p_value.is_some_and(|p| p < 1e-6), "{s:?}");
        // The same distributions: nothing to see.
        let v: Vec<Compared> = (0..40)
            .map(|i| {
                pair(
                    100 + i,
                    139 - i,
                    if i % 2 == 0 { Stop } else { Length },
                    if i % 2 == 1 { Stop } else { Length },
                )
            })
            .collect();
        let s = Sampled::of(&v);
        assert!(s.length_p_value.is_some_and(|p| p > 0.9), "{s:?}");
        assert!(s.finish_p_value.is_some_and(|p| p > 0.9), "{s:?}");
    }
}
