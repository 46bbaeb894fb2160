//! The capacity curve as served by `GET /api/v1/capacity?class=...`: one class's levels
//! (or all classes pooled) over the longest window, with `max_stable_concurrency` and the
//! `knee` as `capacity` defines them. The summary and the gauges use the counters-only
//! path ([`Engine::stable_levels`]), which merges no histograms.

use std::time::Instant;

use serde::Serialize;

use super::{
    ClassState, Engine,
    capacity::{
        LevelAgg, collect, empty_levels, knee, level_bounds, max_stable, max_stable_concurrency,
        pool, weighted_target,
    },
    config::PercentileTarget,
    slice::ratio,
};

/// The capacity curve of one class, or of all classes pooled.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// The class name, or `overall`.
    pub class: String,
    /// The window the levels are computed over (the longest configured one).
    pub window: String,
    /// The class's target; for overall the traffic-weighted class target over all levels
    /// (`null` without samples).
    pub attainment_target: Option<f64>,
    pub min_samples: u64,
    /// Levels that saw any request, ascending.
    pub levels: Vec<Level>,
    pub max_stable_concurrency: Option<u32>,
    pub knee: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Level {
    /// Lowest concurrency of the level (the level itself for 1..=16).
    pub concurrency: u32,
    /// Highest concurrency of the level; `null` for the open top level.
    pub concurrency_max: Option<u32>,
    pub requests: u64,
    /// Requests with a verdict (client aborts excluded).
    pub samples: u64,
    pub attainment: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub tpot_p95_ms: Option<f64>,
    pub throughput_tokens_per_s: Option<f64>,
    /// At least `min_samples` samples.
    pub enough_samples: bool,
    /// Part of the stable run that ends at `max_stable_concurrency`.
    pub stable: bool,
}

pub fn build(
    class: String,
    attainment_target: Option<f64>,
    window: String,
    levels: &[LevelAgg],
    min_samples: u64,
    targets: &[PercentileTarget],
) -> Capacity {
    let stable_top = max_stable(levels, min_samples);
    let out = levels
        .iter()
        .enumerate()
        .filter(|(_, l)| l.requests > 0)
        .map(|(i, l)| {
            let (concurrency, concurrency_max) = level_bounds(i);
            let enough_samples = l.samples() >= min_samples.max(1);
            Level {
                concurrency,
                concurrency_max,
                requests: l.requests,
                samples: l.samples(),
                attainment: ratio(l.met, l.samples()),
                ttft_p95_ms: l.ttft.quantile_ms(0.95),
                tpot_p95_ms: l.tpot.quantile_ms(0.95),
                throughput_tokens_per_s: l.throughput(),
                enough_samples,
                stable: enough_samples && stable_top.is_some_and(|top| i <= top),
            }
        })
        .collect();
    Capacity {
        class,
        window,
        attainment_target,
        min_samples,
        levels: out,
        max_stable_concurrency: stable_top.map(|i| level_bounds(i).0),
        knee: knee(levels, min_samples, targets).map(|i| level_bounds(i).0),
    }
}

impl Engine {
    /// Capacity slices covering the longest window at `now`.
    fn cap_range(&self, now: Instant) -> Option<(u64, u64)> {
        let hi = self.cap_geom.index(self.epoch?, now);
        Some((self.cap_geom.oldest(hi), hi))
    }

    fn class_levels(
        &self,
        c: &ClassState,
        range: Option<(u64, u64)>,
        latency: bool,
    ) -> Vec<LevelAgg> {
        match (&c.capacity, range) {
            (Some(ring), Some((lo, hi))) => collect(ring, lo, hi, c.cfg.attainment, latency),
            _ => empty_levels(),
        }
    }

    /// Max stable concurrency per class (config order) and overall, from counters only.
    pub(super) fn stable_levels(&self, now: Instant) -> (Vec<Option<u32>>, Option<u32>) {
        let range = self.cap_range(now);
        let mut pooled = empty_levels();
        let per_class = self
            .classes
            .iter()
            .map(|c| {
                let levels = self.class_levels(c, range, false);
                pool(&mut pooled, &levels);
                max_stable_concurrency(&levels, self.min_samples)
            })
            .collect();
        (per_class, max_stable_concurrency(&pooled, self.min_samples))
    }

    /// The knee per class (config order) and overall, as [`Engine::capacity`] reports it.
    /// Latency histograms are merged only for a class with percentile targets (the only
    /// thing they decide in the knee), so a refresh stays cheap without them.
    pub fn knees(&self, now: Instant) -> (Vec<Option<u32>>, Option<u32>) {
        let range = self.cap_range(now);
        let mut pooled = empty_levels();
        let per_class = self
            .classes
            .iter()
            .map(|c| {
                let targets = &c.cfg.percentile_targets;
                let levels = self.class_levels(c, range, !targets.is_empty());
                pool(&mut pooled, &levels);
                knee(&levels, self.min_samples, targets).map(|i| level_bounds(i).0)
            })
            .collect();
        let overall = knee(&pooled, self.min_samples, &[]).map(|i| level_bounds(i).0);
        (per_class, overall)
    }

    /// The curve of `class`, or of all classes pooled when `None`. `None` when no class
    /// has that name.
    pub fn capacity(&self, class: Option<&str>, now: Instant) -> Option<Capacity> {
        let range = self.cap_range(now);
        let label = self.cap_label.clone();
        if let Some(name) = class {
            let c = self.classes.iter().find(|c| c.cfg.name == name)?;
            let levels = self.class_levels(c, range, true);
            let targets = &c.cfg.percentile_targets;
            return Some(build(
                name.to_owned(),
                Some(c.cfg.attainment),
                label,
                &levels,
                self.min_samples,
                targets,
            ));
        }
        let mut pooled = empty_levels();
        for c in &self.classes {
            pool(&mut pooled, &self.class_levels(c, range, true));
        }
        Some(build(
            "overall".into(),
            weighted_target(&pooled),
            label,
            &pooled,
            self.min_samples,
            &[],
        ))
    }
}
