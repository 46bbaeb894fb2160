//! Where time goes, per engine model: the engine's own queue, prefill and decode means,
//! the time outside the engine (the proxy's e2e mean minus the engine's over the same
//! interval: network, gateway and load-balancer queues, the proxy), and the engine's load
//! signals at the latest scrape (KV-cache usage, requests waiting and running, preemptions
//! in the last scrape interval). Built from the calibration comparisons and the scrape; an
//! operator who sees attainment drop reads here whether the engine queued, prefilled or
//! decoded slowly, or the time went elsewhere.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{Comparison, Quantity, engines::Load};

/// One engine model's time and load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    /// The engine's `model_name` (`""`: the engine names none).
    pub model: String,
    /// Length of the latest interval with engine requests (the means below cover it).
    pub interval_seconds: Option<f64>,
    /// Requests the engine finished in that interval.
    pub engine_requests: u64,
    pub queue_seconds: Option<f64>,
    pub prefill_seconds: Option<f64>,
    pub decode_seconds: Option<f64>,
    pub engine_e2e_seconds: Option<f64>,
    pub proxy_e2e_seconds: Option<f64>,
    /// Proxy e2e − engine e2e.
    pub outside_engine_seconds: Option<f64>,
    /// Share of the KV cache in use at the latest scrape (0..1).
    pub kv_cache_usage: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
    /// Preemptions in the latest scrape interval.
    pub preemptions: Option<f64>,
}

/// The phases exported as `goodput_attribution_seconds{model,phase}`.
impl Attribution {
    pub fn phases(&self) -> [(&'static str, Option<f64>); 4] {
        [
            ("queue", self.queue_seconds),
            ("prefill", self.prefill_seconds),
            ("decode", self.decode_seconds),
            ("outside_engine", self.outside_engine_seconds),
        ]
    }
}

/// Preemptions between two cumulative readings; `None` after a reset or without both.
pub fn preemptions_between(before: Option<f64>, now: Option<f64>) -> Option<f64> {
    let (b, n) = (before?, now?);
    (n >= b).then_some(n - b)
}

/// One [`Attribution`] per model that has comparisons or load signals. A model without load
/// signals of its own takes the engine-wide ones (`""`: engines that label their gauges
/// by no model); `""` gets its own entry only when it has comparisons or is the only one.
pub fn attribute(
    comparisons: &[Comparison],
    load: &BTreeMap<String, Load>,
    preemptions: &BTreeMap<String, f64>,
) -> Vec<Attribution> {
    let mut models: Vec<&str> = comparisons.iter().map(|c| c.model.as_str()).collect();
    models.extend(load.keys().map(String::as_str));
    models.sort_unstable();
    models.dedup();
    let has_named = models.iter().any(|m| !m.is_empty());
    let has_comparisons = |m: &str| comparisons.iter().any(|c| c.model == m);
    models
        .into_iter()
        .filter(|m| !m.is_empty() || !has_named || has_comparisons(m))
        .map(|model| {
            let find = |q: Quantity| {
                comparisons
                    .iter()
                    .find(|c| c.model == model && c.metric == q)
            };
            let engine = |q: Quantity| find(q).map(|c| c.engine_seconds);
            let e2e = find(Quantity::E2e);
            let l = load.get(model).or_else(|| load.get("")).copied();
            let l = l.unwrap_or_default();
            let preempted = preemptions
                .get(model)
                .or_else(|| preemptions.get(""))
                .copied();
            Attribution {
                model: model.to_owned(),
                interval_seconds: e2e.map(|c| c.interval_seconds),
                engine_requests: e2e.map_or(0, |c| c.engine_samples),
                queue_seconds: engine(Quantity::Queue),
                prefill_seconds: engine(Quantity::Prefill),
                decode_seconds: engine(Quantity::Decode),
                engine_e2e_seconds: e2e.map(|c| c.engine_seconds),
                proxy_e2e_seconds: e2e.and_then(|c| c.proxy_seconds),
                outside_engine_seconds: e2e.and_then(|c| c.difference_seconds),
                kv_cache_usage: l.kv_cache_usage,
                requests_waiting: l.requests_waiting,
                requests_running: l.requests_running,
                preemptions: preempted,
            }
        })
        .collect()
}

/// Scrapes kept for windowed attribution: six hours of 15 s scrapes (the `[slo]` history
/// default), a few hundred kilobytes at most.
pub const HISTORY_SCRAPES: usize = 1440;

/// The attribution of each scrape, from the requests the engine finished in its interval
/// only (not the last known means), for means over a window.
#[derive(Debug, Clone, Default)]
pub struct History {
    scrapes: VecDeque<(Instant, Vec<Attribution>)>,
}

impl History {
    pub fn push(&mut self, at: Instant, fresh: Vec<Attribution>) {
        if self.scrapes.len() == HISTORY_SCRAPES {
            self.scrapes.pop_front();
        }
        self.scrapes.push_back((at, fresh));
    }

