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

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    io::Write,
};

use serde::Serialize;

use super::{
    format::{Anonymized, Entry, Header, from_unix_ms},
    read::Profile,
    sorted::{SortError, Sorted},
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
    let header = anonymized_header(&first.header, start_ms, &report);
    writeln!(
        out,
        "{}",
        serde_json::to_string(&header).map_err(std::io::Error::other)?
    )?;
    for i in kept {
        let t_ms = bucket_start(entries[i].at_ms) - start_ms;
        let e = coarsened(&entries[i].entry, t_ms, chosen, [mi, mo, mx]);
        writeln!(
            out,
            "{}",
            serde_json::to_string(&e).map_err(std::io::Error::other)?
        )?;
    }
    out.flush()?;
    Ok(report)
}

/// The first file's header, starting at `start_ms`, saying what was done.
fn anonymized_header(first: &Header, start_ms: i64, report: &SampleReport) -> Header {
    let mut header = first.clone();
    header.started_at = humantime::format_rfc3339_millis(from_unix_ms(start_ms)).to_string();
    header.anonymized = Some(Anonymized {
        k: report.k,
        length_bucket_factor: report.length_bucket_factor,
        time_bucket_ms: report.time_bucket_ms,
        dropped: report.dropped as u64,
    });
    header
}

/// A kept request as written: arrival at its bucket, lengths at their representatives
/// (`medians`: input, output, max tokens), no ids or tenant, latencies rounded to 1 ms.
fn coarsened(entry: &Entry, t_ms: i64, lv: Level, medians: [u64; 3]) -> Entry {
    let [mi, mo, mx] = medians;
    let mut e = entry.clone();
    e.t_ms = t_ms;
    e.input_tokens = representative(e.input_tokens, lv.length, mi);
    e.output_tokens = representative(e.output_tokens, lv.length, mo);
    e.max_tokens = representative(e.max_tokens, lv.length, mx);
    e.hash_ids = None;
    e.tenant = None;
    e.ttft_ms = e.ttft_ms.map(f64::round);
    e.tpot_ms = e.tpot_ms.map(f64::round);
    e.e2e_ms = e.e2e_ms.round();
    e
}

/// Writes the k-anonymous version of `sorted`'s requests to `out` in bounded memory, the
/// same output as [`k_anonymize`], in two passes over the sorted requests.
///
/// Pass one counts the groups of every level at once, one time bucket at a time (the
/// requests arrive in order, so a bucket's groups are final when the next bucket
/// starts): memory is the groups of one bucket per level, the length counts for the
/// medians, and, per level, the groups smaller than k only while they hold at most
/// `max_drop` of the requests (past that the level cannot be chosen; the last, fully
/// coarse level has few groups and keeps them all). Pass two writes the requests that
/// are not in a small group of the chosen level.
pub fn k_anonymize_sorted(
    sorted: &Sorted,
    k: usize,
    max_drop: f64,
    out: &mut dyn Write,
) -> Result<SampleReport, SortError> {
    let k = k.max(1);
    let n = sorted.requests();
    let earliest = sorted.earliest();
    let levels = schedule();
    let last = levels.len() - 1;
    let cap = max_drop * n as f64;
    let mut passes: Vec<LevelPass> = levels
        .iter()
        .enumerate()
        .map(|(i, lv)| LevelPass::new(*lv, if i == last { f64::INFINITY } else { cap }))
        .collect();
    let mut models: HashMap<Option<String>, u32> = HashMap::new();
    let mut lengths: [BTreeMap<u64, u64>; 3] = Default::default();
    sorted.for_each(&mut |_, l| {
        let e = &l.entry;
        let model = intern(&mut models, &e.model);
        for p in &mut passes {
            p.add(model, l.at_ms, e.input_tokens, e.output_tokens, k);
        }
        for (m, v) in lengths
            .iter_mut()
            .zip([e.input_tokens, e.output_tokens, e.max_tokens])
        {
            if let Some(v) = v {
                *m.entry(v).or_insert(0) += 1;
            }
        }
        Ok::<_, SortError>(())
    })?;
    for p in &mut passes {
        p.close(k);
    }
    let chosen = passes
        .iter()
        .position(|p| p.dropped as f64 <= cap)
        .unwrap_or(last);
    let pass = &passes[chosen];
    let lv = pass.level;
    let [mi, mo, mx] = lengths.map(|m| median(&m));
    let bucket_start = |at: i64| {
        lv.time
            .map_or(earliest.unwrap_or(at), |w| at.div_euclid(w) * w)
    };
    let start_ms = match (pass.first_kept, lv.time) {
        (None, _) => 0,
        (Some(_), None) => earliest.unwrap_or(0),
        (Some(t), Some(w)) => t * w,
    };
    let report = SampleReport {
        k: k as u64,
        length_bucket_factor: lv.length.unwrap_or(0.0),
        time_bucket_ms: lv.time.unwrap_or(0),
        kept: n - pass.dropped,
        dropped: pass.dropped,
    };
    let Some(first) = sorted.profile().files.first() else {
        return Err(SortError::Write(std::io::Error::other(
            "no profile file to sample",
        )));
    };
    let header = anonymized_header(&first.header, start_ms, &report);
    writeln!(
        out,
        "{}",
        serde_json::to_string(&header)
            .map_err(std::io::Error::other)
            .map_err(SortError::Write)?
    )
    .map_err(SortError::Write)?;
    sorted.for_each(&mut |_, l| {
        let model = models.get(&l.entry.model).copied().unwrap_or(u32::MAX);
        if pass.small.contains(&pass.key(model, l.at_ms, &l.entry)) {
            return Ok(());
        }
        let e = coarsened(&l.entry, bucket_start(l.at_ms) - start_ms, lv, [mi, mo, mx]);
        let line = serde_json::to_string(&e)
            .map_err(std::io::Error::other)
            .map_err(SortError::Write)?;
        writeln!(out, "{line}").map_err(SortError::Write)
    })?;
    out.flush().map_err(SortError::Write)?;
    Ok(report)
}

