//! NVIDIA dcgm-exporter's Prometheus text: one series per GPU
//! (`DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-…",…} 87`), read into one [`Reading`] per GPU
//! and scrape. DCGM's "blank" sentinels (values of 2^47 and more: not supported, not yet
//! sampled) are no value, so a series the GPU does not serve stays absent, never zero.
//! Used by `goodput replay --gpu-metrics` and by the live `[calibration] gpu_metrics`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::exposition::parse_line;

/// DCGM's blank values (int64 sentinels near 2^63, the float blank 2^47) are no value.
const DCGM_BLANK: f64 = 140_737_488_355_328.0;

/// The series read, in the order of [`Reading::values`].
pub const SERIES: [&str; 8] = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
];

/// The name newer DCGM releases give the throttle reasons (the same bit mask).
const CLOCKS_EVENT_REASONS: &str = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS";
pub const UTIL: usize = 0;
pub const FB_USED: usize = 1;
pub const FB_FREE: usize = 2;
pub const POWER: usize = 3;
pub const TEMP: usize = 4;
pub const SM_CLOCK: usize = 5;
pub const XID: usize = 6;
/// A bit mask of why the clocks are held down (DCGM's `DCGM_CLOCKS_EVENT_REASON_*`).
pub const THROTTLE: usize = 7;

/// Throttle reason bits that are no trouble: the GPU is idle (0x1), or its application
/// clocks were set so (0x2).
pub const THROTTLE_BENIGN: u64 = 0x1 | 0x2;

/// One GPU at one scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// Seconds after the run started.
    pub t_s: f64,
    /// `--gpu-metrics` index and the exporter's `gpu` (else `UUID`) label.
    pub gpu: (usize, String),
    pub values: [Option<f64>; 8],
}

/// Every reading of a dcgm-exporter answer, at `t_s`, from endpoint `node`.
pub fn parse(text: &str, node: usize, t_s: f64) -> Vec<Reading> {
    let mut by_gpu: BTreeMap<String, [Option<f64>; 8]> = BTreeMap::new();
    for line in text.lines() {
        let Ok(Some(s)) = parse_line(line) else {
            continue;
        };
        let known = SERIES.iter().position(|n| *n == s.name);
        let Some(k) = known.or((s.name == CLOCKS_EVENT_REASONS).then_some(THROTTLE)) else {
            continue;
        };
        let id = s.label("gpu").or(s.label("UUID")).unwrap_or("0").to_owned();
        let v = (s.value.is_finite() && s.value.abs() < DCGM_BLANK).then_some(s.value);
        by_gpu.entry(id).or_default()[k] = v;
    }
    by_gpu
        .into_iter()
        .map(|(id, values)| Reading {
            t_s,
            gpu: (node, id),
            values,
        })
        .collect()
}

/// The GPUs at one scrape, for the live dashboard: beside the engine's KV-cache use.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuNow {
    /// The exporters answered at the last scrape / were asked.
    pub exporters_up: usize,
    pub exporters: usize,
    pub gpus: usize,
    /// % mean and highest over the GPUs; `null` when no exporter served the series.
    pub utilization_mean: Option<f64>,
    pub utilization_max: Option<f64>,
    pub memory_used_mib_max: Option<f64>,
    /// Used over used + free, the fullest GPU's.
    pub memory_used_share_max: Option<f64>,
    pub last_error: Option<String>,
}

impl GpuNow {
    /// The dashboard's view of one scrape's `readings` (every exporter's).
    pub fn of(readings: &[Reading], exporters: usize, up: usize, error: Option<String>) -> GpuNow {
        let col = |k: usize| -> Vec<f64> { readings.iter().filter_map(|r| r.values[k]).collect() };
        let util = col(UTIL);
        let share = readings
            .iter()
            .filter_map(|r| {
                let (u, f) = (r.values[FB_USED]?, r.values[FB_FREE]?);
                (u + f > 0.0).then(|| u / (u + f))
            })
            .reduce(f64::max);
        GpuNow {
            exporters_up: up,
            exporters,
            gpus: readings.len(),
            utilization_mean: (!util.is_empty())
                .then(|| util.iter().sum::<f64>() / util.len() as f64),
            utilization_max: util.iter().copied().reduce(f64::max),
            memory_used_mib_max: col(FB_USED).into_iter().reduce(f64::max),
            memory_used_share_max: share,
            last_error: error,
        }
    }
}
