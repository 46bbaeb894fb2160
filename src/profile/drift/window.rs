//! The live window in fixed memory: what the [`super::Monitor`] compares with the
//! baseline, kept as mergeable summaries instead of the requests themselves.
//!
//! The window is cut into [`PANES`] panes by finish time (`window / PANES` each, plus the
//! pane being filled). A pane holds counts: requests, lengths in fixed bins, model, API
//! and outcome mixes, streamed, prompt blocks and reused blocks, Σ e2e, SLO met and
//! missed. An evaluation adds the panes up; the oldest pane leaves whole once it is
//! older than the window. Beside the panes, with fixed sizes:
//!
//! - the newest [`ARRIVALS`] arrival times, for burstiness and the peak rate;
//! - a table of the blocks seen in the window and the pane they were last seen in
//!   ([`REUSE_SLOTS`] slots, set-associative), for prefix reuse.
//!
//! What each statistic costs against keeping every request (tested against that exact
//! computation in `live_tests`):
//!
//! | statistic | here | exact when |
//! |---|---|---|
//! | requests, rates, mixes (TVD), concurrency, SLO counts | equal (Σ e2e up to float rounding) | always |
//! | window edge | requests up to `window + window / PANES` old count | – |
//! | PSI of lengths | equal: the bins nest in PSI's half-octave bins | always |
//! | length percentiles | the bin's lower end: under 1/128 (0.8%) below the value | lengths < 1024 |
//! | KS of lengths | within the largest share of either side's requests in one bin | lengths < 1024 |
//! | burstiness, peak rate | over the newest [`ARRIVALS`] arrivals | window ≤ [`ARRIVALS`] requests |
//! | prefix reuse | reuse of blocks pushed out of a full table is missed | ≤ 4 live blocks per set |
//!
//! Categories (models, APIs, outcomes) past [`MAX_CATEGORIES`] distinct names in one pane
//! count under [`OTHER`], so a client inventing model names cannot grow it either.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    time::{Duration, Instant},
};

use crate::profile::{
    ProfileLine,
    shape::Shape,
    stats::{self, Counts},
};

/// Panes a window is cut into: the window's edge moves by `window / PANES`.
pub const PANES: u64 = 60;
/// Arrival times kept (8 bytes each plus the pane: 1 MiB).
pub const ARRIVALS: usize = 1 << 16;
/// Slots of the prefix-reuse table (16 bytes each: 16 MiB, allocated on the first block).
pub const REUSE_SLOTS: usize = 1 << 20;
/// Slots per set of the reuse table.
const WAYS: usize = 4;
/// Distinct names per category and pane before the rest count as [`OTHER`].
pub const MAX_CATEGORIES: usize = 256;
/// Where names past [`MAX_CATEGORIES`] are counted.
pub const OTHER: &str = "(other)";

/// Lengths below this are kept exactly.
const EXACT_BELOW: u64 = 1024;
/// Above [`EXACT_BELOW`], each octave is cut into 2^this bins (relative width ≤ 1/128).
const SUB_BIN_BITS: u32 = 7;

/// The bin of a length, named by the smallest length in it. Exact below 1024; above,
/// 128 bins per octave, each split where one of PSI's half-octave bins
/// ([`stats::log_bin`]) begins, so every bin lies inside one of those.
pub fn length_bin(v: u64) -> u64 {
    if v < EXACT_BELOW {
        return v;
    }
    let octave = 63 - v.leading_zeros();
    let width = 1u64 << (octave - SUB_BIN_BITS);
    let lower = v - v % width;
    let bin = |x: u64| stats::log_bin(x as f64);
    let k = bin(v);
    if bin(lower) == k {
        return lower;
    }
    // A half-octave boundary falls inside: the first length of v's half-octave bin.
    let (mut below, mut at) = (lower, v);
    while at - below > 1 {
        let mid = below + (at - below) / 2;
        if bin(mid) == k {
            at = mid;
        } else {
            below = mid;
        }
    }
    at
}

/// Lengths as counts per bin ([`length_bin`]).
pub fn binned(c: &Counts) -> Counts {
    let mut m = BTreeMap::new();
    for (v, k) in c.iter() {
        *m.entry(length_bin(v as u64)).or_insert(0) += k;
    }
    Counts::from_map(&m)
}