fn intern(models: &mut HashMap<Option<String>, u32>, model: &Option<String>) -> u32 {
    if let Some(i) = models.get(model) {
        return *i;
    }
    let i = u32::try_from(models.len()).unwrap_or(u32::MAX);
    models.insert(model.clone(), i);
    i
}

/// The nearest-rank median of counted values (as `stats::percentile`), 0 when none.
fn median(counts: &BTreeMap<u64, u64>) -> u64 {
    let len: u64 = counts.values().sum();
    if len == 0 {
        return 0;
    }
    let rank = ((0.5 * len as f64).ceil() as u64).clamp(1, len);
    let mut seen = 0;
    for (v, c) in counts {
        seen += c;
        if seen >= rank {
            return *v;
        }
    }
    0
}

/// A group of one level within its time bucket: model (interned), length buckets.
type Group = (u32, i64, i64);

/// One level's groups, counted a time bucket at a time.
struct LevelPass {
    level: Level,
    cap: f64,
    bucket: Option<i64>,
    groups: HashMap<Group, usize>,
    dropped: usize,
    /// Groups smaller than k, by time bucket; emptied once they hold more than `cap`.
    small: HashSet<(i64, Group)>,
    /// The first time bucket with a group of at least k.
    first_kept: Option<i64>,
}

impl LevelPass {
    fn new(level: Level, cap: f64) -> LevelPass {
        LevelPass {
            level,
            cap,
            bucket: None,
            groups: HashMap::new(),
            dropped: 0,
            small: HashSet::new(),
            first_kept: None,
        }
    }

    fn key(&self, model: u32, at_ms: i64, e: &super::format::Entry) -> (i64, Group) {
        (
            self.level.time.map_or(0, |w| at_ms.div_euclid(w)),
            (
                model,
                length_bucket(e.input_tokens, self.level.length),
                length_bucket(e.output_tokens, self.level.length),
            ),
        )
    }

    fn add(&mut self, model: u32, at_ms: i64, input: Option<u64>, output: Option<u64>, k: usize) {
        let t = self.level.time.map_or(0, |w| at_ms.div_euclid(w));
        if self.bucket != Some(t) {
            self.close(k);
            self.bucket = Some(t);
        }
        let g = (
            model,
            length_bucket(input, self.level.length),
            length_bucket(output, self.level.length),
        );
        *self.groups.entry(g).or_insert(0) += 1;
    }

    /// The current time bucket is complete.
    fn close(&mut self, k: usize) {
        let Some(t) = self.bucket else { return };
        for (g, n) in self.groups.drain() {
            if n >= k {
                self.first_kept.get_or_insert(t);
                continue;
            }
            self.dropped += n;
            if self.dropped as f64 <= self.cap {
                self.small.insert((t, g));
            } else {
                self.small = HashSet::new();
            }
        }
        self.bucket = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::sorted::tests::finish_ordered_files;

    #[test]
    fn the_streaming_sample_writes_what_the_in_memory_one_does() {
        let (dir, paths) = finish_ordered_files("sample");
        let profile = Profile::read(&paths).unwrap();
        let sorted = Sorted::read_in_runs(&paths, 4096).unwrap();
        // From the finest level kept to the fully coarse one (nothing fits: the last).
        for (k, max_drop) in [
            (1, 0.0),
            (2, 0.5),
            (3, 0.01),
            (5, 0.01),
            (40, 0.0),
            (600, 0.0),
        ] {
            let mut exact = Vec::new();
            let want = k_anonymize(&profile, k, max_drop, &mut exact).unwrap();
            let mut streamed = Vec::new();
            let got = k_anonymize_sorted(&sorted, k, max_drop, &mut streamed).unwrap();
            assert_eq!(got, want, "k {k}");
            assert!(streamed == exact, "k {k}");
        }
        assert_eq!(median(&BTreeMap::from([(1, 1), (5, 2), (9, 1)])), 5);
        assert_eq!(median(&BTreeMap::new()), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
