//! Where the target's time went and what its engine held, per step: the engine's own
//! queue, prefill and decode means, the time outside the engine (the client-side e2e mean
//! minus the engine's), KV-cache usage, requests waiting and running, preemptions.
//!
//! A task scrapes the engine's metrics (the calibration code: [`crate::calibrate::Scraper`],
//! vLLM or SGLang names) every `--engine-metrics-interval` during the run and keeps one
//! small [`Point`] per scrape: the cumulative sums and counts of the phase histograms
//! summed over models, and the load gauges. A step's phase means are the differences of
//! the sums over the differences of the counts between the scrapes inside its measuring
//! window; an interval in which a counter went back (the engine restarted) is skipped, as
//! the calibration does. Load is read from the scrapes inside the window: peak and mean
//! KV-cache usage and waiting requests, the mean of running requests and its coefficient
//! of variation (the batch jitter), preemptions summed over the intervals.
//!
//! A soak is judged on its resources too: the last quarter of its scrapes against the
//! first (the guides' memory growth and batch jitter); growth past a limit fails every
//! class's verdict, naming what drifted. A scrape that fails costs a count and the last
//! error in the report, never the run.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::calibrate::{Cumulative, Engine, Extracted, Quantity, Scraper};

/// The phase histograms kept per scrape, in this order.
const PHASES: [Quantity; 4] = [
    Quantity::Queue,
    Quantity::Prefill,
    Quantity::Decode,
    Quantity::E2e,
];

/// Fewest scrapes in a soak for its first and last quarter to say anything.
pub const MIN_SOAK_SCRAPES: usize = 8;

/// One scrape, seconds after the run started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    pub t_s: f64,
    /// Cumulative (seconds, requests) of [`PHASES`] over every model.
    pub phases: [Option<Cumulative>; 4],
    /// Highest KV-cache usage of any model (0..1).
    pub kv_cache_usage: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
    pub preemptions_total: Option<f64>,
}

impl Point {
    pub fn of(t_s: f64, e: &Extracted) -> Point {
        let mut phases = [None; 4];
        for ((q, _), c) in &e.series {
            if let Some(k) = PHASES.iter().position(|p| p == q) {
                let slot: &mut Cumulative = phases[k].get_or_insert_default();
                slot.sum += c.sum;
                slot.count += c.count;
            }
        }
        let mut p = Point {
            t_s,
            phases,
            ..Point::default()
        };
        let add = |slot: &mut Option<f64>, v: Option<f64>| {
            if let Some(v) = v {
                *slot = Some(slot.unwrap_or(0.0) + v);
            }
        };
        for l in e.load.values() {
            if let Some(kv) = l.kv_cache_usage {
                p.kv_cache_usage = Some(p.kv_cache_usage.map_or(kv, |u| u.max(kv)));
            }
            add(&mut p.requests_waiting, l.requests_waiting);
            add(&mut p.requests_running, l.requests_running);
            add(&mut p.preemptions_total, l.preemptions_total);
        }
        p
    }
}

/// What the scraping task saw.
#[derive(Debug, Default)]
struct Seen {
    points: Vec<Point>,
    engine: Option<Engine>,
    failed: u64,
    last_error: Option<String>,
}

/// The scraping task of one run.
pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
    scraper: Scraper,
    t0: Instant,
    interval: Duration,
}

/// Everything scraped over a run.
#[derive(Debug, Default)]
pub struct Scrapes {
    pub url: String,
    pub interval_s: f64,
    pub points: Vec<Point>,
    pub engine: Option<Engine>,
    pub failed: u64,
    pub last_error: Option<String>,
}