/// One pane: the counts of the requests that finished in it.
#[derive(Debug, Default, Clone, PartialEq)]
struct Pane {
    requests: usize,
    input: BTreeMap<u64, u64>,
    output: BTreeMap<u64, u64>,
    models: BTreeMap<String, u64>,
    apis: BTreeMap<String, u64>,
    outcomes: BTreeMap<String, u64>,
    streamed: usize,
    blocks: u64,
    reused: u64,
    e2e_ms: f64,
    slo_met: u64,
    slo_missed: u64,
}

impl Pane {
    fn add(&mut self, l: &ProfileLine, blocks: u64, reused: u64) {
        self.requests += 1;
        for (v, m) in [
            (l.input_tokens, &mut self.input),
            (l.output_tokens, &mut self.output),
        ] {
            if let Some(v) = v {
                *m.entry(length_bin(v)).or_insert(0) += 1;
            }
        }
        count(&mut self.models, l.model.as_deref().unwrap_or("unknown"), 1);
        count(&mut self.apis, &l.api, 1);
        count(&mut self.outcomes, l.outcome, 1);
        self.streamed += usize::from(l.stream);
        self.blocks += blocks;
        self.reused += reused;
        self.e2e_ms += l.e2e_ms.max(0.0);
        match l.slo_met {
            Some(true) => self.slo_met += 1,
            Some(false) => self.slo_missed += 1,
            None => {}
        }
    }

    fn merge(&mut self, o: &Pane) {
        self.requests += o.requests;
        for (m, from) in [(&mut self.input, &o.input), (&mut self.output, &o.output)] {
            for (v, k) in from {
                *m.entry(*v).or_insert(0) += k;
            }
        }
        for (m, from) in [
            (&mut self.models, &o.models),
            (&mut self.apis, &o.apis),
            (&mut self.outcomes, &o.outcomes),
        ] {
            for (name, k) in from {
                count(m, name, *k);
            }
        }
        self.streamed += o.streamed;
        self.blocks += o.blocks;
        self.reused += o.reused;
        self.e2e_ms += o.e2e_ms;
        self.slo_met += o.slo_met;
        self.slo_missed += o.slo_missed;
    }
}

/// Counts `k` under `name`, or under [`OTHER`] once the map holds [`MAX_CATEGORIES`].
fn count(m: &mut BTreeMap<String, u64>, name: &str, k: u64) {
    if let Some(c) = m.get_mut(name) {
        *c += k;
    } else if m.len() < MAX_CATEGORIES {
        m.insert(name.to_owned(), k);
    } else {
        *m.entry(OTHER.to_owned()).or_insert(0) += k;
    }
}

/// Blocks seen in the window: a set-associative table of (fingerprint, last pane seen).
/// A fingerprint counts as seen while its pane is in the window. A new fingerprint takes
/// a free or expired slot of its set, else the one seen longest ago.
#[derive(Debug, Default)]
struct Reuse {
    slots: Vec<Slot>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    hash: u64,
    /// The pane last seen in, plus one (0: empty).
    pane: u64,
}

impl Reuse {
    /// How many of `hashes` were seen in a pane from `oldest` on; then marks them all seen
    /// in `pane`. Repeats within `hashes` count as new, as they would against the
    /// requests before it.
    fn observe(&mut self, hashes: &[u64], pane: u64, oldest: u64) -> u64 {
        if hashes.is_empty() {
            return 0;
        }
        if self.slots.is_empty() {
            self.slots = vec![Slot::default(); REUSE_SLOTS];
        }
        let sets = REUSE_SLOTS / WAYS;
        let set_of = |h: u64| (h % sets as u64) as usize * WAYS;
        let live = |s: &Slot| s.pane > oldest;
        let reused = hashes
            .iter()
            .filter(|h| {
                let at = set_of(**h);
                self.slots[at..at + WAYS]
                    .iter()
                    .any(|s| s.hash == **h && live(s))
            })
            .count() as u64;
        for h in hashes {
            let at = set_of(*h);
            let set = &mut self.slots[at..at + WAYS];
            let slot = match set.iter().position(|s| s.hash == *h && s.pane > 0) {
                Some(i) => i,
                None => set
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| if live(s) { s.pane } else { 0 })
                    .map_or(0, |(i, _)| i),
            };
            set[slot] = Slot {
                hash: *h,
                pane: pane + 1,
            };
        }
        reused
    }

    fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// See the module doc.
