//! The statistics engine: sliding windows of SLO attainment, effective goodput, latency
//! percentiles, unit cost, stability series and live capacity, per SLO class, per model and
//! overall. The definitions are docs/DESIGN.md's (normative); this module only counts.
//!
//! Pure, synchronous and deterministic: time is passed in (`now` arguments and the
//! observation's own instants), never read from a clock. It lives in the aggregator task
//! (single owner, `&mut self` to record, `&self` to query), never on a request's path.
//!
//! # Layout
//! - `config`: [`EngineConfig`] and the per-request [`Observation`].
//! - `hist`: HDR histograms (lazy, sparse-then-dense) and their query-time merges.
//! - `ring`: time slices in a fixed ring per window; window geometry.
//! - `slice`: what a slice holds (counters, latency histograms, in-flight samples).
//! - `stability`: per-window series over `history`, drift and jitter.
//! - `capacity`: concurrency levels, max stable concurrency and the knee.
//! - `curve`: the capacity curve as served ([`Capacity`]).
//! - `cost`: cost per million effective / raw tokens, wasted share, per stable user.
//! - `summary`: the `/api/v1/summary` document ([`Summary`]).
//! - `timeline`: one point per slice of the shortest window, for charts ([`TimelineOut`]).
//! - `gauges`: the cheap per-(class, window) numbers for Prometheus ([`Gauges`]).
//! - `label`: window labels ("5m") both ways and input-bucket labels ("<=4k").
//! - `reload`: applying a new config while keeping the windows ([`Engine::reconfigure`]).
//!
//! # Memory
//! Everything is allocated on first use: a class, model or concurrency level without
//! traffic costs an empty `Option`. A dense histogram is 13.4 KB; a slice keeps up to 256
//! raw values (≤ 1 KB) per metric before going dense, so quiet slices stay small.
//! - Per class and window (13 slots): at most 16 histograms per slot (TTFT, TPOT, ITL, e2e,
//!   the two short-input TTFT splits, 4 more input buckets, 4 output buckets of e2e, TTFT
//!   of prefix-cache hits and misses) = 2.8 MB; busy streaming traffic in two input buckets
//!   and one output bucket makes 8 of them dense = 1.4 MB.
//! - Capacity per class (7 slots of the longest window): TTFT + TPOT per busy level,
//!   dense once a level sees > 256 requests in a slot: 1.5 MB with 8 such levels, 5.4 MB
//!   if all 29 are.
//! - 3 windows × 5 classes: ≈ 29 MB when every class is busy enough for everything to be
//!   dense (5 × (3 × 1.4 + 1.5)); hard ceiling ≈ 69 MB (5 × (3 × 2.8 + 5.4)). Measured
//!   5.9 MB at one 300-token stream per second per class (ITL dense, the rest mostly sparse).
//! - Models: counters only, ≈ 1 KB per model and window. Stability series: ≈ 70 bytes per
//!   point; 1m/5m/1h over 6h = 438 points ≈ 30 KB per class.
//! - Timeline: ≤ 640 bytes per point; 720 points (the default) ≈ 450 KB.
//!
//! [`Engine::memory_bytes`] reports the live figure; a test pins the ceiling.

mod capacity;
mod config;
mod cost;
mod curve;
mod gauges;
mod hist;
mod label;
mod reload;
mod ring;
mod slice;
mod split;
mod stability;
mod summary;
#[cfg(test)]
mod tests;
mod timeline;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

pub use capacity::{CAPACITY_SLICES, KNEE_SLOPE_FRACTION};
pub use config::{
    ClassConfig, Component, CostConfig, DEFAULT_CLASS, EngineConfig, FinishReason, LatencyMetric,
    MIN_WINDOW, MissCause, Observation, PercentileTarget,
};
pub use cost::{CostSummary, HOURS_PER_MONTH};
pub use curve::{Capacity, Level};
pub use gauges::{ClassGauges, Gauges, WindowGauges};
pub use hist::Percentiles;
pub use label::{ParseWindowError, bucket_labels, bucket_of, format_window, parse_window};
pub use ring::SLICES_PER_WINDOW;
pub use slice::OUTPUT_BUCKETS;
pub use split::{PartPercentiles, RequestAttribution};
pub use stability::{MAX_POINTS, PointOut, Stability};
pub use summary::{
    ByInput, FinishReasons, Group, InFlight, MissReasons, ModelGroup, OutcomeCounts, Overall,
    Rates, Summary, TargetStatus,
};
pub use timeline::{MAX_TIMELINE_POINTS, TIMELINE_POINT_BYTES, TimelineOut, TimelinePoint};

use capacity::CapSlice;
use ring::{Geometry, Ring};
use slice::{ClassSlice, Counts, FlightSlice};
use stability::Series;
use timeline::Timeline;

/// Distinct model labels the engine keeps; more fold into `other`. The caller already
/// bounds model labels; this only guards the engine's memory if it did not.
pub const MAX_MODELS: usize = 256;

