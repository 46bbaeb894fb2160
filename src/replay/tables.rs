//! What the run's finished requests point into, so that each keeps only fixed-size fields
//! (a [`super::tally::Sample`] holds no string and no per-token list):
//!
//! - the names reports group by (SLO class, model), interned once per run and resolved
//!   back when the report is built;
//! - the inter-token gaps of *measured* requests, folded as each one finishes into the HDR
//!   histogram of its group: its step (for a soak, its reporting interval), SLO class and
//!   model. Every set of requests a report reads ITL over (a step, a soak interval, the
//!   run, a model, a class within any of those) is a union of whole groups, so merging
//!   their histograms gives exactly the histogram of all their gaps. Requests outside a
//!   measuring window (warm-up, extra requests) are never read for ITL and keep no gaps.
//!
//! A group keeps its first [`RAW_MAX`] gaps as they are (4 bytes each), then turns them
//! into an HDR histogram (3 significant digits, `u32` counters) that grows with the range
//! of its gaps, not with their number: 28 KB for gaps up to 65 ms, 48 KB up to 4 s. Both
//! give the same percentiles: a merge records raw gaps into the same buckets.

use std::collections::HashMap;

use hdrhistogram::Histogram;

use super::tally::Pcts;

/// An interned name.
pub type NameId = u32;
/// An ITL group; [`NO_GROUP`] for requests whose gaps are not kept.
pub type GroupId = u32;
pub const NO_GROUP: GroupId = u32::MAX;

/// Significant digits of the ITL histograms: each percentile within 0.1% of the exact
/// nearest-rank value (and never below it).
pub const ITL_SIGFIG: u8 = 3;

/// The group a measured request's gaps are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub step: usize,
    /// Reporting interval within the step (soak), else 0; see [`slice_of`].
    pub slice: u32,
    pub class: NameId,
    pub model: NameId,
}

/// Gaps a group keeps raw before it turns them into a histogram: 16 KB, less than the
/// histogram of gaps up to 65 ms.
pub const RAW_MAX: usize = 4096;

#[derive(Debug, Default)]
struct Group {
    /// The first gaps, until [`RAW_MAX`].
    raw: Vec<u32>,
    /// Then every gap (auto-resizing).
    hist: Option<Histogram<u32>>,
    sum: u64,
    count: u64,
    max: Option<u32>,
    /// Requests counted in the group (with or without gaps).
    requests: u64,
}

/// The run's names and ITL groups (see the module doc).
#[derive(Debug, Default)]
pub struct Tables {
    names: Vec<String>,
    ids: HashMap<String, NameId>,
    groups: Vec<Group>,
    keys: HashMap<Key, GroupId>,
}

/// The reporting interval `ended_s` falls in, counted from `lo` in steps of `interval`
/// seconds (0 before `lo`); the soak report cuts its step at the same points.
pub fn slice_of(ended_s: f64, lo: f64, interval: f64) -> u32 {
    if interval > 0.0 {
        ((ended_s - lo) / interval)
            .floor()
            .clamp(0.0, f64::from(u32::MAX - 1)) as u32
    } else {
        0
    }
}

impl Tables {
    /// The id of `name`, adding it on first use.
    pub fn intern(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = NameId::try_from(self.names.len()).unwrap_or(NameId::MAX);
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }

    /// The id of `name` if any request carried it.
    pub fn id(&self, name: &str) -> Option<NameId> {
        self.ids.get(name).copied()
    }

    /// The name behind `id` (empty for an id this table never gave out).
    pub fn name(&self, id: NameId) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }

    /// Counts one measured request and its gaps (µs) in the group of `key`.
    pub fn record(&mut self, key: Key, gaps_us: &[u32]) -> GroupId {
        let next = GroupId::try_from(self.groups.len()).unwrap_or(NO_GROUP);
        let id = *self.keys.entry(key).or_insert(next);
        if id == next {
            self.groups.push(Group::default());
        }
        let Some(g) = self.groups.get_mut(id as usize) else {
            return NO_GROUP;
        };
        g.requests += 1;
        if gaps_us.is_empty() {
            return id;
        }
        if g.hist.is_none() && g.raw.len() + gaps_us.len() > RAW_MAX {
            // Cannot fail for a constant precision; if it did, the gaps would stay raw.
            if let Ok(mut h) = Histogram::new(ITL_SIGFIG) {
                for &gap in &g.raw {
                    // Auto-resizing: any u32 fits.
                    let _ = h.record(u64::from(gap));
                }
                g.raw = Vec::new();
                g.hist = Some(h);
            }
        }
        for &gap in gaps_us {
            match g.hist.as_mut() {
                Some(h) => {
                    let _ = h.record(u64::from(gap));
                }
                None => g.raw.push(gap),
            }
            g.sum += u64::from(gap);
            g.count += 1;
            g.max = Some(g.max.map_or(gap, |m| m.max(gap)));
        }
        id
    }

    /// The gaps of the requests whose groups are `groups` (one entry per request;
    /// [`NO_GROUP`] entries are skipped). The requests must make up whole groups, which
    /// every set a report reads ITL over does (see the module doc).
    pub fn gaps(&self, groups: impl Iterator<Item = GroupId>) -> Gaps {
        let mut ids: Vec<GroupId> = groups.filter(|g| *g != NO_GROUP).collect();
        ids.sort_unstable();
        let mut out = Gaps::new();
        let mut i = 0;
        while let Some(&id) = ids.get(i) {
            let n = ids[i..].iter().take_while(|g| **g == id).count();
            i += n;
            let Some(g) = self.groups.get(id as usize) else {
                continue;
            };
            debug_assert_eq!(n as u64, g.requests, "ITL read over part of a group");
            out.add(g);
        }
        out
    }

    /// Heap bytes of the groups' gaps and histograms (counters only).
    pub fn itl_heap_bytes(&self) -> usize {
        self.groups
            .iter()
            .map(|g| {
                let hist = g.hist.as_ref().map_or(0, Histogram::distinct_values);
                (g.raw.capacity() + hist) * std::mem::size_of::<u32>()
            })
            .sum()
    }
}

