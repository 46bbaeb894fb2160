//! Latency and length distributions for the simulator.
//!
//! One small closed enum covers what real inference servers look like closely enough for
//! a demo, a test fixture or a benchmark: `Fixed` for exact, assertable timings in tests,
//! `Normal` for the tight inter-token gaps of a healthy decode loop, and `LogNormal` for
//! the long right tail of time-to-first-token and output lengths. Time distributions are
//! in milliseconds, length distributions in tokens; every sample is clamped at zero so a
//! wide normal never yields a negative sleep.
//!
//! The CLI form (`fixed:20`, `normal:20,5`, `lognormal:150,0.5`) is what `Display` prints,
//! so a config can be logged and pasted back on a command line.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;
use rand_distr::StandardNormal;

/// A distribution of non-negative values: milliseconds for latencies, tokens for lengths.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Always the same value.
    Fixed(f64),
    /// Normal with the given mean and standard deviation.
    Normal { mean: f64, sd: f64 },
    /// Log-normal given by its median (`exp(mu)`) and the sigma of the underlying normal;
    /// the median is easier to reason about than `mu` when reading a config.
    LogNormal { median: f64, sigma: f64 },
}

/// Why a distribution string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistParseError {
    #[error(
        "unknown distribution {0:?}: expected fixed:V, normal:MEAN,SD or lognormal:MEDIAN,SIGMA"
    )]
    UnknownKind(String),
    #[error("{kind} takes {expected} parameter(s), got {got}")]
    Arity {
        kind: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("invalid number {0:?}")]
    Number(String),
    #[error("{0} must be a finite number >= 0")]
    Negative(&'static str),
    #[error("lognormal median must be > 0")]
    ZeroMedian,
}

impl Dist {
    /// Draws one value, clamped at 0.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        let v = match *self {
            Dist::Fixed(v) => v,
            Dist::Normal { mean, sd } => {
                let z: f64 = rng.sample(StandardNormal);
                mean + sd * z
            }
            Dist::LogNormal { median, sigma } => {
                let z: f64 = rng.sample(StandardNormal);
                median * (sigma * z).exp()
            }
        };
        // NaN (only reachable through a hand-built Dist) is treated as 0 rather than
        // poisoning a deadline computation.
        if v.is_nan() { 0.0 } else { v.max(0.0) }
    }

    /// Draws a duration, reading the distribution in milliseconds.
    pub fn sample_ms<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        // Cap at a day: a pathological tail must not overflow `Duration` arithmetic.
        Duration::from_secs_f64((self.sample(rng) / 1000.0).min(86_400.0))
    }

    /// Draws a whole count (rounded), reading the distribution in tokens.
    pub fn sample_count<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        // `as` saturates for floats, which is exactly the clamp wanted here.
        self.sample(rng).round() as u32
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // f64's Display is the shortest string that parses back to the same value, so
        // this round-trips through `FromStr`.
        match self {
            Dist::Fixed(v) => write!(f, "fixed:{v}"),
            Dist::Normal { mean, sd } => write!(f, "normal:{mean},{sd}"),
            Dist::LogNormal { median, sigma } => write!(f, "lognormal:{median},{sigma}"),
        }
    }
}

impl FromStr for Dist {
    type Err = DistParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        // A bare number is the common case on a command line (`--itl 20`).
        let (kind, params) = s.split_once(':').unwrap_or(("fixed", s));
        let params: Vec<&str> = params.split(',').map(str::trim).collect();
        match kind.trim().to_ascii_lowercase().as_str() {
            "fixed" => {
                let [v] = arity::<1>("fixed", &params)?;
                Ok(Dist::Fixed(non_negative("fixed value", v)?))
            }
            "normal" => {
                let [mean, sd] = arity::<2>("normal", &params)?;
                Ok(Dist::Normal {
                    mean: non_negative("normal mean", mean)?,
                    sd: non_negative("normal sd", sd)?,
                })
            }
            "lognormal" => {
                let [median, sigma] = arity::<2>("lognormal", &params)?;
                let median = non_negative("lognormal median", median)?;
                if median == 0.0 {
                    return Err(DistParseError::ZeroMedian);
                }
                Ok(Dist::LogNormal {
                    median,
                    sigma: non_negative("lognormal sigma", sigma)?,
                })
            }
            _ => Err(DistParseError::UnknownKind(s.to_owned())),
        }
    }
}