/// The engine. See the module doc.
#[derive(Debug)]
pub struct Engine {
    windows: Vec<WindowState>,
    classes: Vec<ClassState>,
    models: BTreeMap<String, ModelState>,
    /// The capacity ring's geometry: the longest window in [`CAPACITY_SLICES`] slices.
    cap_geom: Geometry,
    /// The newest capacity slice seen.
    cap_head: Option<u64>,
    cap_label: String,
    bounds: Vec<u64>,
    bucket_labels: Vec<String>,
    min_samples: u64,
    cost: Option<CostConfig>,
    /// Slice numbering starts here: the first instant the engine saw. No window reaches
    /// back before it, which is what scales the rates of a window older than the engine.
    epoch: Option<Instant>,
    /// Records whose slice had already been recycled when they arrived.
    late_dropped: u64,
    /// The shortest window, whose slices the timeline is made of.
    timeline_window: usize,
    timeline: Timeline,
    /// The engine's own per-request timings, per (class, model).
    splits: split::Splits,
}

#[derive(Debug)]
struct WindowState {
    geom: Geometry,
    label: String,
    /// The newest slice seen; stability intervals close when it moves on.
    head: Option<u64>,
    flight: Ring<FlightSlice>,
    /// Overall stability series.
    series: Series,
    /// Points kept per series: `history / window`, at most [`MAX_POINTS`].
    series_cap: usize,
}

#[derive(Debug)]
struct ClassState {
    cfg: ClassConfig,
    /// One ring per window, created on the class's first request.
    rings: Vec<Option<Ring<ClassSlice>>>,
    series: Vec<Series>,
    capacity: Option<Ring<CapSlice>>,
}

