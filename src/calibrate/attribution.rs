//! Where time goes, per engine model: the engine's own queue, prefill and decode means,
//! the time outside the engine (the proxy's e2e mean minus the engine's over the same
//! interval: network, gateway and load-balancer queues, the proxy), and the engine's load
//! signals at the latest scrape (KV-cache usage, requests waiting and running, preemptions
//! in the last scrape interval). Built from the calibration comparisons and the scrape; an
//! operator who sees attainment drop reads here whether the engine queued, prefilled or
//! decoded slowly, or the time went elsewhere.

use std::collections::BTreeMap;

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

#[cfg(test)]
mod tests {
    use super::*;

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