impl Watch {
    /// Starts scraping every `interval` (the first scrape at once), timing points from `t0`.
    pub fn start(scraper: Scraper, interval: Duration, t0: Instant) -> Watch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (s, sc) = (seen.clone(), scraper.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                scrape_once(&sc, &s, t0).await;
            }
        });
        Watch {
            seen,
            task,
            scraper,
            t0,
            interval,
        }
    }

    /// Stops the task after one last scrape (so the last window has its closing point).
    pub async fn finish(self) -> Scrapes {
        self.task.abort();
        scrape_once(&self.scraper, &self.seen, self.t0).await;
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = std::mem::take(&mut *seen);
        let mut points = seen.points;
        points.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
        Scrapes {
            url: self.scraper.shown_url(),
            interval_s: self.interval.as_secs_f64(),
            points,
            engine: seen.engine,
            failed: seen.failed,
            last_error: seen.last_error,
        }
    }
}

async fn scrape_once(scraper: &Scraper, seen: &Mutex<Seen>, t0: Instant) {
    let result = scraper.scrape().await;
    let t_s = t0.elapsed().as_secs_f64();
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    match result {
        Ok(e) => {
            seen.engine = Some(e.engine);
            seen.points.push(Point::of(t_s, &e));
        }
        Err(e) => {
            seen.failed += 1;
            seen.last_error = Some(format!("{}: {e}", e.kind()));
        }
    }
}

/// Running sums over one or more windows, merged for the whole run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Acc {
    scrapes: usize,
    /// Seconds and requests per phase, over the intervals inside the windows.
    phases: [(f64, f64); 4],
    kv: Moments,
    waiting: Moments,
    running: Moments,
    preemptions: Option<f64>,
    restarted: bool,
}

/// Count, sum, sum of squares and peak of a gauge's readings.
#[derive(Debug, Clone, Copy, Default)]
struct Moments {
    n: f64,
    sum: f64,
    sq: f64,
    peak: Option<f64>,
}

impl Moments {
    fn add(&mut self, v: Option<f64>) {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            return;
        };
        self.n += 1.0;
        self.sum += v;
        self.sq += v * v;
        self.peak = Some(self.peak.map_or(v, |p| p.max(v)));
    }

    fn merge(&mut self, o: &Moments) {
        self.n += o.n;
        self.sum += o.sum;
        self.sq += o.sq;
        self.peak = match (self.peak, o.peak) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    fn mean(&self) -> Option<f64> {
        (self.n > 0.0).then(|| self.sum / self.n)
    }

    /// Standard deviation over mean (population), `None` without readings or at mean 0.
    fn cv(&self) -> Option<f64> {
        let mean = self.mean()?;
        if mean.abs() < 1e-12 {
            return None;
        }
        let var = (self.sq / self.n - mean * mean).max(0.0);
        Some(var.sqrt() / mean)
    }
}