#[derive(Debug)]
struct ModelState {
    rings: Vec<Option<Ring<Counts>>>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Engine {
        let mut lengths: Vec<Duration> = Vec::new();
        for w in cfg.windows.iter().map(|w| (*w).max(MIN_WINDOW)) {
            if !lengths.contains(&w) {
                lengths.push(w);
            }
        }
        if lengths.is_empty() {
            lengths.push(Duration::from_secs(60));
        }
        let longest = lengths.iter().copied().max().unwrap_or(MIN_WINDOW);
        let timeline_window = lengths
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| **w)
            .map_or(0, |(i, _)| i);
        let windows = lengths
            .iter()
            .map(|&w| {
                let geom = Geometry::new(w, SLICES_PER_WINDOW);
                let flight = Ring::new(geom.ring_len());
                let label = format_window(w);
                let points = (cfg.history.as_secs_f64() / w.as_secs_f64()).floor() as usize;
                let series_cap = points.min(MAX_POINTS);
                WindowState {
                    geom,
                    label,
                    head: None,
                    flight,
                    series: Series::default(),
                    series_cap,
                }
            })
            .collect();
        let mut classes = cfg.classes;
        if classes.last().is_none_or(|c| c.name != DEFAULT_CLASS) {
            classes.retain(|c| c.name != DEFAULT_CLASS);
            classes.push(ClassConfig {
                name: DEFAULT_CLASS.into(),
                attainment: 0.99,
                percentile_targets: Vec::new(),
                error_rate_max: None,
            });
        }
        let n = lengths.len();
        let classes = classes
            .into_iter()
            .map(|cfg| ClassState {
                cfg,
                rings: (0..n).map(|_| None).collect(),
                series: (0..n).map(|_| Series::default()).collect(),
                capacity: None,
            })
            .collect();
        let mut bounds = cfg.input_buckets;
        bounds.sort_unstable();
        bounds.dedup();
        Engine {
            windows,
            classes,
            models: BTreeMap::new(),
            cap_geom: Geometry::new(longest, CAPACITY_SLICES),
            cap_head: None,
            cap_label: format_window(longest),
            bucket_labels: label::bucket_labels(&bounds),
            bounds,
            min_samples: cfg.min_samples,
            cost: cfg
                .cost
                .filter(|c| c.per_hour.is_finite() && c.per_hour >= 0.0),
            epoch: None,
            late_dropped: 0,
            timeline_window,
            timeline: Timeline::new(cfg.timeline_points),
            splits: split::Splits::new(),
        }
    }

    fn touch(&mut self, t: Instant) -> Instant {
        *self.epoch.get_or_insert(t)
    }

    /// Counts one finished request in every window (at its `finished` instant).
    pub fn observe(&mut self, obs: &Observation<'_>) {
        let epoch = self.touch(obs.started.min(obs.finished));
        self.advance(obs.finished);
        let ci = self.class_index(obs.class);
        let bucket = obs.input_tokens.map(|t| label::bucket_of(&self.bounds, t));
        let buckets = self.bucket_labels.len();
        let known = self.models.contains_key(obs.model);
        let key = if known || self.models.len() < MAX_MODELS {
            obs.model
        } else {
            "other"
        };
        if !self.models.contains_key(key) {
            let rings = self.windows.iter().map(|_| None).collect();
            self.models.insert(key.to_owned(), ModelState { rings });
        }
        let Some(model) = self.models.get_mut(key) else {
            return;
        };
        let Some(class) = self.classes.get_mut(ci) else {
            return;
        };
        let mut late = false;
        for (w, win) in self.windows.iter().enumerate() {
            let k = win.geom.index(epoch, obs.finished);
            // Older than every slice the ring still holds: dropped from this window in
            // every ring alike (a fresh ring would take it, a busy one could not).
            if win.head.is_some_and(|h| k.saturating_add(win.geom.n) < h) {
                late = true;
                continue;
            }
            let len = win.geom.ring_len();
            if let Some(ring) = class.rings.get_mut(w)
                && let Some(s) = ring
                    .get_or_insert_with(|| Ring::new(len))
                    .slot(k, || ClassSlice::new(buckets))
            {
                s.record(obs, bucket);
            }
            if let Some(ring) = model.rings.get_mut(w)
                && let Some(s) = ring
                    .get_or_insert_with(|| Ring::new(len))
                    .slot(k, Counts::default)
            {
                s.record(obs);
            }
        }
        let k = self.cap_geom.index(epoch, obs.finished);
        let len = self.cap_geom.ring_len();
        if self
            .cap_head
            .is_some_and(|h| k.saturating_add(self.cap_geom.n) < h)
        {
            late = true;
        } else if let Some(s) = class
            .capacity
            .get_or_insert_with(|| Ring::new(len))
            .slot(k, CapSlice::new)
        {
            s.record(obs);
        }
        if late {
            self.late_dropped = self.late_dropped.saturating_add(1);
        }
        if obs.engine_parts.iter().any(Option::is_some) {
            let class = self
                .classes
                .get(ci)
                .map_or_else(String::new, |c| c.cfg.name.clone());
            self.observe_split(obs, &class, key, epoch);
        }
    }

    /// One sample of in-flight concurrency (the aggregator calls this every ~100 ms); also
    /// moves time forward like [`Engine::advance`].
    pub fn sample_in_flight(&mut self, now: Instant, in_flight: u64) {
        let epoch = self.touch(now);
        self.advance(now);
        for win in &mut self.windows {
            let k = win.geom.index(epoch, now);
            if let Some(s) = win.flight.slot(k, FlightSlice::default) {
                s.record(in_flight);
            }
        }
    }

    /// Moves time forward to `now`, closing stability intervals that ended. Observations
    /// and in-flight samples do this themselves; call it when neither is happening.
    pub fn advance(&mut self, now: Instant) {
        let Some(epoch) = self.epoch else { return };
        let k = self.cap_geom.index(epoch, now);
        self.cap_head = Some(self.cap_head.map_or(k, |h| h.max(k)));
        let mut timeline_closed = None;
        for w in 0..self.windows.len() {
            let Some(win) = self.windows.get_mut(w) else {
                continue;
            };
            let k = win.geom.index(epoch, now);
            let n = win.geom.n;
            match win.head {
                None => win.head = Some(k),
                Some(h) if k > h => {
                    win.head = Some(k);
                    if w == self.timeline_window {
                        timeline_closed = Some((h, k));
                    }
                    if k / n > h / n {
                        self.close_intervals(w, h / n, k / n);
                    }
                }
                Some(_) => {}
            }
        }
        if let Some((from, to)) = timeline_closed {
            self.close_timeline(from, to);
        }
    }

    /// The class an observation counts in: its own, or `default` when unknown.
    fn class_index(&self, name: &str) -> usize {
        let last = self.classes.len().saturating_sub(1);
        self.classes
            .iter()
            .position(|c| c.cfg.name == name)
            .unwrap_or(last)
    }

    /// Configured windows, in order: `(label, length)`.
    pub fn windows(&self) -> impl Iterator<Item = (&str, Duration)> {
        self.windows
            .iter()
            .map(|w| (w.label.as_str(), w.geom.window))
    }

    /// Class names in config order (`default` last).
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.classes.iter().map(|c| c.cfg.name.as_str())
    }

    /// Records that arrived more than a window late (dropped from that window: its slice
    /// is no longer in the ring).
    pub fn late_dropped(&self) -> u64 {
        self.late_dropped
    }

    /// Approximate heap bytes held (rings, histograms, series), for a gauge.
    pub fn memory_bytes(&self) -> usize {
        let windows: usize = self
            .windows
            .iter()
            .map(|w| w.flight.heap_bytes() + w.series.heap_bytes())
            .sum();
        let classes: usize = self
            .classes
            .iter()
            .map(|c| {
                let rings: usize = c.rings.iter().flatten().map(Ring::heap_bytes).sum();
                let series: usize = c.series.iter().map(Series::heap_bytes).sum();
                rings + series + c.capacity.as_ref().map_or(0, Ring::heap_bytes)
            })
            .sum();
        let models: usize = self
            .models
            .iter()
            .map(|(k, m)| {
                k.capacity()
                    + m.rings
                        .iter()
                        .flatten()
                        .map(Ring::heap_bytes)
                        .sum::<usize>()
            })
            .sum();
        windows + classes + models + self.timeline.heap_bytes() + self.splits_bytes()
    }
}
