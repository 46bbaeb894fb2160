//! GPU telemetry (`--gpu-metrics URL`, one per node's NVIDIA dcgm-exporter): every
//! endpoint is scraped once a second during the run, and each step, the whole run and a
//! soak get the accelerators' figures: utilization mean and P95, framebuffer used max,
//! power mean, temperature max, SM clock min (throttling) and XID errors.
//!
//! The exporter's text is read by [`crate::calibrate::dcgm`] (the live dashboard reads
//! the same endpoints under `[calibration] gpu_metrics`). A figure whose series
//! never had a value in the window is absent (`null`, named in `absent`), never zero: an
//! exporter configured without `DCGM_FI_DEV_XID_ERRORS` says nothing about XIDs.
//!
//! `DCGM_FI_DEV_XID_ERRORS` is a gauge holding the *last* XID a GPU reported, so an error
//! is counted when a GPU's value becomes a new non-zero one (including a non-zero value
//! at the run's first scrape: a GPU that already had an error is not healthy).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::calibrate::dcgm::{
    FB_FREE, FB_USED, POWER, SM_CLOCK, TEMP, THROTTLE, THROTTLE_BENIGN, UTIL, XID,
};
pub use crate::calibrate::dcgm::{Reading, SERIES, parse};
use crate::fetch::{Fetcher, Got};

/// How often the exporters are scraped.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The accelerators' figures over one window (report.json `steps[].resources`,
/// `resources`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuFigures {
    pub gpus: usize,
    pub scrapes: usize,
    pub gpu_utilization_mean: Option<f64>,
    pub gpu_utilization_p95: Option<f64>,
    pub gpu_memory_used_max_mib: Option<f64>,
    /// Per GPU.
    pub gpu_power_mean_w: Option<f64>,
    pub gpu_temperature_max_c: Option<f64>,
    pub gpu_sm_clock_min_mhz: Option<f64>,
    pub gpu_xid_errors: Option<u64>,
    /// The highest share, over the GPUs, of a GPU's samples whose clock throttle reasons
    /// (idle and application-clock settings aside) were set.
    pub throttle_share: Option<f64>,
    /// The figures no exporter had a value for.
    pub absent: Vec<&'static str>,
    /// `--node-metrics`: the engine hosts' figures over the same window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<super::host::HostFigures>,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The figures of the readings in `[lo, hi]`; `all` (every reading, by time) tells
/// which XID values were new.
pub fn figures(all: &[Reading], lo: f64, hi: f64) -> GpuFigures {
    let inside: Vec<&Reading> = all.iter().filter(|r| r.t_s >= lo && r.t_s <= hi).collect();
    let col = |k: usize| -> Vec<f64> { inside.iter().filter_map(|r| r.values[k]).collect() };
    let mut util = col(UTIL);
    util.sort_by(f64::total_cmp);
    let max = |v: Vec<f64>| v.into_iter().reduce(f64::max);
    let min = |v: Vec<f64>| v.into_iter().reduce(f64::min);
    let mut last: BTreeMap<&(usize, String), f64> = BTreeMap::new();
    let mut xid: Option<u64> = None;
    for r in all.iter().filter(|r| r.t_s <= hi) {
        let Some(v) = r.values[XID] else { continue };
        let before = last.insert(&r.gpu, v);
        if r.t_s >= lo {
            let n = xid.get_or_insert(0);
            if v != 0.0 && before != Some(v) {
                *n += 1;
            }
        }
    }
    let mut throttled: BTreeMap<&(usize, String), (u64, u64)> = BTreeMap::new();
    for r in &inside {
        let Some(v) = r.values[THROTTLE] else {
            continue;
        };
        let e = throttled.entry(&r.gpu).or_default();
        e.0 += 1;
        // The mask is an integer; a float that is not one is taken as set.
        let bits = if v >= 0.0 && v.fract() == 0.0 {
            v as u64
        } else {
            u64::MAX
        };
        if bits & !THROTTLE_BENIGN != 0 {
            e.1 += 1;
        }
    }
    let throttle_share = throttled
        .values()
        .filter(|(n, _)| *n > 0)
        .map(|(n, set)| *set as f64 / *n as f64)
        .reduce(f64::max);
    let mut scrapes: Vec<f64> = inside.iter().map(|r| r.t_s).collect();
    scrapes.dedup();
    let gpus: std::collections::BTreeSet<&(usize, String)> =
        inside.iter().map(|r| &r.gpu).collect();
    let mut f = GpuFigures {
        gpus: gpus.len(),
        scrapes: scrapes.len(),
        gpu_utilization_mean: mean(&util),
        gpu_utilization_p95: crate::quantile::nearest_rank(&util, 0.95),
        gpu_memory_used_max_mib: max(col(FB_USED)),
        gpu_power_mean_w: mean(&col(POWER)),
        gpu_temperature_max_c: max(col(TEMP)),
        gpu_sm_clock_min_mhz: min(col(SM_CLOCK)),
        gpu_xid_errors: xid,
        throttle_share,
        absent: Vec::new(),
        host: None,
    };
    let named = [
        ("gpu_utilization", f.gpu_utilization_mean.is_none()),
        ("gpu_memory_used", f.gpu_memory_used_max_mib.is_none()),
        ("gpu_power", f.gpu_power_mean_w.is_none()),
        ("gpu_temperature", f.gpu_temperature_max_c.is_none()),
        ("gpu_sm_clock", f.gpu_sm_clock_min_mhz.is_none()),
        ("gpu_xid_errors", f.gpu_xid_errors.is_none()),
        ("throttle_share", f.throttle_share.is_none()),
    ];
    f.absent = named.iter().filter(|(_, a)| *a).map(|(n, _)| *n).collect();
    f
}

