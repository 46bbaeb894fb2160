//! The flags of `goodput replay`. Flag names are a contract with users' scripts:
//! extend, never rename.

use std::{path::PathBuf, time::Duration};

use clap::{ArgAction, Args, ValueEnum};

/// `goodput replay`: run a captured profile against a candidate system and write the
/// acceptance report; or, with `--compare`, put two reports side by side.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Profile file(s) to replay (read together, as `goodput profile summarize` does).
    #[arg(long, value_name = "FILE", num_args = 1.., required_unless_present = "compare")]
    pub profile: Vec<PathBuf>,
    /// Base URL of the candidate system, e.g. http://10.0.0.5:8000 (paths /v1/... are
    /// appended; a URL with a path, e.g. http://h/openai/v1, is used as the API root).
    #[arg(long, value_name = "URL", required_unless_present = "compare")]
    pub target: Option<String>,
    /// goodput config file whose `[slo]` classes and `[cost]` the run is judged by (other
    /// sections are ignored). Without it: the default class only, no cost.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Environment variable holding the API key, sent as `Authorization: Bearer ...`.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// Load pattern.
    #[arg(long, value_enum, default_value_t = Mode::Steps)]
    pub mode: Mode,
    /// trace: arrival times are divided by this (2.0 = twice the recorded rate).
    #[arg(long, value_name = "F", default_value_t = 1.0, value_parser = positive_f64)]
    pub rate_scale: f64,
    /// steps: closed-loop concurrency levels, ascending.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "1,4,8,16,32,64",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Vec<u32>,
    /// steps: run each concurrency level N times in a row; the report gives the mean and
    /// 95% confidence interval of each step number over the repeats (`repeats`).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Measuring duration of each step (steps, ramp) and the drift interval (soak).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub step_duration: Duration,
    /// Load before each step's measurement starts (trace: the first part of the trace).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    pub warmup: Duration,
    /// soak: how long the fixed load runs.
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = duration)]
    pub soak_duration: Duration,
    /// soak: requests per second; default 70% of the knee found by a quick ramp.
    #[arg(long, value_name = "RPS", value_parser = positive_f64)]
    pub soak_rate: Option<f64>,
    /// ramp: first request rate (requests/s).
    #[arg(long, value_name = "RPS", default_value_t = 1.0, value_parser = positive_f64)]
    pub ramp_start: f64,
    /// ramp: each step's rate is the previous one times this.
    #[arg(long, value_name = "F", default_value_t = 1.5, value_parser = above_one)]
    pub ramp_factor: f64,
    /// ramp: most steps before giving up on finding the knee.
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub ramp_steps: u32,
    /// The load the verdict is judged at, in concurrency (steps). Default: the profile's
    /// time-averaged concurrency (Σ e2e / duration) times --rate-scale, rounded up.
    #[arg(long, value_name = "N")]
    pub required_concurrency: Option<u32>,
    /// The load the verdict is judged at, in requests/s (ramp). Default: the profile's
    /// mean arrival rate times --rate-scale.
    #[arg(long, value_name = "RPS", value_parser = positive_f64)]
    pub required_rate: Option<f64>,
    /// Directory the report is written to (created if missing).
    #[arg(long, value_name = "DIR", default_value = "replay-report")]
    pub out: PathBuf,
    /// Stop after sending this many requests (the report covers what ran).
    #[arg(long, value_name = "N")]
    pub max_requests: Option<u64>,
    /// Seed of every random choice (prompt text, drawn lengths, Poisson arrivals).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Send `ignore_eos: true` so outputs run to the recorded length (vLLM, SGLang);
    /// `--ignore-eos=false` for targets that reject the field.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub ignore_eos: bool,
    /// Send every request with this model name instead of the recorded one.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// A HuggingFace tokenizer.json of the target's model: prompts then have exactly the
    /// recorded number of tokens (chat template aside) instead of ~4 bytes per token.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Test-contract metadata of the candidate (model_revision, engine, engine_version,
    /// hardware, precision, notes, or any other key); overrides the profile header's.
    #[arg(long = "contract", value_name = "KEY=VALUE", value_parser = key_value)]
    pub contract: Vec<(String, String)>,
    /// A request with no byte from the target for this long ends as `timeout`.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    pub idle_timeout: Duration,
    /// Open-loop cap on requests in flight; reaching it delays sends (flagged in the report).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_in_flight: u32,
    /// Put reports side by side instead of running: two (A/report.json B/report.json)
    /// compared step by step, three or more as a matrix with P99 rows and scaling
    /// efficiency.
    #[arg(long, num_args = 2.., value_name = "REPORT", conflicts_with_all = ["profile", "target"])]
    pub compare: Option<Vec<PathBuf>>,
    /// Quality probes: JSON Lines of requests with an expected answer (`contains`,
    /// `regex` or `json_schema`), mixed into the load (docs/REPLAY.md: Quality probes).
    #[arg(long, value_name = "FILE")]
    pub probes: Option<PathBuf>,
    /// Share of the requests that are probes (every round(1/F)-th request).
    #[arg(long, value_name = "F", default_value_t = 0.05, value_parser = share)]
    pub probe_share: f64,
    /// Replace shares of the requests with abnormal ones: over_long (past
    /// --context-tokens), empty (no messages), malformed (not JSON), e.g.
    /// `over_long=0.02,empty=0.01,malformed=0.01`.
    #[arg(long, value_name = "KIND=SHARE,...", value_delimiter = ',',
          value_parser = super::inject::parse_share)]
    pub inject: Vec<(super::inject::Kind, f64)>,
    /// The target's context limit in tokens (for `--inject over_long`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub context_tokens: Option<u64>,
    /// An extra open-loop load of RATE requests/s for DURATION in the middle of each
    /// step's measuring window, e.g. `50:5s`.
    #[arg(long, value_name = "RATE:DURATION", value_parser = super::inject::parse_burst)]
    pub burst: Option<(f64, Duration)>,
    /// Run `--fault-cmd` this long after the run started (while the load keeps going) and
    /// report the recovery.
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = "fault_cmd")]
    pub fault_at: Option<Duration>,
    /// The fault: a shell command (`sh -c`) that restarts a replica, kills a process, ...;
    /// its output goes to `fault-cmd.log` in the report directory.
    #[arg(long, value_name = "CMD", requires = "fault_at")]
    pub fault_cmd: Option<String>,
    /// The fault must be recovered from (attainment back at target) within this long.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    pub recovery_deadline: Duration,
    /// `--compare` runs measured differently (profile, load and its parameters, durations,
    /// warm-up, repeats, ignore_eos, prompt sizing, probes, SLO and gate thresholds; for
    /// two runs also task, model, revision, precision) instead of refusing.
    #[arg(long, requires = "compare")]
    pub allow_different: bool,
    /// `--compare A B`: fail the comparison (exit 1) when B's probe pass rate is more
    /// than POINTS percentage points below A's, naming the probes that flipped.
    #[arg(long, value_name = "POINTS", requires = "compare", value_parser = points)]
    pub quality_max_drop: Option<f64>,
    /// The target engine's Prometheus metrics (vLLM or SGLang names) scraped during the
    /// run for the report's `attribution`; default: `[calibration] url` of --config, else
    /// the target's origin + `/metrics`.
    #[arg(long, value_name = "URL", conflicts_with = "no_engine_metrics")]
    pub engine_metrics: Option<String>,
    /// How often the engine's metrics are scraped.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = nonzero_duration)]
    pub engine_metrics_interval: Duration,
    /// Do not scrape the engine's metrics (no `attribution` in the report).
    #[arg(long)]
    pub no_engine_metrics: bool,
    /// soak: fail when the engine's KV-cache usage (share, 0..1) grows by more than this
    /// from the first to the last quarter of the soak.
    #[arg(long, value_name = "F", default_value_t = 0.10, value_parser = non_negative_f64)]
    pub soak_max_kv_growth: f64,
    /// soak: fail when the mean of the engine's waiting requests grows by more than this.
    #[arg(long, value_name = "N", default_value_t = 5.0, value_parser = non_negative_f64)]
    pub soak_max_waiting_growth: f64,
    /// soak: fail when the batch jitter (coefficient of variation of the engine's running
    /// requests) grows by more than this.
    #[arg(long, value_name = "F", default_value_t = 0.25, value_parser = non_negative_f64)]
    pub soak_max_jitter_growth: f64,
    /// The `quality` gate: the probes' pass rate must reach this (0..1; default 1.0
    /// whenever --probes is given). Failed probes are never effective output.
    #[arg(long, value_name = "F", value_parser = unit_interval, requires = "probes")]
    pub quality_min: Option<f64>,
    /// The `abnormal_input` gate: the normal requests' attainment while an injected
    /// request is in flight may be at most this many points below their attainment
    /// without.
    #[arg(long, value_name = "POINTS", default_value_t = 5.0, value_parser = non_negative_f64)]
    pub isolation_max_drop: f64,
    /// A shell command (`sh -c`) describing the candidate, e.g. `nvidia-smi -q` or
    /// `kubectl get deploy -o yaml`, run before the load; its output is kept as
    /// describe.txt in the report directory and its digest in `reproducibility`.
    #[arg(long, value_name = "CMD")]
    pub describe_cmd: Option<String>,
    /// An NVIDIA dcgm-exporter's metrics URL (repeatable, one per node), scraped every
    /// second for the GPUs' utilization, memory, power, temperature, SM clock and XID
    /// errors (`resources`, `steps[].resources`).
    #[arg(long = "gpu-metrics", value_name = "URL")]
    pub gpu_metrics: Vec<String>,
    /// The `resources` gate: a GPU whose clock throttle reasons (dcgm-exporter's
    /// `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`, idle and application-clock settings aside)
    /// are set in more than this share of its samples fails it.
    #[arg(long, value_name = "F", default_value_t = 0.05, value_parser = unit_interval)]
    pub max_throttle_share: f64,
    /// The `resources` gate: the engine's preemptions (vLLM) over the run may be at most
    /// this many. Default: none while the `slo` gate fails, any while it holds.
    #[arg(long, value_name = "N", value_parser = non_negative_f64)]
    pub max_preemptions: Option<f64>,
    /// A Prometheus node_exporter's metrics URL on a host the engine runs on
    /// (repeatable), scraped every second for memory available and CPU busy
    /// (`steps[].resources.host`, `resources.host`).
    #[arg(long = "node-metrics", value_name = "URL")]
    pub node_metrics: Vec<String>,
    /// The `resources` gate: a host's memory available (share of its total) falling
    /// below this fails it.
    #[arg(long, value_name = "F", default_value_t = 0.05, value_parser = unit_interval)]
    pub host_memory_min_share: f64,
    /// Accept this gate unjudged (its inputs missing) instead of failing the run; the
    /// report and the comparison say so. Repeatable: slo, quality, recovery,
    /// abnormal_input, resources.
    #[arg(long = "allow-unjudged", value_name = "GATE", value_enum)]
    pub allow_unjudged: Vec<super::gates::GateName>,
    /// No live progress display, even on a terminal.
    #[arg(long)]
    pub quiet: bool,
    /// The command line as typed, for `reproducibility.command` (set by `goodput
    /// replay`; when empty, the process's arguments are used).
    #[arg(skip)]
    pub command_line: Vec<String>,
}