fn arity<'a, const N: usize>(
    kind: &'static str,
    params: &[&'a str],
) -> Result<[&'a str; N], DistParseError> {
    <[&str; N]>::try_from(params).map_err(|_| DistParseError::Arity {
        kind,
        expected: N,
        got: params.len(),
    })
}

fn non_negative(what: &'static str, s: &str) -> Result<f64, DistParseError> {
    let v: f64 = s
        .parse()
        .map_err(|_| DistParseError::Number(s.to_owned()))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(DistParseError::Negative(what))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn parses_each_kind() {
        assert_eq!("fixed:20".parse(), Ok(Dist::Fixed(20.0)));
        assert_eq!("20".parse(), Ok(Dist::Fixed(20.0)));
        assert_eq!(
            "normal:20,5".parse(),
            Ok(Dist::Normal {
                mean: 20.0,
                sd: 5.0
            })
        );
        assert_eq!(
            " LogNormal:150, 0.5 ".parse(),
            Ok(Dist::LogNormal {
                median: 150.0,
                sigma: 0.5
            })
        );
    }

    #[test]
    fn display_round_trips() {
        for d in [
            Dist::Fixed(20.0),
            Dist::Fixed(0.1),
            Dist::Normal {
                mean: 20.0,
                sd: 5.5,
            },
            Dist::LogNormal {
                median: 150.0,
                sigma: 0.5,
            },
            Dist::LogNormal {
                median: 1e-3,
                sigma: 1.0 / 3.0,
            },
        ] {
            let s = d.to_string();
            assert_eq!(s.parse::<Dist>(), Ok(d), "{s}");
        }
        assert_eq!(
            Dist::Normal {
                mean: 20.0,
                sd: 5.0
            }
            .to_string(),
            "normal:20,5"
        );
    }

    #[test]
    fn rejects_bad_strings() {
        assert!(matches!(
            "gamma:1,2".parse::<Dist>(),
            Err(DistParseError::UnknownKind(_))
        ));
        assert!(matches!(
            "normal:1".parse::<Dist>(),
            Err(DistParseError::Arity { .. })
        ));
        assert!(matches!(
            "fixed:1,2".parse::<Dist>(),
            Err(DistParseError::Arity { .. })
        ));
        assert!(matches!(
            "fixed:abc".parse::<Dist>(),
            Err(DistParseError::Number(_))
        ));
        assert!(matches!(
            "fixed:-1".parse::<Dist>(),
            Err(DistParseError::Negative(_))
        ));
        assert!(matches!(
            "normal:1,inf".parse::<Dist>(),
            Err(DistParseError::Negative(_))
        ));
        assert_eq!(
            "lognormal:0,1".parse::<Dist>(),
            Err(DistParseError::ZeroMedian)
        );
    }

    #[test]
    fn samples_are_clamped_and_centred() {
        let mut rng = SmallRng::seed_from_u64(7);
        let wide = Dist::Normal {
            mean: 1.0,
            sd: 100.0,
        };
        assert!((0..1000).all(|_| wide.sample(&mut rng) >= 0.0));

        let ln = Dist::LogNormal {
            median: 150.0,
            sigma: 0.5,
        };
        let mut xs: Vec<f64> = (0..2001).map(|_| ln.sample(&mut rng)).collect();
        xs.sort_by(f64::total_cmp);
        let median = xs[1000];
        assert!((130.0..170.0).contains(&median), "median {median}");

        assert_eq!(Dist::Fixed(2.6).sample_count(&mut rng), 3);
        assert_eq!(
            Dist::Fixed(20.0).sample_ms(&mut rng),
            Duration::from_millis(20)
        );
    }
}