/// Every gap of a set of requests, as one histogram (µs) with exact count, sum and max.
#[derive(Debug)]
pub struct Gaps {
    hist: Option<Histogram<u64>>,
    count: u64,
    sum: u64,
    max: Option<u32>,
}

impl Gaps {
    fn new() -> Gaps {
        Gaps {
            // Cannot fail for these constant bounds; without it only the percentiles go.
            hist: Histogram::new_with_bounds(1, u64::from(u32::MAX), ITL_SIGFIG).ok(),
            count: 0,
            sum: 0,
            max: None,
        }
    }

    fn add(&mut self, g: &Group) {
        self.count += g.count;
        self.sum += g.sum;
        self.max = self.max.max(g.max);
        let Some(h) = self.hist.as_mut() else {
            return;
        };
        for &gap in &g.raw {
            h.saturating_record(u64::from(gap));
        }
        // A bucket's highest value falls in the same bucket.
        for v in g.hist.iter().flat_map(Histogram::iter_recorded) {
            h.saturating_record_n(v.value_iterated_to(), u64::from(v.count_at_value()));
        }
    }

    /// The `q` quantile in ms: the nearest-rank value rounded up to its histogram bucket
    /// (at most 0.1% above it), never above the largest gap; `None` without gaps.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let h = self.hist.as_ref().filter(|_| self.count > 0)?;
        let max = u64::from(self.max?);
        Some(h.value_at_quantile(q).min(max) as f64 / 1000.0)
    }

    /// Count, mean and max exact; P50..P99 as [`Gaps::quantile_ms`].
    pub fn pcts(&self) -> Pcts {
        let n = self.count;
        Pcts {
            count: n as usize,
            mean: (n > 0).then(|| self.sum as f64 / n as f64 / 1000.0),
            p50: self.quantile_ms(0.5),
            p90: self.quantile_ms(0.9),
            p95: self.quantile_ms(0.95),
            p99: self.quantile_ms(0.99),
            max: self.max.map(|m| f64::from(m) / 1000.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_histogram_groups_give_the_same_gaps() {
        let gaps: Vec<u32> = (0..3 * RAW_MAX as u32)
            .map(|i| 5_000 + (i * 7_919) % 45_000)
            .collect();
        let (mut raw, mut dense) = (Tables::default(), Tables::default());
        let key = |step| Key {
            step,
            slice: 0,
            class: 0,
            model: 0,
        };
        // One group per 100 gaps stays raw; one group of them all turns into a histogram.
        let ids: Vec<GroupId> = gaps
            .chunks(100)
            .enumerate()
            .map(|(i, c)| raw.record(key(i), c))
            .collect();
        let one: Vec<GroupId> = gaps.chunks(100).map(|c| dense.record(key(0), c)).collect();
        assert_eq!(raw.itl_heap_bytes() % 4, 0);
        assert!(
            dense.itl_heap_bytes() <= 28 << 10,
            "{}",
            dense.itl_heap_bytes()
        );
        let (a, b) = (raw.gaps(ids.into_iter()), dense.gaps(one.into_iter()));
        assert_eq!(a.pcts(), b.pcts());
        assert_eq!(a.pcts().count, gaps.len());
        for q in [0.0, 0.5, 0.999, 1.0] {
            assert_eq!(a.quantile_ms(q), b.quantile_ms(q));
        }
    }

    #[test]
    fn slices_cut_at_whole_intervals() {
        assert_eq!(slice_of(9.999, 0.0, 10.0), 0);
        assert_eq!(slice_of(10.0, 0.0, 10.0), 1);
        assert_eq!(slice_of(1.0, 2.0, 10.0), 0);
        assert_eq!(slice_of(100.0, 0.0, 0.0), 0);
    }
}