impl ReplayArgs {
    /// The gates' limits from the flags.
    pub fn thresholds(&self) -> super::gates::Thresholds {
        super::gates::Thresholds {
            quality_min: self.quality_min().unwrap_or(1.0),
            isolation_max_drop: self.isolation_max_drop,
            max_throttle_share: self.max_throttle_share,
            max_preemptions: self.max_preemptions,
            host_memory_min_share: self.host_memory_min_share,
            allow_unjudged: self.allow_unjudged.clone(),
        }
    }

    /// The `quality` gate's minimum pass rate (`None` without probes).
    pub fn quality_min(&self) -> Option<f64> {
        self.probes
            .as_ref()
            .map(|_| self.quality_min.unwrap_or(1.0))
    }
}

/// Load patterns.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Open loop at the profile's own arrival times (scaled by --rate-scale).
    Trace,
    /// Closed loop per concurrency level, warm-up then a fixed measuring duration.
    Steps,
    /// Rising open-loop request rate until SLO attainment breaks: finds the knee.
    Ramp,
    /// A fixed load for a long time, reporting drift.
    Soak,
    /// The deployment's limits: the largest input and output it takes, probed one
    /// request at a time, then the steps for its concurrency ceiling at the SLO.
    Limits,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Trace => "trace",
            Mode::Steps => "steps",
            Mode::Ramp => "ramp",
            Mode::Soak => "soak",
            Mode::Limits => "limits",
        }
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 10s or 2m: {e}"))
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("{s:?} is not a share in (0, 1]")),
    }
}