#[derive(Debug)]
pub struct Window {
    pane_len: Duration,
    started: Option<Instant>,
    /// Pane number (since `started`) → its counts.
    panes: BTreeMap<u64, Pane>,
    /// The newest arrivals (Unix ms) with the pane of their request, oldest on top.
    arrivals: BinaryHeap<Reverse<(i64, u64)>>,
    reuse: Reuse,
    /// The newest pane observed or evaluated: older panes leave relative to it.
    newest: u64,
}

impl Window {
    pub fn new(window: Duration) -> Window {
        let pane_len = (window / PANES as u32).max(Duration::from_millis(1));
        Window {
            pane_len,
            started: None,
            panes: BTreeMap::new(),
            arrivals: BinaryHeap::new(),
            reuse: Reuse::default(),
            newest: 0,
        }
    }

    fn pane_of(&self, at: Instant) -> u64 {
        let since = self
            .started
            .map_or(Duration::ZERO, |s| at.saturating_duration_since(s));
        u64::try_from(since.as_nanos() / self.pane_len.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    /// Adds a request that finished at `at`; returns the pane it counts in, `None` when
    /// it finished before the window's oldest pane (and is not counted).
    pub fn observe(&mut self, line: &ProfileLine, at: Instant) -> Option<u64> {
        self.started.get_or_insert(at);
        let pane = self.pane_of(at);
        self.advance(pane);
        let oldest = self.oldest_pane();
        if pane < oldest {
            return None;
        }
        let reused = self.reuse.observe(&line.block_hashes, pane, oldest);
        let blocks = line.block_hashes.len() as u64;
        self.panes
            .entry(pane)
            .or_default()
            .add(line, blocks, reused);
        if self.arrivals.capacity() == 0 {
            // All at once: the heap's size is then fixed, not doubled as it fills.
            self.arrivals.reserve_exact(ARRIVALS + 1);
        }
        self.arrivals.push(Reverse((line.arrival_ms, pane)));
        if self.arrivals.len() > ARRIVALS {
            self.arrivals.pop();
        }
        Some(pane)
    }

    /// The oldest pane in the window: requests counted in older ones have left it.
    pub fn oldest_pane(&self) -> u64 {
        self.newest.saturating_sub(PANES)
    }

    /// Moves the window's end to `pane` if that is later, dropping panes that left it.
    fn advance(&mut self, pane: u64) {
        if pane <= self.newest {
            return;
        }
        self.newest = pane;
        let oldest = self.oldest_pane();
        self.panes = self.panes.split_off(&oldest);
        if self.arrivals.iter().any(|Reverse((_, p))| *p < oldest) {
            self.arrivals.retain(|Reverse((_, p))| *p >= oldest);
        }
    }

    /// The shape of the window ending at `now` (lengths binned as [`binned`]), and the
    /// seconds it covers: since the start of its oldest pane, or of the first request.
    pub fn shape(&mut self, now: Instant) -> (Shape, Duration) {
        let Some(started) = self.started else {
            return (Shape::of(&[], Some(0.0)), Duration::ZERO);
        };
        self.advance(self.pane_of(now));
        let nanos = self.pane_len.as_nanos() * u128::from(self.oldest_pane());
        // Never past `now`: the oldest pane starts at or before the one `now` is in.
        let from = u64::try_from(nanos / 1_000_000_000)
            .ok()
            .and_then(|secs| {
                started.checked_add(Duration::new(secs, (nanos % 1_000_000_000) as u32))
            })
            .unwrap_or(now);
        let covered = now.saturating_duration_since(from);
        let mut total = Pane::default();
        for p in self.panes.values() {
            total.merge(p);
        }
        let mut arrivals: Vec<i64> = self.arrivals.iter().map(|Reverse((a, _))| *a).collect();
        arrivals.sort_unstable();
        let n = total.requests;
        let duration_s = covered.as_secs_f64().max(1.0);
        let mut per_second: BTreeMap<i64, u64> = BTreeMap::new();
        for a in &arrivals {
            *per_second.entry(a.div_euclid(1000)).or_insert(0) += 1;
        }
        let shape = Shape {
            requests: n,
            duration_s,
            rate_mean: n as f64 / duration_s,
            rate_peak: per_second.values().copied().max().unwrap_or(0),
            burstiness: stats::interarrival_cv(&arrivals),
            input: Counts::from_map(&total.input),
            output: Counts::from_map(&total.output),
            models: total.models,
            apis: total.apis,
            stream_share: if n == 0 {
                0.0
            } else {
                total.streamed as f64 / n as f64
            },
            prefix_reuse: (total.blocks > 0).then(|| total.reused as f64 / total.blocks as f64),
            concurrency: (n > 0).then(|| total.e2e_ms / 1000.0 / duration_s),
            outcomes: total.outcomes,
            slo_met: total.slo_met,
            slo_missed: total.slo_missed,
        };
        (shape, covered)
    }

    /// Bytes held on the heap, counted from the tables' capacities (maps by entries):
    /// fixed once every pane, bin and category in use has been seen.
    pub fn heap_bytes(&self) -> usize {
        let lengths = |m: &BTreeMap<u64, u64>| m.len() * 16;
        let names = |m: &BTreeMap<String, u64>| m.keys().map(|k| k.capacity() + 32).sum::<usize>();
        let panes: usize = self
            .panes
            .values()
            .map(|p| {
                std::mem::size_of::<Pane>()
                    + lengths(&p.input)
                    + lengths(&p.output)
                    + names(&p.models)
                    + names(&p.apis)
                    + names(&p.outcomes)
            })
            .sum();
        panes
            + self.arrivals.capacity() * std::mem::size_of::<Reverse<(i64, u64)>>()
            + self.reuse.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_bins_are_exact_below_1024_and_nest_in_the_psi_bins() {
        for v in 0..EXACT_BELOW {
            assert_eq!(length_bin(v), v);
        }
        let mut prev = 0;
        for v in (EXACT_BELOW..3_000_000).chain([u64::MAX / 3, u64::MAX]) {
            let b = length_bin(v);
            assert!(b <= v && b >= prev, "{v} → {b}");
            assert_eq!(stats::log_bin(b as f64), stats::log_bin(v as f64), "{v}");
            assert!((v - b) as f64 <= b as f64 / 128.0, "{v} → {b}");
            // Bins are intervals: a value's bin is its own bin's name.
            assert_eq!(length_bin(b), b);
            prev = b;
        }
        assert_eq!(length_bin(1024), 1024);
        assert_eq!(length_bin(1031), 1024);
        assert_eq!(length_bin(1032), 1032);
        // √2 · 1024 = 1448.2: the half-octave bin starting at 1449 splits [1448, 1456).
        assert_eq!(length_bin(1447), 1440);
        assert_eq!(length_bin(1448), 1448);
        assert_eq!(length_bin(1449), 1449);
        assert_eq!(length_bin(1455), 1449);
        assert_eq!(length_bin(1456), 1456);
    }

    #[test]
    fn categories_past_the_bound_count_as_other() {
        let mut m = BTreeMap::new();
        for i in 0..MAX_CATEGORIES + 10 {
            count(&mut m, &format!("m{i}"), 1);
        }
        count(&mut m, "m0", 1);
        assert_eq!(m.len(), MAX_CATEGORIES + 1);
        assert_eq!(m[OTHER], 10);
        assert_eq!(m["m0"], 2);
    }

    #[test]
    fn the_reuse_table_forgets_expired_panes_and_keeps_the_recent_in_a_full_set() {
        let mut r = Reuse::default();
        assert_eq!(r.observe(&[1, 2, 3], 0, 0), 0);
        assert_eq!(r.observe(&[1, 2, 4, 4], 1, 0), 2);
        // Pane 0 left the window: 3 is forgotten, 1 and 2 were seen again in pane 1.
        assert_eq!(r.observe(&[1, 3], 5, 1), 1);
        // Five fingerprints of one set: the one seen longest ago gives way.
        let sets = (REUSE_SLOTS / WAYS) as u64;
        let same: Vec<u64> = (1..=5).map(|i| 7 + i * sets).collect();
        for (i, h) in same.iter().enumerate() {
            r.observe(&[*h], 10 + i as u64, 0);
        }
        assert_eq!(r.observe(&same[1..], 20, 0), 4);
        assert_eq!(r.observe(&same[..1], 20, 0), 0);
    }
}
