//! `--repeat N`: each concurrency level of a steps run is run N times in a row; per level,
//! every headline number gets its mean and a 95% confidence interval over the repeats
//! (Student's t with N − 1 degrees of freedom: mean ± t · s / √N), so a reader can tell a
//! real difference between two candidates from run-to-run noise.

use std::collections::BTreeMap;

use serde::Serialize;

use super::report::json::StepOut;

/// Two-sided 95% quantiles of Student's t for 1 to 30 degrees of freedom; above, 1.96.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

fn t95(df: usize) -> f64 {
    T95.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

/// Mean and 95% confidence interval of one number over the repeats that have it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ci {
    pub n: usize,
    pub mean: Option<f64>,
    /// `null` with fewer than two values.
    pub ci95_low: Option<f64>,
    pub ci95_high: Option<f64>,
    pub values: Vec<f64>,
}

impl Ci {
    pub fn of(values: Vec<f64>) -> Ci {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        let n = values.len();
        let mean = (n > 0).then(|| values.iter().sum::<f64>() / n as f64);
        let half = mean.filter(|_| n >= 2).map(|m| {
            let var = values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1) as f64;
            t95(n - 1) * (var / n as f64).sqrt()
        });
        Ci {
            n,
            mean,
            ci95_low: mean.zip(half).map(|(m, h)| m - h),
            ci95_high: mean.zip(half).map(|(m, h)| m + h),
            values,
        }
    }
}

/// One concurrency level over its repeats.
#[derive(Debug, Clone, Serialize)]
pub struct Repeat {
    pub concurrency: u32,
    pub runs: usize,
    pub requests: Ci,
    pub attainment: Ci,
    pub effective_goodput_tokens_per_s: Ci,
    pub raw_output_tokens_per_s: Ci,
    pub ttft_p95_ms: Ci,
    pub tpot_p95_ms: Ci,
    pub e2e_p95_ms: Ci,
}

/// The steps grouped by concurrency level, in level order.
pub fn of(steps: &[StepOut]) -> Vec<Repeat> {
    let mut levels: BTreeMap<u32, Vec<&StepOut>> = BTreeMap::new();
    for s in steps {
        if let Some(c) = s.concurrency {
            levels.entry(c).or_default().push(s);
        }
    }
    levels
        .into_iter()
        .map(|(c, v)| {
            let ci = |f: &dyn Fn(&StepOut) -> Option<f64>| {
                Ci::of(v.iter().filter_map(|s| f(s)).collect())
            };
            Repeat {
                concurrency: c,
                runs: v.len(),
                requests: ci(&|s| Some(s.stats.requests as f64)),
                attainment: ci(&|s| s.stats.attainment),
                effective_goodput_tokens_per_s: ci(&|s| {
                    Some(s.stats.effective_goodput_tokens_per_s)
                }),
                raw_output_tokens_per_s: ci(&|s| Some(s.stats.raw_output_tokens_per_s)),
                ttft_p95_ms: ci(&|s| s.stats.ttft_ms.p95),
                tpot_p95_ms: ci(&|s| s.stats.tpot_ms.p95),
                e2e_p95_ms: ci(&|s| s.stats.e2e_ms.p95),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_interval_uses_student_t() {
        let c = Ci::of(vec![10.0, 12.0, 14.0]);
        assert_eq!(c.mean, Some(12.0));
        // s = 2, t(2) = 4.303: half width 4.303 · 2 / √3.
        let half = 4.303 * 2.0 / 3f64.sqrt();
        assert!((c.ci95_high.unwrap() - (12.0 + half)).abs() < 1e-9);
        assert!((c.ci95_low.unwrap() - (12.0 - half)).abs() < 1e-9);
        let one = Ci::of(vec![5.0]);
        assert_eq!((one.mean, one.ci95_low), (Some(5.0), None));
        assert_eq!(Ci::of(vec![f64::NAN]).mean, None);
        assert_eq!(t95(40), 1.96);
        let same = Ci::of(vec![3.0; 4]);
        assert_eq!((same.ci95_low, same.ci95_high), (Some(3.0), Some(3.0)));
    }
}