fn points(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of percentage points from 0 to 100"
        )),
    }
}

fn unit_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a share from 0 to 1")),
    }
}

fn non_negative_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of zero or more")),
    }
}

fn nonzero_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

fn above_one(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 1.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number above 1")),
    }
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    #[test]
    fn contract_flags_parse() {
        let cli = Cli::try_parse_from([
            "replay",
            "--profile",
            "p.jsonl",
            "--target",
            "http://h:1",
            "--mode",
            "steps",
            "--concurrency",
            "1,4",
            "--step-duration",
            "10s",
            "--out",
            "DIR",
            "--contract",
            "hardware=8xH100",
            "--ignore-eos=false",
        ])
        .unwrap();
        let a = cli.args;
        assert_eq!(a.concurrency, [1, 4]);
        assert_eq!(a.step_duration, Duration::from_secs(10));
        assert_eq!(a.contract, [("hardware".to_owned(), "8xH100".to_owned())]);
        assert!(!a.ignore_eos);
        assert_eq!(a.mode, Mode::Steps);
        assert_eq!(a.fault_at, None);
        assert_eq!(a.recovery_deadline, Duration::from_secs(60));
    }

    #[test]
    fn a_fault_needs_its_time_and_its_command() {
        let base = ["replay", "--profile", "p", "--target", "http://h:1"];
        let with = |extra: &[&str]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            Cli::try_parse_from(all)
        };
        let a = with(&[
            "--fault-at",
            "30s",
            "--fault-cmd",
            "systemctl restart vllm",
            "--recovery-deadline",
            "2m",
        ])
        .unwrap()
        .args;
        assert_eq!(a.fault_at, Some(Duration::from_secs(30)));
        assert_eq!(a.fault_cmd.as_deref(), Some("systemctl restart vllm"));
        assert_eq!(a.recovery_deadline, Duration::from_secs(120));
        assert!(with(&["--fault-at", "30s"]).is_err());
        assert!(with(&["--fault-cmd", "true"]).is_err());
        assert!(with(&["--fault-at", "soon", "--fault-cmd", "true"]).is_err());
    }

    #[test]
    fn probe_share_is_a_share() {
        let base = ["replay", "--profile", "p", "--target", "http://h:1"];
        let with = |extra: &[&str]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            Cli::try_parse_from(all)
        };
        let a = with(&["--probes", "q.jsonl"]).unwrap().args;
        assert_eq!(a.probe_share, 0.05);
        assert_eq!(a.probes.as_deref(), Some(std::path::Path::new("q.jsonl")));
        assert_eq!(with(&["--probe-share", "1"]).unwrap().args.probe_share, 1.0);
        for bad in ["0", "1.5", "-0.1", "x"] {
            assert!(with(&["--probe-share", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn compare_needs_no_profile() {
        let cli = Cli::try_parse_from(["replay", "--compare", "a.json", "b.json"]).unwrap();
        assert_eq!(cli.args.compare.unwrap().len(), 2);
        assert!(cli.args.ignore_eos);
        assert!(Cli::try_parse_from(["replay", "--target", "http://x"]).is_err());
        assert!(Cli::try_parse_from(["replay", "--compare", "a", "b", "--target", "x"]).is_err());
    }
}
