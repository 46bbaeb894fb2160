//! From two consecutive scrapes to a comparison: the engine's mean over the interval
//! (difference of cumulative sums over difference of counts), the proxy's mean over the
//! same interval taken the same way from [`super::ProxyTotals`], and proxy − engine.
//!
//! A series whose count or sum went down was reset (engine restart, or a new process behind
//! the same address): its interval is skipped and the new values become the baseline. A
//! series that was not in the previous scrape counts from zero. Each comparison holds until
//! an interval in which the engine finished requests of that series again, so an idle
//! engine keeps showing its last numbers; `samples` says how many requests they came from.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use serde::Serialize;

use super::{Cumulative, Engine, Quantity, engines::Series};

/// One quantity of one engine model over the latest interval with engine observations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The engine's `model_name` (`""`: the engine gave none; compared with all traffic).
    pub model: String,
    pub metric: Quantity,
    /// Length of the interval, seconds.
    pub interval_seconds: f64,
    pub engine_seconds: f64,
    pub engine_samples: u64,
    /// `None` for engine-only quantities, or when the proxy saw none in the interval.
    pub proxy_seconds: Option<f64>,
    pub proxy_samples: u64,
    /// proxy − engine: time spent outside the engine.
    pub difference_seconds: Option<f64>,
}

/// What `GET /api/v1/calibration` serves.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    pub enabled: bool,
    /// The metrics URL without credentials.
    pub url: Option<String>,
    /// The engine recognized at the last successful scrape.
    pub engine: Option<Engine>,
    /// Whether the last scrape succeeded.
    pub up: bool,
    /// The last scrape's result (as in `goodput_calibration_scrapes_total{result}`).
    pub last_result: Option<&'static str>,
    pub comparisons: Vec<Comparison>,
    /// Where time goes per engine model, with the engine's load, over the latest interval
    /// (see `attribution`).
    pub attribution: Vec<super::Attribution>,
    /// `[calibration] gpu_metrics`: the GPUs at the last scrape (`null` without exporters).
    pub gpus: Option<super::dcgm::GpuNow>,
    /// Each scrape's attribution, for means over a window ([`Status::attribution_over`]).
    #[serde(skip)]
    pub history: super::attribution::History,
}

impl Status {
    /// Where time went per engine model over the last `window` (what the summary of that
    /// window reports).
    pub fn attribution_over(
        &self,
        window: std::time::Duration,
        now: Instant,
    ) -> Vec<super::Attribution> {
        self.history.over(window, now)
    }
}

/// The latest [`Status`], shared with the admin server.
pub type CalibrationView = Arc<Mutex<Status>>;

/// What changed at one scrape.
#[derive(Debug, Default, PartialEq)]
pub struct Update {
    /// Comparisons recomputed from this interval.
    pub changed: Vec<Comparison>,
    /// Series the engine no longer exposes.
    pub removed: Vec<(Quantity, String)>,
    /// Some series went backwards (the engine restarted).
    pub reset: bool,
}

/// The baseline of the previous scrape and the latest comparisons.
#[derive(Debug, Default)]
pub struct Tracker {
    prev: Option<(Series, Series, Instant)>,
    latest: BTreeMap<(Quantity, String), Comparison>,
}

fn mean(sum: f64, count: f64) -> Option<f64> {
    (count >= 0.5).then(|| sum / count)
}

fn delta(now: Option<&Cumulative>, before: Option<&Cumulative>) -> Cumulative {
    let now = now.copied().unwrap_or_default();
    let before = before.copied().unwrap_or_default();
    Cumulative {
        sum: now.sum - before.sum,
        count: now.count - before.count,
    }
}

/// Whether `now` is lower than `before` beyond float noise.
fn went_back(now: &Cumulative, before: &Cumulative) -> bool {
    let tolerance = |v: f64| v.abs() * 1e-9 + 1e-9;
    now.count < before.count - tolerance(before.count)
        || now.sum < before.sum - tolerance(before.sum)
}

impl Tracker {
    /// Takes a successful scrape (`engine`) and the proxy's totals read right after it.
    pub fn observe(&mut self, engine: Series, proxy: Series, now: Instant) -> Update {
        let mut update = Update::default();
        let Some((prev_engine, prev_proxy, prev_at)) = self.prev.take() else {
            self.prev = Some((engine, proxy, now));
            return update;
        };
        let interval = now.duration_since(prev_at).as_secs_f64();
        for (key, cur) in &engine {
            let before = prev_engine.get(key);
            if let Some(before) = before
                && went_back(cur, before)
            {
                update.reset = true;
                continue;
            }
            let d = delta(Some(cur), before);
            let Some(engine_mean) = mean(d.sum, d.count) else {
                continue;
            };
            let (proxy_mean, proxy_samples) = if key.0.measured_by_proxy() {
                let p = delta(proxy.get(key), prev_proxy.get(key));
                (mean(p.sum, p.count), p.count.round().max(0.0) as u64)
            } else {
                (None, 0)
            };
            let c = Comparison {
                model: key.1.clone(),
                metric: key.0,
                interval_seconds: interval,
                engine_seconds: engine_mean,
                engine_samples: d.count.round() as u64,
                proxy_seconds: proxy_mean,
                proxy_samples,
                difference_seconds: proxy_mean.map(|p| p - engine_mean),
            };
            self.latest.insert(key.clone(), c.clone());
            update.changed.push(c);
        }
        self.latest.retain(|key, _| {
            let keep = engine.contains_key(key);
            if !keep {
                update.removed.push(key.clone());
            }
            keep
        });
        self.prev = Some((engine, proxy, now));
        update
    }

