//! `report.json`: the acceptance record, machine-readable. Field names are a contract
//! with users' tooling: `contract`, `steps` (each with `concurrency` or `rate`,
//! `requests`, `errors`, `attainment`, `effective_goodput_tokens_per_s`, and
//! `ttft_ms`/`tpot_ms`/`itl_ms`/`e2e_ms` with `p50`, `p90`, `p95`, `p99`, `max`), `knee`,
//! and `verdict` (class → `pass`/`fail`). Extend, never rename.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::replay::tally::{Pcts, Spread, Stats, TargetCheck, TimePoint};
use crate::stats::engine::Capacity;

/// Bumped when a field changes meaning.
pub const REPORT_FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub report_format: u32,
    pub goodput_version: String,
    pub generated_at: String,
    /// The test contract: what was tested, with what, how.
    pub contract: Contract,
    /// Stopped early by Ctrl-C: the report covers what ran.
    pub interrupted: bool,
    /// Every gate passed (`gates`).
    pub passed: bool,
    /// Per SLO class: `pass` or `fail`.
    pub verdict: BTreeMap<String, &'static str>,
    /// The numbers behind each verdict.
    pub verdicts: Vec<Verdict>,
    /// The run passes only when every gate passes: `slo`, `quality`, `recovery`,
    /// `abnormal_input`, `resources`, each with `pass`, `target` and `actual`.
    pub gates: crate::replay::gates::Gates,
    /// The highest concurrency whose SLO attainment held (pooled classes; the engine's
    /// definition), as the step's concurrency.
    pub max_stable_concurrency: Option<u32>,
    pub knee: Knee,
    /// Effective goodput at the operating point (see `operating_point`).
    pub effective_goodput_tokens_per_s: Option<f64>,
    /// Where the headline goodput and cost are taken: the max stable step (steps,
    /// ramp) or the whole measured run (trace, soak).
    pub operating_point: Option<String>,
    pub cost: Option<CostOut>,
    /// `--mode limits`: the largest input and output the target takes, and its
    /// concurrency ceiling at the SLO (the steps' max stable concurrency).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::replay::limits::LimitsOut>,
    pub generator: Generator,
    pub steps: Vec<StepOut>,
    /// Every measured request of the run together.
    pub overall: Stats,
    /// The measured requests of each model (as sent; `unknown` without one), over the
    /// whole measuring time.
    pub by_model: BTreeMap<String, Stats>,
    /// The capacity curve as the proxy's engine computes it, pooled and per class.
    pub capacity: Option<Capacity>,
    pub capacity_by_class: Vec<Capacity>,
    /// Every finished request (warm-up and cancelled ones included) by finish time.
    pub timeline: Vec<TimePoint>,
    pub drift: Option<Drift>,
    /// `--fault-cmd`: what the fault cost and how long the target took to come back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<crate::replay::recovery::Recovery>,
    /// `--probes`: pass rate of the quality probes over every measured request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::replay::probes::Quality>,
    /// `--inject`, `--burst`: how the target answered abnormal requests and bursts, and
    /// the normal requests' latency beside them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injection: Option<crate::replay::inject::Injection>,
    /// `--repeat N` (steps): per concurrency level, mean and 95% CI over the repeats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeats: Option<Vec<crate::replay::repeats::Repeat>>,
    /// The target engine's time (queue, prefill, decode, outside the engine) and load
    /// (KV cache, waiting, running, preemptions) per step and overall, from its metrics;
    /// absent with `--no-engine-metrics`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<crate::replay::attribution::AttributionOut>,
    /// `--gpu-metrics`: the GPUs over every step's window, and a soak's GPU check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::replay::gpu::ResourcesOut>,
    /// The command line, goodput's version, the files' digests and what the target said
    /// about itself: what it takes to run the same test again.
    pub reproducibility: crate::replay::describe::Reproducibility,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Contract {
    pub target: String,
    /// The model most requests were sent as.
    pub model: Option<String>,
    /// Requests per model name sent.
    pub models: BTreeMap<String, u64>,
    pub model_revision: Option<String>,
    pub engine: Option<String>,
    pub engine_version: Option<String>,
    pub hardware: Option<String>,
    pub precision: Option<String>,
    pub notes: Option<String>,
    /// The named fields of an acceptance contract, from `--contract KEY=VALUE`:
    /// parameter count, `dense`/`moe`, the business task, batching, prefix and KV cache,
    /// speculative decoding, topology (cards, nodes, interconnect), versions.
    pub parameters: Option<String>,
    pub architecture: Option<String>,
    pub task: Option<String>,
    pub batching: Option<String>,
    pub prefix_cache: Option<String>,
    pub kv_cache: Option<String>,
    pub speculative_decoding: Option<String>,
    pub cards: Option<String>,
    pub nodes: Option<String>,
    pub interconnect: Option<String>,
    pub driver_version: Option<String>,
    pub framework_version: Option<String>,
    pub container_image: Option<String>,
    /// `--contract run_id=...`, else made up from the start time and a random suffix.
    pub run_id: String,
    /// Other `--contract` keys.
    pub extra: BTreeMap<String, String>,
    /// Where each of the fields above came from: `flag` or `profile`.
    pub sources: BTreeMap<String, &'static str>,
    pub profile: ProfileId,
    pub load: LoadOut,
    pub started_at: String,
    pub duration_s: f64,
    pub goodput_version: String,
    pub slo: Vec<ClassTargets>,
    /// The gates' thresholds (`gates` judges by them).
    pub gates: GateThresholds,
    pub cost: Option<CostConfigOut>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateThresholds {
    /// `--quality-min` (`null` without probes).
    pub quality_min: Option<f64>,
    pub isolation_max_drop_points: f64,
    /// `--recovery-deadline` (`null` without a fault).
    pub recovery_deadline_s: Option<f64>,
    pub soak_max_kv_growth: f64,
    pub soak_max_waiting_growth: f64,
    pub soak_max_jitter_growth: f64,
    /// `--max-throttle-share`.
    pub max_throttle_share: f64,
    /// `--max-preemptions` (`null`: none while the SLO gate fails).
    pub max_preemptions: Option<f64>,
    /// `--host-memory-min-share`.
    pub host_memory_min_share: f64,
    /// `--allow-unjudged`, sorted.
    pub allow_unjudged: Vec<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileId {
    pub files: Vec<String>,
    /// Shared by every file (`null` when they differ).
    pub salt_id: Option<String>,
    /// BLAKE3 of the files' bytes in order, 32 hex digits.
    pub hash: String,
    pub requests: usize,
    /// The contract the profile's traffic was recorded under (production).
    pub recorded_contract: crate::profile::Contract,
    /// Its distributions, as `goodput profile summarize --json` gives them.
    pub summary: crate::profile::Summary,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadOut {
    pub mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rates: Option<Vec<f64>>,
    pub rate_scale: f64,
    pub step_duration_s: f64,
    pub warmup_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak_duration_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak_rate: Option<f64>,
    pub required_concurrency: Option<u32>,
    pub required_rate: Option<f64>,
    pub max_requests: Option<u64>,
    pub max_in_flight: u32,
    /// `--repeat`: runs of each concurrency level (steps).
    pub repeat: u32,
    pub seed: u64,
    pub ignore_eos: bool,
    pub idle_timeout_s: f64,
    /// How prompt lengths were reproduced.
    pub prompt_lengths: String,
    /// Text bytes of one profile block.
    pub block_bytes: usize,
    /// `--ramp-start`, `--ramp-factor`, `--ramp-steps` (ramp), as asked: `rates` are the
    /// steps that ran.
    pub ramp: Option<RampOut>,
    /// `flag` (`--soak-rate`) or `knee` (70% of a quick ramp's knee); `null` but in a soak.
    pub soak_rate_source: Option<&'static str>,
    /// `--burst`: the extra open-loop load in each step's window.
    pub burst: Option<BurstOut>,
    /// `--inject`: each abnormal kind's share of the requests (`{}` without).
    pub inject: BTreeMap<&'static str, f64>,
    /// `--context-tokens`.
    pub context_tokens: Option<u64>,
    /// `--fault-cmd`, credentials redacted.
    pub fault_cmd: Option<String>,
    /// `--fault-at`.
    pub fault_at_s: Option<f64>,
    /// `--probes`, as given (its content is `reproducibility.probes_sha256`).
    pub probes: Option<String>,
    /// `--probe-share` (`null` without probes).
    pub probe_share: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RampOut {
    pub start: f64,
    pub factor: f64,
    pub steps: u32,
}

/// `--burst RATE:DURATION`.
#[derive(Debug, Clone, Serialize)]
pub struct BurstOut {
    pub rate: f64,
    pub duration_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassTargets {
    pub name: String,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    pub attainment: f64,
    pub percentiles: Vec<PercentileOut>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PercentileOut {
    pub metric: &'static str,
    pub quantile: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CostConfigOut {
    pub currency: String,
    pub per_hour: f64,
    pub components: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepOut {
    pub index: usize,
    pub label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    pub started_s: f64,
    pub warmup_s: f64,
    /// The measuring window the rates divide by.
    pub duration_s: f64,
    pub cut_short: bool,
    /// Finish reasons reported by the target (`stop`, `length`, ...).
    pub finish_reasons: BTreeMap<&'static str, u64>,
    /// Why requests missed their SLO (`ttft`, `tpot`, `e2e`, `error`, ...), counted.
    pub miss_reasons: BTreeMap<&'static str, u64>,
    /// `length` among them: a high share means answers were truncated.
    pub length_share: Option<f64>,
    /// `--probes`: the step's quality probes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::replay::probes::Quality>,
    #[serde(flatten)]
    pub stats: Stats,
    pub spread: Spread,
    /// `--gpu-metrics`: the GPUs over the step's measuring window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::replay::gpu::GpuFigures>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub class: String,
    pub verdict: &'static str,
    /// Step label, or `run` for the whole measured run.
    pub judged_at: String,
    pub requests: u64,
    pub attainment: Option<f64>,
    pub attainment_target: f64,
    pub percentile_targets: Vec<TargetCheck>,
    pub max_stable_concurrency: Option<u32>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Knee {
    /// The concurrency beyond which throughput stops growing (steps: a step's level).
    pub concurrency: Option<u32>,
    /// ramp: the highest rate whose attainment held.
    pub rate: Option<f64>,
    pub throughput_tokens_per_s: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub rule: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Generator {
    pub requests_sent: u64,
    /// Scheduled-to-sent delay of open-loop sends (trace, ramp, soak).
    pub schedule_lag_ms: Option<Pcts>,
    pub lag_p99_limit_ms: f64,
    /// The in-flight cap delayed sends.
    pub saturated: bool,
    /// Lag P99 within the limit and never saturated.
    pub kept_up: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CostOut {
    pub currency: String,
    /// Every component together (`[cost]`: per-hour lines, amortized one-time costs,
    /// energy, the idle and failure uplift).
    pub per_hour: f64,
    pub components: BTreeMap<String, f64>,
    /// `--gpu-metrics` with `[cost] energy_price_per_kwh`: the accelerators' mean power
    /// over the run, which the `energy` component prices instead of a configured `kw`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_power_kw: Option<f64>,
    /// `[cost] one_time` item by item, as configured (`components.one_time` is their
    /// amortized sum per hour).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub one_time: BTreeMap<String, f64>,
    /// The usage prices, when any is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::config::cost::UsagePrices>,
    /// What the operating point's traffic costs per hour at the usage prices (input
    /// tokens, all priced as uncached: the replay does not split cached ones), included
    /// in every unit cost below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_per_hour: Option<f64>,
    pub cost_per_million_effective_tokens: Option<f64>,
    pub cost_per_million_raw_tokens: Option<f64>,
    /// Per request finished at the operating point, and per request that met its SLO.
    pub cost_per_request: Option<f64>,
    pub cost_per_effective_request: Option<f64>,
    /// Output tokens of SLO-missing requests over all output tokens: spend that bought
    /// nothing.
    pub wasted_share: Option<f64>,
    pub cost_per_stable_user_per_month: Option<f64>,
}

/// soak: first against last interval.
#[derive(Debug, Clone, Serialize)]
pub struct Drift {
    pub interval_s: f64,
    pub intervals: usize,
    pub raw_throughput_change: Option<f64>,
    pub effective_goodput_change: Option<f64>,
    pub ttft_p95_change: Option<f64>,
    pub e2e_p95_change: Option<f64>,
    pub error_rate_first: Option<f64>,
    pub error_rate_last: Option<f64>,
    /// P99 TTFT and ITL jitter across the intervals: coefficient of variation of each
    /// interval's P99, as the live summary's `p99_ttft_jitter`.
    pub p99_ttft_jitter: Option<f64>,
    pub p99_itl_jitter: Option<f64>,
}

/// Writes `report.json` (pretty, newline-terminated).
pub fn write(report: &Report, dir: &std::path::Path) -> std::io::Result<()> {
    let mut text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(dir.join("report.json"), text)
}

/// One line of `requests.jsonl`: the client-side record of one request, in the format of
/// the proxy's `/api/v1/requests`, with where it fell in the run.
#[derive(Serialize)]
struct RequestLine<'a> {
    step: usize,
    measured: bool,
    sent_s: f64,
    lag_ms: Option<f64>,
    /// `over_long`, `empty`, `malformed` or `burst` for extra requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    inject: Option<&'static str>,
    /// The probe's name (`--probes`) for probe requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    probe: Option<&'a str>,
    #[serde(flatten)]
    record: &'a crate::measure::RequestRecord,
}

/// The line of `requests.jsonl` for one finished request (newline-terminated): the
/// sample's step and timing beside its whole `record` (the sample keeps only part of it).
/// `probe` names the probe a probe request sent.
pub fn request_line(
    s: &crate::replay::tally::Sample,
    record: &crate::measure::RequestRecord,
    probe: Option<&str>,
) -> Vec<u8> {
    let line = RequestLine {
        step: s.step,
        measured: s.measured,
        sent_s: s.sent_s,
        lag_ms: s.lag_ms(),
        inject: s.inject.map(crate::replay::inject::Kind::as_str),
        probe,
        record,
    };
    // A record of plain fields and string keys always serializes.
    let mut v = serde_json::to_vec(&line).unwrap_or_default();
    v.push(b'\n');
    v
}