/// The GPUs whose XID value was non-zero at their first scrape (taken before warm-up):
/// an error latched before the run; `None` when no exporter serves XIDs.
pub fn xid_before_run(all: &[Reading]) -> Option<u64> {
    let mut first: BTreeMap<&(usize, String), f64> = BTreeMap::new();
    for r in all {
        if let Some(v) = r.values[XID] {
            first.entry(&r.gpu).or_insert(v);
        }
    }
    (!first.is_empty()).then(|| first.values().filter(|v| **v != 0.0).count() as u64)
}

/// A soak's accelerators, first quarter against last: framebuffer growth past
/// `--soak-max-kv-growth` of the framebuffer fails it, as KV-cache growth does.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuSoak {
    pub memory_used_first_mib: Option<f64>,
    pub memory_used_last_mib: Option<f64>,
    /// Growth as a share of the framebuffer (used + free).
    pub memory_growth: Option<f64>,
    pub max_memory_growth: f64,
    pub sm_clock_first_mhz: Option<f64>,
    pub sm_clock_last_mhz: Option<f64>,
    /// `null` when the framebuffer series are absent or fewer than 8 scrapes fell in it.
    pub holds: Option<bool>,
    pub reasons: Vec<String>,
}

/// The soak check over `[lo, hi]` (see [`GpuSoak`]).
pub fn soak(all: &[Reading], lo: f64, hi: f64, max_growth: f64) -> GpuSoak {
    let q = (hi - lo) / 4.0;
    let avg = |a: f64, b: f64, k: usize| {
        let v: Vec<f64> = all
            .iter()
            .filter(|r| r.t_s >= a && r.t_s <= b)
            .filter_map(|r| r.values[k])
            .collect();
        mean(&v)
    };
    let (first, last) = (avg(lo, lo + q, FB_USED), avg(hi - q, hi, FB_USED));
    let total = avg(lo, hi, FB_USED)
        .zip(avg(lo, hi, FB_FREE))
        .map(|(u, f)| u + f);
    let growth = first
        .zip(last)
        .zip(total.filter(|t| *t > 0.0))
        .map(|((a, b), t)| (b - a) / t);
    let enough = all.iter().filter(|r| r.t_s >= lo && r.t_s <= hi).count() >= 8;
    let holds = growth.filter(|_| enough).map(|g| g <= max_growth + 1e-9);
    let mut reasons = Vec::new();
    if let (Some(false), Some(g), Some(a), Some(b)) = (holds, growth, first, last) {
        reasons.push(format!(
            "GPU memory used grew from {a:.0} to {b:.0} MiB over the soak ({:+.3} of the framebuffer, limit +{max_growth})",
            g
        ));
    }
    GpuSoak {
        memory_used_first_mib: first,
        memory_used_last_mib: last,
        memory_growth: growth,
        max_memory_growth: max_growth,
        sm_clock_first_mhz: avg(lo, lo + q, SM_CLOCK),
        sm_clock_last_mhz: avg(hi - q, hi, SM_CLOCK),
        holds,
        reasons,
    }
}

/// Everything scraped from the exporters over a run: readings of type `R` (dcgm's by
/// default; node_exporter's for `--node-metrics`).
#[derive(Debug)]
pub struct Telemetry<R = Reading> {
    pub urls: Vec<String>,
    pub readings: Vec<R>,
    pub scrapes: u64,
    pub failed_scrapes: u64,
    pub last_error: Option<String>,
}

