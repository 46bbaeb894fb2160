//! `goodput profile sample --k N`: a k-anonymity guard before a profile is shared.
//!
//! Every request is put in a group (model, input-length bucket, output-length bucket,
//! time bucket). Buckets start fine (half-octave lengths, 1 s times) and are widened step
//! by step (lengths ×2, ×4, ×16, ×256 per bucket, then one bucket; times 10 s, 1 min,
//! 5 min, 15 min, 1 h, 6 h, 1 day, then one bucket) until the requests in groups smaller
//! than k are at most `max_drop` of the total; those are then dropped. In the output each
//! length is replaced by its bucket's geometric middle (the median of all lengths once
//! there is one bucket), each arrival by its time bucket's start, and `hash_ids` and
//! `tenant` are removed (either could single a request out). The header records what was
//! done (`anonymized`).

use std::{collections::HashMap, io::Write};

use serde::Serialize;

use super::{
    format::{Anonymized, from_unix_ms},
    read::Profile,
    stats,
};

/// Length bucket factors per level; `None` = one bucket.
const LENGTH_FACTORS: [Option<f64>; 6] = [
    Some(std::f64::consts::SQRT_2),
    Some(2.0),
    Some(4.0),
    Some(16.0),
    Some(256.0),
    None,
];
/// Time bucket widths per level (ms); `None` = one bucket.
const TIME_WIDTHS: [Option<i64>; 9] = [
    Some(1_000),
    Some(10_000),
    Some(60_000),
    Some(300_000),
    Some(900_000),
    Some(3_600_000),
    Some(21_600_000),
    Some(86_400_000),
    None,
];

/// What `sample` coarsened and dropped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleReport {
    pub k: u64,
    /// Length bucket factor (0 = one bucket for all lengths).
    pub length_bucket_factor: f64,
    /// Time bucket width in ms (0 = one bucket for the whole profile).
    pub time_bucket_ms: i64,
    pub kept: usize,
    pub dropped: usize,
}

#[derive(Clone, Copy)]
struct Level {
    length: Option<f64>,
    time: Option<i64>,
}

fn schedule() -> Vec<Level> {
    let (mut l, mut t) = (0usize, 0usize);
    let mut out = vec![(l, t)];
    while l + 1 < LENGTH_FACTORS.len() || t + 1 < TIME_WIDTHS.len() {
        if t <= l && t + 1 < TIME_WIDTHS.len() || l + 1 >= LENGTH_FACTORS.len() {
            t += 1;
        } else {
            l += 1;
        }
        out.push((l, t));
    }
    out.into_iter()
        .map(|(l, t)| Level {
            length: LENGTH_FACTORS[l],
            time: TIME_WIDTHS[t],
        })
        .collect()
}

fn length_bucket(v: Option<u64>, factor: Option<f64>) -> i64 {
    match (v, factor) {
        (None, _) => -2,
        (Some(0), _) => -1,
        (Some(_), None) => 0,
        (Some(v), Some(f)) => ((v as f64).ln() / f.ln()).floor() as i64,
    }
}

fn representative(v: Option<u64>, factor: Option<f64>, median: u64) -> Option<u64> {
    match (v, factor) {
        (None, _) => None,
        (Some(0), _) => Some(0),
        (Some(_), None) => Some(median),
        (Some(_), Some(f)) => {
            let b = length_bucket(v, factor) as f64;
            Some(f.powf(b + 0.5).round() as u64)
        }
    }
}

