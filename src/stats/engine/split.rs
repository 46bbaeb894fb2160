//! Where requests' time went by the engine's own per-request timings, per class and model:
//! the distribution of each part (queue, prefill, decode, inference, outside the engine)
//! and which part the misses went to. Kept only for requests whose engine reported its
//! timings, so a deployment whose engine says nothing pays nothing here.
//!
//! Memory: five lazy histograms per (class, model) and slice; sparse (≤ 1 KB each) until a
//! slice sees more than 256 timed requests of that pair. Pairs are bounded by the classes
//! times [`super::MAX_MODELS`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Engine,
    hist::{Hist, Merged, Percentiles},
    ring::{Ring, Slice},
};
use crate::measure::record::Component;

const PARTS: usize = Component::ALL.len();

/// One (class, model) pair in one time slice.
#[derive(Debug, Default)]
pub struct SplitSlice {
    /// Indexed like [`Component::ALL`].
    parts: [Hist; PARTS],
    /// Requests with engine timings.
    timed: u64,
    /// Of those, misses attributed to a component, indexed like [`Component::ALL`].
    misses: [u64; PARTS],
}

impl SplitSlice {
    pub fn record(&mut self, parts: &[Option<f64>; PARTS], miss: Option<Component>) {
        self.timed = self.timed.saturating_add(1);
        for (h, v) in self.parts.iter_mut().zip(parts) {
            if let Some(ms) = v {
                h.record_ms(*ms);
            }
        }
        if let Some(i) = miss.and_then(|c| Component::ALL.iter().position(|x| *x == c))
            && let Some(n) = self.misses.get_mut(i)
        {
            *n = n.saturating_add(1);
        }
    }
}

impl Slice for SplitSlice {
    fn reset(&mut self) {
        self.parts.iter_mut().for_each(Hist::reset);
        self.timed = 0;
        self.misses = [0; PARTS];
    }
    fn heap_bytes(&self) -> usize {
        self.parts.iter().map(Hist::heap_bytes).sum()
    }
}

/// The rings of every (class, model) pair that had timed requests, one per window.
pub type Splits = BTreeMap<(String, String), Vec<Option<Ring<SplitSlice>>>>;

/// P50, P95 and P99 of one part, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PartPercentiles {
    pub count: u64,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl From<Percentiles> for PartPercentiles {
    fn from(p: Percentiles) -> Self {
        PartPercentiles {
            count: p.count,
            p50: p.p50,
            p95: p.p95,
            p99: p.p99,
        }
    }
}

/// One (class, model) pair over a window: the summary's per-request `attribution` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestAttribution {
    /// Always `requests` (the scraped entries beside it say `scrape`).
    pub source: &'static str,
    pub class: String,
    pub model: String,
    /// Requests whose engine reported its timings.
    pub requests: u64,
    /// Of those, latency misses attributed to a part.
    pub misses: u64,
    pub queue_ms: PartPercentiles,
    pub prefill_ms: PartPercentiles,
    pub decode_ms: PartPercentiles,
    pub inference_ms: PartPercentiles,
    pub outside_engine_ms: PartPercentiles,
    /// Share of the attributed misses per part (`queue`, `prefill`, `decode`, `inference`,
    /// `outside_engine`); all 0 without misses.
    pub miss_share: BTreeMap<&'static str, f64>,
}

impl Engine {
    /// Counts one request's engine timings in every window (see [`Engine::observe`]).
    pub(super) fn observe_split(
        &mut self,
        obs: &super::Observation<'_>,
        class: &str,
        model: &str,
        epoch: std::time::Instant,
    ) {
        if obs.engine_parts.iter().all(Option::is_none) {
            return;
        }
        let key = (class.to_owned(), model.to_owned());
        let rings = self
            .splits
            .entry(key)
            .or_insert_with(|| self.windows.iter().map(|_| None).collect());
        for (w, win) in self.windows.iter().enumerate() {
            let k = win.geom.index(epoch, obs.finished);
            if win.head.is_some_and(|h| k.saturating_add(win.geom.n) < h) {
                continue;
            }
            let len = win.geom.ring_len();
            if let Some(ring) = rings.get_mut(w)
                && let Some(s) = ring
                    .get_or_insert_with(|| Ring::new(len))
                    .slot(k, SplitSlice::default)
            {
                s.record(&obs.engine_parts, obs.miss_component);
            }
        }
    }

    /// Keeps the pairs whose class still exists after a reload.
    pub(super) fn retain_splits(&mut self) {
        let classes: Vec<String> = self.classes.iter().map(|c| c.cfg.name.clone()).collect();
        self.splits.retain(|(class, _), _| classes.contains(class));
    }

    /// Heap bytes of the per-request attribution.
    pub(super) fn splits_bytes(&self) -> usize {
        self.splits
            .iter()
            .map(|((c, m), rings)| {
                c.capacity()
                    + m.capacity()
                    + rings.iter().flatten().map(Ring::heap_bytes).sum::<usize>()
            })
            .sum()
    }

    /// The per-request attribution over `window`, one entry per (class, model) pair with
    /// timed requests in it, by class name then model name.
    pub fn request_attribution(
        &self,
        window: std::time::Duration,
        now: std::time::Instant,
    ) -> Vec<RequestAttribution> {
        let Some(w) = self.window_index(window) else {
            return Vec::new();
        };
        let Some(view) = self.view(w, now) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for ((class, model), rings) in &self.splits {
            let Some(Some(ring)) = rings.get(w) else {
                continue;
            };
            let mut parts: [Merged; PARTS] = Default::default();
            let (mut timed, mut misses) = (0u64, [0u64; PARTS]);
            for s in ring.range(view.lo, view.hi) {
                for (m, h) in parts.iter_mut().zip(&s.parts) {
                    m.add(h);
                }
                timed = timed.saturating_add(s.timed);
                for (a, b) in misses.iter_mut().zip(s.misses) {
                    *a = a.saturating_add(b);
                }
            }
            if timed == 0 {
                continue;
            }
            let missed: u64 = misses.iter().sum();
            let [queue, prefill, decode, inference, outside] =
                parts.map(|m| PartPercentiles::from(m.percentiles()));
            let miss_share = Component::ALL
                .iter()
                .zip(misses)
                .map(|(c, n)| {
                    let share = if missed > 0 {
                        n as f64 / missed as f64
                    } else {
                        0.0
                    };
                    (c.as_str(), share)
                })
                .collect();
            out.push(RequestAttribution {
                source: "requests",
                class: class.clone(),
                model: model.clone(),
                requests: timed,
                misses: missed,
                queue_ms: queue,
                prefill_ms: prefill,
                decode_ms: decode,
                inference_ms: inference,
                outside_engine_ms: outside,
                miss_share,
            });
        }
        out
    }
}
