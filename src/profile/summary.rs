//! `goodput profile summarize`: what a profile says about its traffic, as text for people
//! and JSON (`--json`) for machines. The JSON field names are a contract.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    read::Profile,
    shape::{Shape, samples_of, shape_of_sorted},
    sorted::{SortError, Sorted},
    stats,
};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Distribution {
    pub count: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    /// Octave buckets: (lower bound, requests); `[0, 1)` then `[2^k, 2^(k+1))`.
    pub histogram: Vec<(u64, u64)>,
}

impl Distribution {
    fn of(values: &stats::Counts) -> Distribution {
        let q = |q| values.percentile(q);
        let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
        for (v, k) in values.iter() {
            let floor = if v < 1.0 {
                0
            } else {
                1u64 << (v.log2().floor() as u32).min(62)
            };
            *buckets.entry(floor).or_insert(0) += k;
        }
        Distribution {
            count: values.len(),
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            max: values.max(),
            histogram: buckets.into_iter().collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Rate {
    pub mean_per_s: f64,
    pub peak_per_s: u64,
    /// Coefficient of variation of inter-arrival times (1 = Poisson, > 1 = bursty).
    pub burstiness_cv: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Slo {
    pub met: u64,
    pub missed: u64,
    pub attainment: Option<f64>,
}

/// The summary of one or more profile files.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub files: Vec<String>,
    pub requests: usize,
    pub started_at: Option<String>,
    pub duration_s: f64,
    pub arrival_rate: Rate,
    pub models: BTreeMap<String, u64>,
    pub apis: BTreeMap<String, u64>,
    pub stream_share: f64,
    pub input_tokens: Distribution,
    pub output_tokens: Distribution,
    /// Share of prompt blocks whose id was seen earlier in the profile.
    pub prefix_reuse: Option<f64>,
    pub outcomes: BTreeMap<String, u64>,
    pub slo: Slo,
    /// What the reader skipped or ignored.
    pub notes: Vec<String>,
}

impl Summary {
    pub fn of(profile: &Profile) -> Summary {
        let shape = Shape::of(&samples_of(profile), None);
        Summary::from_shape(shape, profile, profile.entries.first().map(|e| e.at_ms))
    }

    /// The same summary from files read in arrival order, in bounded memory (see
    /// [`shape_of_sorted`]).
    pub fn of_sorted(sorted: &Sorted) -> Result<Summary, SortError> {
        let shape = shape_of_sorted(sorted)?;
        Ok(Summary::from_shape(
            shape,
            sorted.profile(),
            sorted.earliest(),
        ))
    }

    /// `earliest`: the first arrival of any request (Unix ms).
    fn from_shape(shape: Shape, profile: &Profile, earliest: Option<i64>) -> Summary {
        let started_at = earliest.map(|at| {
            humantime::format_rfc3339_millis(super::format::from_unix_ms(at)).to_string()
        });
        Summary {
            files: profile
                .files
                .iter()
                .map(|f| f.path.display().to_string())
                .collect(),
            requests: shape.requests,
            started_at,
            duration_s: shape.duration_s,
            arrival_rate: Rate {
                mean_per_s: shape.rate_mean,
                peak_per_s: shape.rate_peak,
                burstiness_cv: shape.burstiness,
            },
            stream_share: shape.stream_share,
            input_tokens: Distribution::of(&shape.input),
            output_tokens: Distribution::of(&shape.output),
            prefix_reuse: shape.prefix_reuse,
            slo: Slo {
                met: shape.slo_met,
                missed: shape.slo_missed,
                attainment: shape.attainment(),
            },
            models: shape.models,
            apis: shape.apis,
            outcomes: shape.outcomes,
            notes: profile.notes(),
        }
    }

    /// The text form.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let pct = |x: f64| format!("{:.1}%", x * 100.0);
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or_else(|| "n/a".to_owned(), f);
        let _ = writeln!(o, "requests       {}", self.requests);
        if let Some(s) = &self.started_at {
            let _ = writeln!(o, "started        {s}");
        }
        let _ = writeln!(o, "duration       {:.1} s", self.duration_s);
        let r = &self.arrival_rate;
        let _ = writeln!(
            o,
            "arrival rate   mean {:.3}/s, peak {}/s, burstiness (CV) {}",
            r.mean_per_s,
            r.peak_per_s,
            opt(r.burstiness_cv, &|c| format!("{c:.2}"))
        );
        let _ = writeln!(o, "models         {}", mix(&self.models, self.requests));
        let _ = writeln!(o, "apis           {}", mix(&self.apis, self.requests));
        let _ = writeln!(o, "streamed       {}", pct(self.stream_share));
        let _ = writeln!(o, "prefix reuse   {}", opt(self.prefix_reuse, &pct));
        let _ = writeln!(o, "outcomes       {}", mix(&self.outcomes, self.requests));
        let _ = writeln!(
            o,
            "SLO            {} met, {} missed, attainment {}",
            self.slo.met,
            self.slo.missed,
            opt(self.slo.attainment, &pct)
        );
        for (label, d) in [
            ("input tokens", &self.input_tokens),
            ("output tokens", &self.output_tokens),
        ] {
            let v = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.0}"));
            let _ = writeln!(
                o,
                "\n{label} ({} requests): p50 {}  p90 {}  p95 {}  p99 {}  max {}",
                d.count,
                v(d.p50),
                v(d.p90),
                v(d.p95),
                v(d.p99),
                v(d.max)
            );
            let top = d
                .histogram
                .iter()
                .map(|(_, n)| *n)
                .max()
                .unwrap_or(1)
                .max(1);
            for (floor, n) in &d.histogram {
                let upper = if *floor == 0 {
                    1
                } else {
                    floor.saturating_mul(2)
                };
                let bar = "#".repeat(((*n as f64 / top as f64) * 40.0).ceil() as usize);
                let _ = writeln!(o, "  [{floor:>7}, {upper:>7})  {n:>8}  {bar}");
            }
        }
        for note in &self.notes {
            let _ = writeln!(o, "\nnote: {note}");
        }
        o
    }
}

fn mix(m: &BTreeMap<String, u64>, total: usize) -> String {
    if m.is_empty() {
        return "-".into();
    }
    let mut items: Vec<(&String, &u64)> = m.iter().collect();
    items.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    items
        .iter()
        .map(|(k, n)| format!("{k} {:.1}%", **n as f64 / total.max(1) as f64 * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::sorted::tests::finish_ordered_files;

    #[test]
    fn the_streaming_summary_is_the_in_memory_one() {
        let (dir, paths) = finish_ordered_files("summary");
        for files in [&paths[..1], &paths[..]] {
            let want = Summary::of(&Profile::read(files).unwrap());
            for run_bytes in [crate::profile::RUN_BYTES, 4096] {
                let got = Summary::of_sorted(&Sorted::read_in_runs(files, run_bytes).unwrap());
                let got = got.unwrap();
                assert_eq!(got, want);
                // Bit for bit, floats included.
                assert_eq!(
                    serde_json::to_string(&got).unwrap(),
                    serde_json::to_string(&want).unwrap()
                );
            }
            assert!(want.prefix_reuse.is_some() && want.arrival_rate.burstiness_cv.is_some());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn octave_histogram() {
        let d = Distribution::of(&stats::Counts::from_sorted(&[0.0, 1.0, 3.0, 3.5, 700.0]));
        assert_eq!(d.histogram, [(0, 1), (1, 1), (2, 2), (512, 1)]);
        assert_eq!(d.p50, Some(3.0));
        assert_eq!(d.max, Some(700.0));
    }
}