    /// Forgets everything (new target); returns the series that had comparisons.
    pub fn clear(&mut self) -> Vec<(Quantity, String)> {
        self.prev = None;
        std::mem::take(&mut self.latest).into_keys().collect()
    }

    pub fn comparisons(&self) -> Vec<Comparison> {
        self.latest.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn series(items: &[(Quantity, &str, f64, f64)]) -> Series {
        items
            .iter()
            .map(|&(q, m, sum, count)| ((q, m.to_owned()), Cumulative { sum, count }))
            .collect()
    }

    #[test]
    fn first_scrape_is_the_baseline_then_interval_means_compare() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let e0 = series(&[
            (Quantity::Ttft, "m", 10.0, 100.0),
            (Quantity::Queue, "m", 1.0, 100.0),
        ]);
        let p0 = series(&[(Quantity::Ttft, "m", 5.0, 40.0)]);
        assert_eq!(t.observe(e0, p0, t0), Update::default());

        // 10 more requests: engine mean 0.1 s, proxy mean 0.12 s.
        let e1 = series(&[
            (Quantity::Ttft, "m", 11.0, 110.0),
            (Quantity::Queue, "m", 1.05, 110.0),
        ]);
        let p1 = series(&[(Quantity::Ttft, "m", 6.2, 50.0)]);
        let u = t.observe(e1, p1, t0 + Duration::from_secs(15));
        assert!(!u.reset);
        assert_eq!(u.changed.len(), 2);
        let ttft = u
            .changed
            .iter()
            .find(|c| c.metric == Quantity::Ttft)
            .unwrap();
        assert!((ttft.engine_seconds - 0.1).abs() < 1e-9);
        assert!((ttft.proxy_seconds.unwrap() - 0.12).abs() < 1e-9);
        assert!((ttft.difference_seconds.unwrap() - 0.02).abs() < 1e-9);
        assert_eq!((ttft.engine_samples, ttft.proxy_samples), (10, 10));
        assert_eq!(ttft.interval_seconds, 15.0);
        let queue = u
            .changed
            .iter()
            .find(|c| c.metric == Quantity::Queue)
            .unwrap();
        assert!((queue.engine_seconds - 0.005).abs() < 1e-9);
        assert_eq!(
            (queue.proxy_seconds, queue.difference_seconds),
            (None, None)
        );
    }

    #[test]
    fn idle_intervals_keep_the_last_comparison() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let e = |sum, count| series(&[(Quantity::E2e, "", sum, count)]);
        t.observe(e(0.0, 0.0), Series::new(), t0);
        let u = t.observe(e(2.0, 1.0), Series::new(), t0 + Duration::from_secs(1));
        assert_eq!(u.changed.len(), 1);
        assert_eq!(u.changed[0].proxy_seconds, None);
        let u = t.observe(e(2.0, 1.0), Series::new(), t0 + Duration::from_secs(2));
        assert!(u.changed.is_empty());
        assert_eq!(t.comparisons().len(), 1);
        assert_eq!(t.comparisons()[0].engine_seconds, 2.0);
    }

    #[test]
    fn counter_resets_are_skipped_and_rebaselined() {
        let t0 = Instant::now();
        let s = |i| t0 + Duration::from_secs(i);
        let mut t = Tracker::default();
        let e = |sum, count| series(&[(Quantity::E2e, "m", sum, count)]);
        let p = |sum, count| series(&[(Quantity::E2e, "m", sum, count)]);
        t.observe(e(100.0, 50.0), p(110.0, 50.0), s(0));
        // Engine restarted: 3 requests since, counts went down.
        let u = t.observe(e(3.0, 3.0), p(120.0, 55.0), s(1));
        assert!(u.reset);
        assert!(u.changed.is_empty());
        // From the new baseline on, intervals compare again.
        let u = t.observe(e(5.0, 5.0), p(122.4, 57.0), s(2));
        assert!(!u.reset);
        let c = &u.changed[0];
        assert!((c.engine_seconds - 1.0).abs() < 1e-9);
        assert!((c.difference_seconds.unwrap() - 0.2).abs() < 1e-9);
        // A sum that went down with an equal count is a reset too.
        let u = t.observe(e(1.0, 5.0), p(122.4, 57.0), s(3));
        assert!(u.reset);
    }

    #[test]
    fn new_series_count_from_zero_and_gone_series_are_removed() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.observe(series(&[(Quantity::E2e, "a", 1.0, 1.0)]), Series::new(), t0);
        let u = t.observe(
            series(&[
                (Quantity::E2e, "a", 3.0, 2.0),
                (Quantity::E2e, "b", 4.0, 2.0),
            ]),
            Series::new(),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(u.changed.len(), 2);
        let b = u.changed.iter().find(|c| c.model == "b").unwrap();
        assert_eq!(b.engine_seconds, 2.0);
        let u = t.observe(
            series(&[(Quantity::E2e, "b", 4.0, 2.0)]),
            Series::new(),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(u.removed, vec![(Quantity::E2e, "a".to_owned())]);
        assert_eq!(t.clear(), vec![(Quantity::E2e, "b".to_owned())]);
        assert!(t.comparisons().is_empty());
    }
}
