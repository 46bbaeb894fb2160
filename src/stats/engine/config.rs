//! What the engine is told: its configuration (built by the integrator from the validated
//! `[slo]` and `[cost]` config sections) and one [`Observation`] per finished request.
//! Kept free of config-file types so the engine can be tested and reused on its own.

use std::time::{Duration, Instant};

pub use crate::decode::FinishReason;
use crate::measure::Outcome;
pub use crate::measure::record::Component;
pub use crate::measure::verdict::MissCause;

/// Name of the class that takes every request no configured class matched; also where
/// observations naming an unknown class are counted.
pub const DEFAULT_CLASS: &str = "default";

/// One finished request, as the aggregator hands it to the engine.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    /// `t_arrival`.
    pub started: Instant,
    /// End of the response. Decides which time slice the request is counted in.
    pub finished: Instant,
    /// SLO class name (one of the configured ones, or `default`).
    pub class: &'a str,
    /// Bounded label value (`other` / `unknown` already applied).
    pub model: &'a str,
    pub outcome: Outcome,
    /// `None` = excluded from attainment (client aborts).
    pub slo_met: Option<bool>,
    /// TTFT and e2e as the SLO judges them: from the end of the request body
    /// (`ttft_after_upload_ms`, `e2e_after_upload_ms`).
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// Every inter-token gap of this request, in microseconds.
    pub itl_us: &'a [u32],
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// In-flight requests when it arrived, itself included.
    pub concurrency_at_start: u32,
    /// A long-input request was in flight when it arrived.
    pub long_in_flight_at_start: bool,
    /// Why it missed its SLO (`None` when met or without a verdict).
    pub miss_cause: Option<MissCause>,
    pub finish_reason: Option<FinishReason>,
    /// Input tokens the upstream served from its prefix cache, when it reports them.
    pub cached_input_tokens: Option<u64>,
    /// The engine's own split of the request's time (ms), indexed like [`Component::ALL`];
    /// all `None` when the engine reported none.
    pub engine_parts: [Option<f64>; Component::ALL.len()],
    /// The part a latency miss is attributed to, with engine timings.
    pub miss_component: Option<Component>,
}

/// Runtime configuration of the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Sliding windows, e.g. 1m, 5m, 1h. Windows shorter than [`MIN_WINDOW`] are raised to
    /// it; duplicates are dropped; the order given is the order reported.
    pub windows: Vec<Duration>,
    /// In config order; `default` is always present last (appended when missing).
    pub classes: Vec<ClassConfig>,
    /// Upper bounds in tokens, e.g. `[1024, 4096, 16384, 65536]`; one more bucket holds
    /// everything above the last. The first bucket is what "short input" means.
    pub input_buckets: Vec<u64>,
    /// Samples (requests with a verdict) a concurrency level needs before it can count as
    /// stable.
    pub min_samples: u64,
    /// How long per-window stability series are kept (e.g. 6h).
    pub history: Duration,
    /// Slices of the shortest window the timeline keeps (at most
    /// [`super::MAX_TIMELINE_POINTS`]; 0 keeps none).
    pub timeline_points: usize,
    /// Ignored unless `per_hour` is finite and not negative (validation's job; the engine
    /// only refuses to report nonsense).
    pub cost: Option<CostConfig>,
}

/// The shortest window the engine keeps; shorter configured windows are raised to it so a
/// zero duration can never divide anything.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq)]
pub struct ClassConfig {
    pub name: String,
    /// Attainment target, e.g. 0.99.
    pub attainment: f64,
    pub percentile_targets: Vec<PercentileTarget>,
    /// Largest tolerated error rate (`error_rate` of the summary), if set.
    pub error_rate_max: Option<f64>,
}

/// E.g. "P95 TTFT ≤ 800 ms".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PercentileTarget {
    pub metric: LatencyMetric,
    /// In (0, 1], e.g. 0.95.
    pub quantile: f64,
    pub max_ms: f64,
}

/// The latency a percentile target is about; the same type the config validates.
pub use crate::slo::LatencyMetric;

/// Cost of the serving system.
#[derive(Debug, Clone, PartialEq)]
pub struct CostConfig {
    pub currency: String,
    /// Sum of all components, per hour.
    pub per_hour: f64,
    /// `(component, per hour)`, e.g. `("hardware", 9.8)`; reported as configured.
    pub components: Vec<(String, f64)>,
    /// Prices by use (tokens, requests), added to the hours' cost.
    pub usage: crate::config::cost::UsagePrices,
}