impl Acc {
    /// The scrapes taken inside `[lo, hi]` (seconds after the start).
    pub fn window(points: &[Point], lo: f64, hi: f64) -> Acc {
        let inside: Vec<&Point> = points
            .iter()
            .filter(|p| p.t_s >= lo && p.t_s <= hi)
            .collect();
        let mut acc = Acc {
            scrapes: inside.len(),
            ..Acc::default()
        };
        for p in &inside {
            acc.kv.add(p.kv_cache_usage);
            acc.waiting.add(p.requests_waiting);
            acc.running.add(p.requests_running);
        }
        for pair in inside.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let mut back = false;
            let mut deltas = [None; 4];
            for (k, d) in deltas.iter_mut().enumerate() {
                if let (Some(x), Some(y)) = (a.phases[k], b.phases[k]) {
                    let (ds, dc) = (y.sum - x.sum, y.count - x.count);
                    if ds < -1e-9 || dc < -1e-9 {
                        back = true;
                    }
                    *d = Some((ds.max(0.0), dc.max(0.0)));
                }
            }
            let preempted = match (a.preemptions_total, b.preemptions_total) {
                (Some(x), Some(y)) if y < x => {
                    back = true;
                    None
                }
                (Some(x), Some(y)) => Some(y - x),
                _ => None,
            };
            if back {
                acc.restarted = true;
                continue;
            }
            for (slot, d) in acc.phases.iter_mut().zip(deltas) {
                if let Some((ds, dc)) = d {
                    *slot = (slot.0 + ds, slot.1 + dc);
                }
            }
            if let Some(n) = preempted {
                acc.preemptions = Some(acc.preemptions.unwrap_or(0.0) + n);
            }
        }
        acc
    }

    /// A counter went back between two scrapes of the windows.
    pub fn restarted(&self) -> bool {
        self.restarted
    }

    pub fn note_restart(&mut self, restarted: bool) {
        self.restarted |= restarted;
    }

    pub fn merge(&mut self, o: &Acc) {
        self.scrapes += o.scrapes;
        for (a, b) in self.phases.iter_mut().zip(o.phases) {
            *a = (a.0 + b.0, a.1 + b.1);
        }
        self.kv.merge(&o.kv);
        self.waiting.merge(&o.waiting);
        self.running.merge(&o.running);
        self.preemptions = match (self.preemptions, o.preemptions) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.restarted |= o.restarted;
    }

    /// The numbers, with the client-side mean e2e of the same requests (ms).
    pub fn resources(&self, client_e2e_ms: Option<f64>) -> Resources {
        let ms = |k: usize| {
            let (s, n) = self.phases[k];
            (n >= 0.5).then(|| s / n * 1e3)
        };
        let engine_e2e_ms = ms(3);
        Resources {
            scrapes: self.scrapes,
            engine_requests: self.phases[3].1.round().max(0.0) as u64,
            queue_ms: ms(0),
            prefill_ms: ms(1),
            decode_ms: ms(2),
            engine_e2e_ms,
            client_e2e_ms,
            outside_engine_ms: match (client_e2e_ms, engine_e2e_ms) {
                (Some(c), Some(e)) => Some(c - e),
                _ => None,
            },
            kv_cache_usage_peak: self.kv.peak,
            kv_cache_usage_mean: self.kv.mean(),
            requests_waiting_peak: self.waiting.peak,
            requests_waiting_mean: self.waiting.mean(),
            requests_running_mean: self.running.mean(),
            batch_jitter: self.running.cv(),
            preemptions: self.preemptions,
            engine_restarted: self.restarted,
        }
    }
}

/// The engine's time and load over one step (or the whole run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resources {
    /// Scrapes inside the measuring window.
    pub scrapes: usize,
    /// Requests the engine finished between the first and last of them.
    pub engine_requests: u64,
    pub queue_ms: Option<f64>,
    pub prefill_ms: Option<f64>,
    pub decode_ms: Option<f64>,
    pub engine_e2e_ms: Option<f64>,
    /// The replay's own mean e2e of the step's measured requests that were answered
    /// (outcome `ok`), as the engine counts finished requests.
    pub client_e2e_ms: Option<f64>,
    /// Client e2e − engine e2e: network, gateway and load-balancer queues.
    pub outside_engine_ms: Option<f64>,
    pub kv_cache_usage_peak: Option<f64>,
    pub kv_cache_usage_mean: Option<f64>,
    pub requests_waiting_peak: Option<f64>,
    pub requests_waiting_mean: Option<f64>,
    pub requests_running_mean: Option<f64>,
    /// Coefficient of variation of the running requests (batch size) over the scrapes.
    pub batch_jitter: Option<f64>,
    pub preemptions: Option<f64>,
    /// A counter went back in the window (the engine restarted); its interval is skipped.
    pub engine_restarted: bool,
}

/// How far a soak's resources may drift, last quarter of its scrapes against the first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SoakLimits {
    /// KV-cache usage growth, as a share of the cache (0.10 = ten points).
    pub max_kv_growth: f64,
    /// Growth of the mean number of requests waiting.
    pub max_waiting_growth: f64,
    /// Growth of the batch jitter (coefficient of variation of running requests).
    pub max_jitter_growth: f64,
}