impl<R> Default for Telemetry<R> {
    fn default() -> Self {
        Telemetry {
            urls: Vec::new(),
            readings: Vec::new(),
            scrapes: 0,
            failed_scrapes: 0,
            last_error: None,
        }
    }
}

/// A reading taken at a time (seconds since the run's start).
pub trait Timed {
    fn t_s(&self) -> f64;
}

impl Timed for Reading {
    fn t_s(&self) -> f64 {
        self.t_s
    }
}

/// How an exporter's text becomes readings: `(text, endpoint index, seconds since t0)`.
pub type Parse<R> = fn(&str, usize, f64) -> Vec<R>;

/// The scraping task of one run (one per kind of exporter).
pub struct GpuWatch<R = Reading> {
    seen: Arc<Mutex<Telemetry<R>>>,
    task: tokio::task::JoinHandle<()>,
    fetcher: Fetcher,
    urls: Vec<String>,
    t0: Instant,
    parse: Parse<R>,
}

impl GpuWatch<Reading> {
    /// Starts scraping dcgm-exporters at `urls` every [`INTERVAL`] (the first at once),
    /// timed from `t0`.
    pub fn start(urls: Vec<String>, fetcher: Fetcher, t0: Instant) -> GpuWatch {
        GpuWatch::start_with(urls, fetcher, t0, parse)
    }
}

impl<R: Timed + Send + 'static> GpuWatch<R> {
    /// Starts scraping `urls` every [`INTERVAL`] (the first at once), read by `parse`.
    pub fn start_with(urls: Vec<String>, fetcher: Fetcher, t0: Instant, parse: Parse<R>) -> Self {
        let seen = Arc::new(Mutex::new(Telemetry {
            urls: urls.clone(),
            ..Telemetry::default()
        }));
        let (s, f, u) = (seen.clone(), fetcher.clone(), urls.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                scrape_all(&f, &u, &s, t0, parse).await;
            }
        });
        GpuWatch {
            seen,
            task,
            fetcher,
            urls,
            t0,
            parse,
        }
    }

    /// Stops after one last scrape, so the last window has its closing readings.
    pub async fn finish(self) -> Telemetry<R> {
        self.task.abort();
        scrape_all(&self.fetcher, &self.urls, &self.seen, self.t0, self.parse).await;
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut t = std::mem::take(&mut *seen);
        // The aborted task may have finished a scrape beside the last one.
        t.readings.sort_by(|a, b| a.t_s().total_cmp(&b.t_s()));
        t
    }
}

async fn scrape_all<R>(
    f: &Fetcher,
    urls: &[String],
    seen: &Mutex<Telemetry<R>>,
    t0: Instant,
    parse: Parse<R>,
) {
    for (node, url) in urls.iter().enumerate() {
        let got = f.get(url, false).await;
        let t_s = t0.elapsed().as_secs_f64();
        let mut s = seen.lock().unwrap_or_else(PoisonError::into_inner);
        s.scrapes += 1;
        match got {
            Ok(Got { status, body, .. }) if status.is_success() => {
                let text = String::from_utf8_lossy(&body);
                s.readings.extend(parse(&text, node, t_s));
            }
            Ok(Got { status, .. }) => {
                s.failed_scrapes += 1;
                s.last_error = Some(format!("{url}: HTTP {status}"));
            }
            Err(e) => {
                s.failed_scrapes += 1;
                s.last_error = Some(format!("{url}: {e}"));
            }
        }
    }
}

/// report.json `resources`: the exporters, the whole run's figures and a soak's check.
#[derive(Debug, Clone, Serialize)]
pub struct ResourcesOut {
    pub urls: Vec<String>,
    pub interval_s: f64,
    /// GETs of the exporters (one per URL per second); `scrapes` (flattened from the
    /// figures) counts the scrape instants that had readings.
    pub scrape_attempts: u64,
    pub failed_scrapes: u64,
    pub last_error: Option<String>,
    /// GPUs whose XID was non-zero at the first scrape, before the run's load.
    pub gpu_xid_before_run: Option<u64>,
    /// Engine restarts seen in its metrics during the run (`null`: not read).
    pub engine_restarts: Option<u64>,
    /// Answers with a 5xx whose body named out-of-memory (the engine ran out of memory).
    pub engine_oom_answers: u64,
    /// The GPUs' figures, and the hosts' as `host` (without `--gpu-metrics`, the GPU
    /// figures are absent and `urls` empty).
    #[serde(flatten)]
    pub overall: GpuFigures,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<GpuSoak>,
}

#[cfg(test)]
mod tests;