    pub fn clear(&mut self) {
        self.scrapes.clear();
    }

    /// Per model over the scrapes of the last `window`: phase times as means weighted by
    /// the requests the engine finished in each interval, load as the mean over scrapes
    /// (KV-cache usage, waiting, running), preemptions summed, intervals added up.
    pub fn over(&self, window: Duration, now: Instant) -> Vec<Attribution> {
        let since = now.checked_sub(window);
        let mut acc: BTreeMap<&str, Acc> = BTreeMap::new();
        for (at, scrape) in &self.scrapes {
            if since.is_some_and(|s| *at < s) {
                continue;
            }
            for a in scrape {
                acc.entry(a.model.as_str()).or_default().add(a);
            }
        }
        acc.into_iter().map(|(model, a)| a.finish(model)).collect()
    }
}

/// Running sums of one model's attributions.
#[derive(Default)]
struct Acc {
    interval: Option<f64>,
    requests: u64,
    /// (weighted sum, weight) per time field, in [`Attribution::times`] order.
    times: [(f64, f64); 6],
    /// (sum, scrapes) of KV usage, waiting, running.
    load: [(f64, f64); 3],
    preemptions: Option<f64>,
}

impl Attribution {
    fn times(&self) -> [Option<f64>; 6] {
        [
            self.queue_seconds,
            self.prefill_seconds,
            self.decode_seconds,
            self.engine_e2e_seconds,
            self.proxy_e2e_seconds,
            self.outside_engine_seconds,
        ]
    }
}

impl Acc {
    fn add(&mut self, a: &Attribution) {
        let w = a.engine_requests as f64;
        if w > 0.0 {
            self.requests += a.engine_requests;
            self.interval = Some(self.interval.unwrap_or(0.0) + a.interval_seconds.unwrap_or(0.0));
            for (slot, v) in self.times.iter_mut().zip(a.times()) {
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    *slot = (slot.0 + v * w, slot.1 + w);
                }
            }
        }
        for (slot, v) in
            self.load
                .iter_mut()
                .zip([a.kv_cache_usage, a.requests_waiting, a.requests_running])
        {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                *slot = (slot.0 + v, slot.1 + 1.0);
            }
        }
        if let Some(p) = a.preemptions {
            self.preemptions = Some(self.preemptions.unwrap_or(0.0) + p);
        }
    }

    fn finish(self, model: &str) -> Attribution {
        let mean = |(sum, n): (f64, f64)| (n > 0.0).then(|| sum / n);
        let [queue, prefill, decode, engine_e2e, proxy_e2e, outside] = self.times.map(mean);
        let [kv, waiting, running] = self.load.map(mean);
        Attribution {
            model: model.to_owned(),
            interval_seconds: self.interval,
            engine_requests: self.requests,
            queue_seconds: queue,
            prefill_seconds: prefill,
            decode_seconds: decode,
            engine_e2e_seconds: engine_e2e,
            proxy_e2e_seconds: proxy_e2e,
            outside_engine_seconds: outside,
            kv_cache_usage: kv,
            requests_waiting: waiting,
            requests_running: running,
            preemptions: self.preemptions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windowed_means_weigh_intervals_by_engine_requests() {
        let fresh = |requests: u64, queue: f64, kv: f64, preempted: f64| Attribution {
            model: "m".into(),
            interval_seconds: Some(15.0),
            engine_requests: requests,
            queue_seconds: (requests > 0).then_some(queue),
            prefill_seconds: None,
            decode_seconds: None,
            engine_e2e_seconds: None,
            proxy_e2e_seconds: None,
            outside_engine_seconds: None,
            kv_cache_usage: Some(kv),
            requests_waiting: None,
            requests_running: None,
            preemptions: Some(preempted),
        };
        let t0 = Instant::now();
        let mut h = History::default();
        h.push(t0, vec![fresh(10, 9.0, 0.9, 5.0)]);
        h.push(
            t0 + Duration::from_secs(600),
            vec![fresh(10, 1.0, 0.2, 1.0)],
        );
        h.push(
            t0 + Duration::from_secs(615),
            vec![fresh(30, 3.0, 0.4, 0.0)],
        );
        // Idle interval: load counts, times do not.
        h.push(t0 + Duration::from_secs(630), vec![fresh(0, 0.0, 0.0, 0.0)]);
        let now = t0 + Duration::from_secs(630);
        let a = h.over(Duration::from_secs(300), now);
        assert_eq!(a.len(), 1);
        let a = &a[0];
        assert_eq!(a.engine_requests, 40);
        // (10 × 1 + 30 × 3) / 40.
        assert_eq!(a.queue_seconds, Some(2.5));
        assert!((a.kv_cache_usage.unwrap() - 0.2).abs() < 1e-9);
        assert_eq!(a.preemptions, Some(1.0));
        assert_eq!(a.interval_seconds, Some(30.0));
        let all = h.over(Duration::from_secs(3600), now);
        assert_eq!(all[0].engine_requests, 50);
    }

    fn cmp(model: &str, metric: Quantity, engine: f64, proxy: Option<f64>) -> Comparison {
        Comparison {
            model: model.into(),
            metric,
            interval_seconds: 15.0,
            engine_seconds: engine,
            engine_samples: 10,
            proxy_seconds: proxy,
            proxy_samples: 10,
            difference_seconds: proxy.map(|p| p - engine),
        }
    }

    #[test]
    fn phases_outside_time_and_engine_wide_load() {
        let comparisons = [
            cmp("llama", Quantity::E2e, 2.0, Some(2.25)),
            cmp("llama", Quantity::Queue, 0.5, None),
            cmp("llama", Quantity::Prefill, 0.3, None),
            cmp("llama", Quantity::Decode, 1.2, None),
        ];
        let load = BTreeMap::from([(
            String::new(),
            Load {
                kv_cache_usage: Some(0.8),
                requests_waiting: Some(12.0),
                requests_running: Some(64.0),
                preemptions_total: Some(40.0),
            },
        )]);
        let preemptions = BTreeMap::from([(String::new(), 3.0)]);
        let a = attribute(&comparisons, &load, &preemptions);
        assert_eq!(a.len(), 1, "{a:?}");
        let a = &a[0];
        assert_eq!(a.model, "llama");
        assert_eq!(
            (a.queue_seconds, a.prefill_seconds, a.decode_seconds),
            (Some(0.5), Some(0.3), Some(1.2))
        );
        assert_eq!(a.outside_engine_seconds, Some(0.25));
        assert_eq!(
            (a.kv_cache_usage, a.requests_waiting, a.preemptions),
            (Some(0.8), Some(12.0), Some(3.0))
        );
        assert_eq!(a.engine_requests, 10);
        assert_eq!(a.phases()[3], ("outside_engine", Some(0.25)));
    }

    #[test]
    fn preemptions_after_a_reset_are_unknown() {
        assert_eq!(preemptions_between(Some(5.0), Some(8.0)), Some(3.0));
        assert_eq!(preemptions_between(Some(5.0), Some(1.0)), None);
        assert_eq!(preemptions_between(None, Some(1.0)), None);
    }

    #[test]
    fn an_engine_with_load_only_is_listed() {
        let load = BTreeMap::from([(String::new(), Load::default())]);
        let a = attribute(&[], &load, &BTreeMap::new());
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].queue_seconds, None);
    }
}