/// A soak's resources, first quarter against last.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SoakResources {
    pub scrapes: usize,
    pub kv_cache_usage_first: Option<f64>,
    pub kv_cache_usage_last: Option<f64>,
    pub requests_waiting_first: Option<f64>,
    pub requests_waiting_last: Option<f64>,
    pub batch_jitter_first: Option<f64>,
    pub batch_jitter_last: Option<f64>,
    #[serde(flatten)]
    pub limits: SoakLimits,
    /// No limit crossed (`null`: too few scrapes or no load signals to tell).
    pub holds: Option<bool>,
    /// What drifted past its limit, or why nothing could be judged.
    pub reasons: Vec<String>,
}

/// Judges the scrapes inside a soak's window `[lo, hi]` against `limits`.
pub fn soak(points: &[Point], lo: f64, hi: f64, limits: SoakLimits) -> SoakResources {
    let inside: Vec<Point> = points
        .iter()
        .filter(|p| p.t_s >= lo && p.t_s <= hi)
        .copied()
        .collect();
    let n = inside.len();
    let mut out = SoakResources {
        scrapes: n,
        kv_cache_usage_first: None,
        kv_cache_usage_last: None,
        requests_waiting_first: None,
        requests_waiting_last: None,
        batch_jitter_first: None,
        batch_jitter_last: None,
        limits,
        holds: None,
        reasons: Vec::new(),
    };
    if n < MIN_SOAK_SCRAPES {
        out.reasons.push(format!(
            "{n} engine scrapes in the soak, too few to compare its first and last quarter (needs {MIN_SOAK_SCRAPES})"
        ));
        return out;
    }
    let q = n / 4;
    let (first, last) = (&inside[..q], &inside[n - q..]);
    let moments = |part: &[Point], f: fn(&Point) -> Option<f64>| {
        let mut m = Moments::default();
        for p in part {
            m.add(f(p));
        }
        m
    };
    let kv = |p: &Point| p.kv_cache_usage;
    let waiting = |p: &Point| p.requests_waiting;
    let running = |p: &Point| p.requests_running;
    out.kv_cache_usage_first = moments(first, kv).mean();
    out.kv_cache_usage_last = moments(last, kv).mean();
    out.requests_waiting_first = moments(first, waiting).mean();
    out.requests_waiting_last = moments(last, waiting).mean();
    out.batch_jitter_first = moments(first, running).cv();
    out.batch_jitter_last = moments(last, running).cv();
    let checks = [
        (
            "KV-cache usage",
            out.kv_cache_usage_first,
            out.kv_cache_usage_last,
            limits.max_kv_growth,
        ),
        (
            "requests waiting",
            out.requests_waiting_first,
            out.requests_waiting_last,
            limits.max_waiting_growth,
        ),
        (
            "batch jitter",
            out.batch_jitter_first,
            out.batch_jitter_last,
            limits.max_jitter_growth,
        ),
    ];
    let mut judged = false;
    for (what, a, b, max) in checks {
        let (Some(a), Some(b)) = (a, b) else { continue };
        judged = true;
        if b - a > max {
            out.reasons.push(format!(
                "{what} grew from {a:.3} to {b:.3} over the soak (+{:.3}, limit +{max})",
                b - a
            ));
        }
    }
    if judged {
        out.holds = Some(out.reasons.is_empty());
    } else {
        out.reasons
            .push("the engine exports no KV-cache, waiting or running gauges".into());
    }
    out
}

/// report.json `attribution`: the scrape source, the whole run and every step
/// (`overall.engine_restarted` also covers a restart between two steps' windows).
#[derive(Debug, Clone, Serialize)]
pub struct AttributionOut {
    /// The metrics URL, without credentials.
    pub url: String,
    pub engine: Option<Engine>,
    pub interval_s: f64,
    pub scrapes: usize,
    pub failed_scrapes: u64,
    pub last_error: Option<String>,
    /// Every reported step's window together.
    pub overall: Resources,
    pub steps: Vec<StepResources>,
    /// soak: the first quarter of its scrapes against the last, and the limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakResources>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepResources {
    pub label: String,
    #[serde(flatten)]
    pub resources: Resources,
}

#[cfg(test)]
mod tests;
