//! The timeline behind `/api/v1/timeline` and the dashboard's charts: one point per slice
//! of the shortest window (5 s for 1m), all classes together, kept for the last
//! `timeline_points` slices. A point is closed when time moves past its slice (as the
//! stability series are), from the slice's counters and histograms already held by the
//! rings, so recording costs nothing per request; it keeps scalars only (at most
//! [`TIMELINE_POINT_BYTES`]: 720 points, an hour of 5 s slices, ≈ 450 KB; the
//! [`MAX_TIMELINE_POINTS`] ceiling ≈ 11 MB).
//! Slices without traffic give points with zero counts, so a chart shows the gap.
//!
//! A record that arrives after its slice was closed still counts in the sliding windows but
//! not in the closed point.

use std::{collections::VecDeque, time::Instant};

use serde::Serialize;

use super::{
    Engine,
    hist::{Merged, Percentiles},
    slice::{Counts, FlightSlice},
    summary::per_s,
};

pub use crate::slo::MAX_TIMELINE_POINTS;

/// Upper bound on one point's size in bytes (pinned by a test).
pub const TIMELINE_POINT_BYTES: usize = 640;

/// One closed slice.
#[derive(Debug, Clone, Copy)]
struct Point {
    slice: u64,
    duration_s: f64,
    counts: Counts,
    ttft: Percentiles,
    tpot: Percentiles,
    itl: Percentiles,
    e2e: Percentiles,
    flight: FlightSlice,
}

/// The bounded series of closed slices.
#[derive(Debug, Default)]
pub(super) struct Timeline {
    points: VecDeque<Point>,
    pub(super) cap: usize,
}

impl Timeline {
    pub(super) fn new(cap: usize) -> Timeline {
        Timeline {
            points: VecDeque::new(),
            cap: cap.min(MAX_TIMELINE_POINTS),
        }
    }

    fn push(&mut self, p: Point) {
        if self.cap == 0 {
            return;
        }
        while self.points.len() >= self.cap {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    /// Keeps the newest `cap` points from now on.
    pub(super) fn set_cap(&mut self, cap: usize) {
        self.cap = cap.min(MAX_TIMELINE_POINTS);
        let excess = self.points.len().saturating_sub(self.cap);
        self.points.drain(..excess);
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.points.capacity() * std::mem::size_of::<Point>()
    }
}

/// The timeline as served.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineOut {
    /// Length of one point's slice in seconds (the shortest window / 12).
    pub slice_seconds: f64,
    /// Points the timeline keeps at most (`[slo] timeline_points`).
    pub capacity: usize,
    /// Oldest first.
    pub points: Vec<TimelinePoint>,
}

/// One slice of all classes together. Rates divide by the slice's length.
#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    /// Seconds between the end of the slice and the moment of the query.
    pub ended_s_ago: f64,
    pub duration_s: f64,
    pub requests: u64,
    pub slo_met: u64,
    pub slo_missed: u64,
    pub attainment: Option<f64>,
    pub output_tokens: u64,
    pub effective_output_tokens: u64,
    pub effective_goodput_tokens_per_s: f64,
    pub raw_output_tokens_per_s: f64,
    pub request_goodput_per_s: f64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Mean and peak of the in-flight samples taken during the slice (`null` without any).
    pub in_flight_mean: Option<f64>,
    pub in_flight_peak: Option<u64>,
}

impl Engine {
    /// Closes slices `from .. to` of the timeline's window (only the last `cap` of them:
    /// older ones would be evicted at once).
    pub(super) fn close_timeline(&mut self, from: u64, to: u64) {
        let Some(epoch) = self.epoch else { return };
        let w = self.timeline_window;
        let Some(win) = self.windows.get(w) else {
            return;
        };
        let g = win.geom;
        let from = from.max(to.saturating_sub(self.timeline.cap as u64));
        for slice in from..to {
            let start = g.start(epoch, slice);
            let end = g.start(epoch, slice.saturating_add(1));
            let mut counts = Counts::default();
            let (mut ttft, mut tpot, mut itl, mut e2e) = (
                Merged::default(),
                Merged::default(),
                Merged::default(),
                Merged::default(),
            );
            for class in &self.classes {
                let Some(Some(ring)) = class.rings.get(w) else {
                    continue;
                };
                for s in ring.range(slice, slice) {
                    counts.add(&s.counts);
                    ttft.add(&s.ttft);
                    tpot.add(&s.tpot);
                    itl.add(&s.itl);
                    e2e.add(&s.e2e);
                }
            }
            let flight = win
                .flight
                .range(slice, slice)
                .copied()
                .next()
                .unwrap_or_default();
            self.timeline.push(Point {
                slice,
                duration_s: end.saturating_duration_since(start).as_secs_f64(),
                counts,
                ttft: ttft.percentiles(),
                tpot: tpot.percentiles(),
                itl: itl.percentiles(),
                e2e: e2e.percentiles(),
                flight,
            });
        }
    }

    /// The newest `limit` closed points (all kept without a limit), oldest first.
    pub fn timeline(&self, now: Instant, limit: Option<usize>) -> TimelineOut {
        let g = self.windows.get(self.timeline_window).map(|w| w.geom);
        let points = &self.timeline.points;
        let skip = limit.map_or(0, |l| points.len().saturating_sub(l));
        let out = points
            .iter()
            .skip(skip)
            .map(|p| {
                let ended_s_ago = match (self.epoch, g) {
                    (Some(epoch), Some(g)) => now
                        .saturating_duration_since(g.start(epoch, p.slice.saturating_add(1)))
                        .as_secs_f64(),
                    _ => 0.0,
                };
                let c = &p.counts;
                TimelinePoint {
                    ended_s_ago,
                    duration_s: p.duration_s,
                    requests: c.requests,
                    slo_met: c.met,
                    slo_missed: c.missed,
                    attainment: c.attainment(),
                    output_tokens: c.output_tokens,
                    effective_output_tokens: c.met_tokens,
                    effective_goodput_tokens_per_s: per_s(c.met_tokens, p.duration_s),
                    raw_output_tokens_per_s: per_s(c.output_tokens, p.duration_s),
                    request_goodput_per_s: per_s(c.met, p.duration_s),
                    ttft_ms: p.ttft,
                    tpot_ms: p.tpot,
                    itl_ms: p.itl,
                    e2e_ms: p.e2e,
                    in_flight_mean: (p.flight.samples > 0)
                        .then(|| p.flight.sum as f64 / p.flight.samples as f64),
                    in_flight_peak: (p.flight.samples > 0).then_some(p.flight.peak),
                }
            })
            .collect();
        TimelineOut {
            slice_seconds: g.map_or(0.0, |g| g.slice_seconds()),
            capacity: self.timeline.cap,
            points: out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_stays_within_its_documented_size() {
        assert!(std::mem::size_of::<Point>() <= TIMELINE_POINT_BYTES);
    }
}