/// Writes the k-anonymous version of `profile` to `out`.
pub fn k_anonymize(
    profile: &Profile,
    k: usize,
    max_drop: f64,
    out: &mut dyn Write,
) -> std::io::Result<SampleReport> {
    let k = k.max(1);
    let entries = &profile.entries;
    let key = |i: usize, lv: Level| {
        let e = &entries[i].entry;
        let t = lv.time.map_or(0, |w| entries[i].at_ms.div_euclid(w));
        (
            e.model.clone(),
            length_bucket(e.input_tokens, lv.length),
            length_bucket(e.output_tokens, lv.length),
            t,
        )
    };
    let levels = schedule();
    let mut chosen = levels[levels.len() - 1];
    let mut keep: Vec<bool> = vec![true; entries.len()];
    for lv in levels {
        let mut counts: HashMap<_, usize> = HashMap::new();
        for i in 0..entries.len() {
            *counts.entry(key(i, lv)).or_insert(0) += 1;
        }
        let small: Vec<bool> = (0..entries.len())
            .map(|i| counts[&key(i, lv)] < k)
            .collect();
        let dropped = small.iter().filter(|s| **s).count();
        chosen = lv;
        keep = small.iter().map(|s| !s).collect();
        if dropped as f64 <= max_drop * entries.len() as f64 {
            break;
        }
    }
    let median = |f: fn(&super::format::Entry) -> Option<u64>| {
        let mut v: Vec<f64> = entries
            .iter()
            .filter_map(|l| f(&l.entry))
            .map(|n| n as f64)
            .collect();
        v.sort_by(f64::total_cmp);
        stats::percentile(&v, 0.5).unwrap_or(0.0) as u64
    };
    let (mi, mo) = (median(|e| e.input_tokens), median(|e| e.output_tokens));
    let mx = median(|e| e.max_tokens);
    let kept: Vec<usize> = (0..entries.len()).filter(|i| keep[*i]).collect();
    let bucket_start = |at: i64| {
        chosen
            .time
            .map_or(entries.first().map_or(at, |e| e.at_ms), |w| {
                at.div_euclid(w) * w
            })
    };
    let start_ms = kept
        .iter()
        .map(|i| bucket_start(entries[*i].at_ms))
        .min()
        .unwrap_or(0);
    let report = SampleReport {
        k: k as u64,
        length_bucket_factor: chosen.length.unwrap_or(0.0),
        time_bucket_ms: chosen.time.unwrap_or(0),
        kept: kept.len(),
        dropped: entries.len() - kept.len(),
    };
    let Some(first) = profile.files.first() else {
        return Err(std::io::Error::other("no profile file to sample"));
    };
    let mut header = first.header.clone();
    header.started_at = humantime::format_rfc3339_millis(from_unix_ms(start_ms)).to_string();
    header.anonymized = Some(Anonymized {
        k: report.k,
        length_bucket_factor: report.length_bucket_factor,
        time_bucket_ms: report.time_bucket_ms,
        dropped: report.dropped as u64,
    });
    writeln!(
        out,
        "{}",
        serde_json::to_string(&header).map_err(std::io::Error::other)?
    )?;
    for i in kept {
        let mut e = entries[i].entry.clone();
        e.t_ms = bucket_start(entries[i].at_ms) - start_ms;
        e.input_tokens = representative(e.input_tokens, chosen.length, mi);
        e.output_tokens = representative(e.output_tokens, chosen.length, mo);
        e.max_tokens = representative(e.max_tokens, chosen.length, mx);
        e.hash_ids = None;
        e.tenant = None;
        e.ttft_ms = e.ttft_ms.map(f64::round);
        e.tpot_ms = e.tpot_ms.map(f64::round);
        e.e2e_ms = e.e2e_ms.round();
        writeln!(
            out,
            "{}",
            serde_json::to_string(&e).map_err(std::io::Error::other)?
        )?;
    }
    out.flush()?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_ends_fully_coarse() {
        let s = schedule();
        assert!(s[0].length.is_some() && s[0].time == Some(1_000));
        let last = s[s.len() - 1];
        assert!(last.length.is_none() && last.time.is_none());
        assert_eq!(s.len(), LENGTH_FACTORS.len() + TIME_WIDTHS.len() - 1);
    }

    #[test]
    fn buckets_and_representatives() {
        assert_eq!(length_bucket(Some(100), Some(2.0)), 6);
        assert_eq!(representative(Some(100), Some(2.0), 0), Some(91));
        assert_eq!(representative(Some(0), Some(2.0), 0), Some(0));
        assert_eq!(representative(Some(7), None, 42), Some(42));
        assert_eq!(representative(None, None, 42), None);
    }
}
