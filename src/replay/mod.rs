//! `goodput replay`: runs a captured profile against a candidate system and writes the
//! acceptance report; `--compare` puts two reports side by side.
//!
//! Requests reproduce the profile (lengths, prefix blocks, model/API mix, stream flag;
//! [`prompt`]), are sent by a load pattern (`session`, `load`), and are measured on
//! the client side with the proxy's own code (the decoders, [`crate::measure::Timeline`]
//! and [`crate::measure::finish`]), judged against the `[slo]` classes of `--config` with
//! [`crate::measure::verdict::judge`], and summed into steps, a knee (the proxy's windowed
//! engine) and a verdict per class ([`report`]).
//!
//! Exit codes: 0 every gate passed ([`gates`]: SLO, quality, recovery, abnormal input,
//! resources), 1 a gate failed, 2 the run could not be made or
//! judged (bad flags or files, unwritable output, nothing measured).
//!
//! # Layout
//! - [`cli`]: the flags ([`ReplayArgs`]).
//! - [`plan`]: profile requests as templates; seeded draws and Poisson schedules.
//! - [`prompt`]: request bodies: block text per `hash_ids`, lengths, `max_tokens`.
//! - `client`: the pooled hyper client and client-side measurement.
//! - `load`: one step of load (closed loop, open loop, trace) and the stop signals.
//! - `session`: the load patterns as sequences of steps.
//! - `running`: the load with its watchers (exporters, fault command, the target's identity
//!   at step boundaries), the reproducibility record read before it.
//! - `limits`: `--mode limits`' probes: the largest input and output the target takes.
//! - `log`: `requests.jsonl`, written by a thread of its own as requests finish.
//! - [`gates`]: the run's gates (SLO, quality, recovery, abnormal input, resources).
//! - [`describe`]: `reproducibility`: command line, digests, what the target says.
//! - [`gpu`]: `--gpu-metrics`: dcgm-exporter scraped every second, figures per window.
//! - [`host`]: `--node-metrics`: node_exporter on the engine's hosts, figures per window.
//! - [`attribution`]: the target engine's metrics scraped during the run: where time
//!   went and what the engine held, per step; a soak's resource drift.
//! - [`tally`]: per-step numbers: attainment, goodput, percentiles, spread, timeline;
//!   the fixed-size sample kept per finished request.
//! - [`tables`]: what samples point into: the run's interned names and the ITL histograms
//!   of measured requests per step (or soak interval), class and model.
//! - [`inject`]: `--inject` abnormal requests and `--burst`, and their report.
//! - [`probes`]: `--probes`, quality probes mixed into the load and their checks.
//! - `progress`: the live terminal line.
//! - [`repeats`]: `--repeat`, mean and 95% confidence interval per level.
//! - [`recovery`]: `--fault-cmd` run during the load, and the recovery analysis.
//! - [`report`]: report.json / report.md / report.html and the verdicts.
//! - `verdicts`: the verdict table every comparison opens with (each run's gates).
//! - `conditions`: like with like: the fields two runs must share to compare.
//! - `flips`: quality against a reference: per-probe flips and the pass-rate difference.
//! - `compare`: `--compare A B`.
//! - `matrix`: `--compare A B C …`, the matrix with scaling efficiency.

pub mod attribution;
pub mod cli;
mod client;
mod compare;
mod conditions;
pub mod describe;
mod flips;
pub mod gates;
pub mod gpu;
pub mod host;
pub mod inject;
mod limits;
mod load;
mod log;
mod matrix;
pub mod plan;
pub mod probes;
mod progress;
pub mod prompt;
pub mod recovery;
pub mod repeats;
pub mod report;
mod running;
mod session;
pub mod tables;
pub mod tally;
mod verdicts;

use std::{future::Future, io::Write as _, path::PathBuf, process::ExitCode, sync::Arc};

pub use cli::{Mode, ReplayArgs};
pub use compare::{CompareError, CompareOptions, Compared};
pub use load::AbortHandle;
pub use report::json::Report;

use crate::{
    config::{self, Config, ConfigError, Overrides},
    profile::{Profile, ReadError},
    tokenize::{Tokenizer, TokenizerError},
};
use client::{Client, Target, TargetError};
use load::{Runner, Setup};
use plan::{PlanError, Workload};
use progress::Progress;
use prompt::Prompts;
use running::{Ran, find_limits_of, reproducibility, run_load};

pub const EXIT_PASS: u8 = 0;
pub const EXIT_FAIL: u8 = 1;
pub const EXIT_ERROR: u8 = 2;

/// Why a replay could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Profile(#[from] ReadError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("--config: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("--tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("cannot write the report to `{dir}`: {source}")]
    Write {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Compare(#[from] CompareError),
    #[error(transparent)]
    Probes(#[from] probes::ProbeError),
    #[error(transparent)]
    Inject(#[from] inject::InjectError),
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("--engine-metrics `{url}` is not an http(s) URL with a host")]
    EngineMetrics { url: String },
    #[error("--gpu-metrics `{url}` is not an http(s) URL with a host")]
    GpuMetrics { url: String },
    #[error("cannot read `{path}` for its digest: {source}")]
    Digest {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A finished replay: its report and where it was written.
#[derive(Debug)]
pub struct Finished {
    pub report: Report,
    pub dir: PathBuf,
}

impl Finished {
    /// The terminal's last line, which always agrees with [`Finished::exit_code`]:
    /// `PASSED`, `FAILED: ` and the failed gates in brief, or `NOT JUDGED: ...`.
    pub fn verdict_line(&self) -> String {
        if self.report.verdicts.is_empty() {
            return "NOT JUDGED: no measured request, nothing to judge the run by".to_owned();
        }
        let line = self.report.gates.verdict_line();
        // `passed` also needs a class verdict, so the line follows it, not the gates alone.
        match (self.report.passed, line.starts_with("PASSED")) {
            (true, true) | (false, false) => line,
            (true, false) => "PASSED".to_owned(),
            (false, true) => "FAILED: no SLO class was judged".to_owned(),
        }
    }

    /// 0 when every gate passed, 1 when one failed, 2 when nothing could be judged.
    pub fn exit_code(&self) -> u8 {
        match (self.report.verdicts.is_empty(), self.report.passed) {
            (true, _) => EXIT_ERROR,
            (false, true) => EXIT_PASS,
            (false, false) => EXIT_FAIL,
        }
    }
}

/// The `[slo]` and `[cost]` of `--config` (the target stands in for `[upstream]`).
fn load_config(args: &ReplayArgs, target: &str) -> Result<Config, ConfigError> {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(target.into()),
        admin: Some("127.0.0.1:0".into()),
    };
    config::load(args.config.as_deref(), &overrides)
}

/// The scraper of the target engine's metrics: `--engine-metrics`, else `[calibration]
/// url` (which defaults to the target's origin + `/metrics`); `None` when turned off.
fn engine_watch(
    args: &ReplayArgs,
    config: &Config,
) -> Result<Option<crate::calibrate::Scraper>, ReplayError> {
    if args.no_engine_metrics {
        return Ok(None);
    }
    let c = &config.calibration;
    let url = match &args.engine_metrics {
        Some(u) => {
            let bad = || ReplayError::EngineMetrics { url: u.clone() };
            let uri: http::Uri = u.parse().map_err(|_| bad())?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(bad());
            }
            uri
        }
        None => c.url.clone(),
    };
    Ok(Some(crate::calibrate::Scraper::new(
        url,
        c.timeout,
        c.engine,
        &config.upstream.tls,
    )))
}

/// BLAKE3 of the profile files' bytes, in order (32 hex digits).
fn profile_hash(paths: &[PathBuf]) -> Result<String, ReadError> {
    let mut h = blake3::Hasher::new();
    for p in paths {
        let bytes = std::fs::read(p).map_err(|source| ReadError::Io {
            path: p.display().to_string(),
            source,
        })?;
        h.update(&bytes);
    }
    Ok(h.finalize().to_hex()[..32].to_owned())
}

/// Everything read and checked before the first request: a bad flag or file stops the
/// run here, before any load.
struct Prepared {
    target_url: String,
    profile: Profile,
    hash: String,
    workload: Arc<Workload>,
    config: Config,
    scraper: Option<crate::calibrate::Scraper>,
    target: Target,
    tokenizer: Option<Tokenizer>,
    probes: Option<Arc<probes::Probes>>,
    injector: Option<inject::Injector>,
    /// Values never to be written anywhere (the API key).
    secrets: Vec<String>,
}

impl Prepared {
    fn read(args: &ReplayArgs) -> Result<Prepared, ReplayError> {
        let target_url = args
            .target
            .clone()
            .ok_or(ReplayError::Missing("--target"))?;
        let profile = Profile::read(&args.profile)?;
        let hash = profile_hash(&args.profile)?;
        let workload = Arc::new(Workload::from_profile(&profile, args.model.as_deref())?);
        let config = load_config(args, &target_url)?;
        let scraper = engine_watch(args, &config)?;
        for url in &args.gpu_metrics {
            let uri: Option<http::Uri> = url.parse().ok();
            if !uri.is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            }) {
                return Err(ReplayError::GpuMetrics { url: url.clone() });
            }
        }
        let target = Target::new(&target_url, args.api_key_env.as_deref())?;
        let tokenizer = args.tokenizer.as_deref().map(Tokenizer::load).transpose()?;
        let probe_model = args
            .model
            .clone()
            .or_else(|| workload.templates.first().and_then(|t| t.model.clone()));
        let probes = match &args.probes {
            Some(path) => Some(Arc::new(probes::Probes::load(
                path,
                probe_model.as_deref(),
                args.probe_share,
            )?)),
            None => None,
        };
        let injector = if args.inject.is_empty() {
            None
        } else {
            Some(inject::Injector::new(
                &args.inject,
                args.context_tokens,
                probe_model.as_deref(),
                args.seed,
                workload.block_bytes,
            )?)
        };
        let secrets = args
            .api_key_env
            .as_deref()
            .and_then(|v| std::env::var(v).ok())
            .into_iter()
            .collect();
        Ok(Prepared {
            target_url,
            profile,
            hash,
            workload,
            config,
            scraper,
            target,
            tokenizer,
            probes,
            injector,
            secrets,
        })
    }

    /// How prompt lengths are reproduced, for the contract.
    fn prompt_lengths(&self) -> String {
        match &self.tokenizer {
            Some(t) => format!("exact input token counts with the tokenizer {}", t.path()),
            None => "about 4 bytes of text per recorded input token (no tokenizer)".to_owned(),
        }
    }

    /// The runner of the load, its request log in `args.out` (created).
    fn runner(&mut self, args: &ReplayArgs) -> Result<Runner, ReplayError> {
        std::fs::create_dir_all(&args.out).map_err(|e| write_error(args, e))?;
        let log = log::RequestLog::create(&args.out).map_err(|e| write_error(args, e))?;
        let pool = args.concurrency.iter().copied().max().unwrap_or(1).max(64) as usize;
        let w = &self.workload;
        Ok(Runner::new(Setup {
            client: Client::new(self.target.clone(), pool, args.idle_timeout)
                .with_tenant_header(self.config.slo.tenant_header.clone()),
            workload: w.clone(),
            prompts: Prompts::new(
                args.seed,
                w.block_bytes,
                args.ignore_eos,
                self.tokenizer.clone(),
            ),
            slo: Arc::new(self.config.slo.clone()),
            seed: args.seed,
            progress: Progress::new(args.quiet),
            max_requests: args.max_requests,
            max_in_flight: args.max_in_flight.max(1),
            probes: self.probes.clone(),
            injector: self.injector.take(),
            burst: args.burst,
            log: Some(log),
        }))
    }
}

fn write_error(args: &ReplayArgs, source: std::io::Error) -> ReplayError {
    ReplayError::Write {
        dir: args.out.display().to_string(),
        source,
    }
}

/// Runs the replay `args` describe until done or `shutdown` resolves (then in-flight
/// requests are cancelled and the report covers what ran), and writes the report.
pub async fn execute(
    args: &ReplayArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Finished, ReplayError> {
    // Limits run as steps once their probes are done: everything after the probes reads
    // the run as steps.
    let steps_args;
    let (args, find_limits) = if args.mode == Mode::Limits {
        let mut a = args.clone();
        a.mode = Mode::Steps;
        steps_args = a;
        (&steps_args, true)
    } else {
        (args, false)
    };
    let mut p = Prepared::read(args)?;
    std::fs::create_dir_all(&args.out).map_err(|e| write_error(args, e))?;
    let fetcher = crate::fetch::Fetcher::new(describe::FETCH_TIMEOUT, p.target.auth());
    // Before the runner's clock starts: `--fault-at` counts from the first request.
    let reproducibility = reproducibility(args, &p, &fetcher).await?;
    let limits = if find_limits {
        Some(find_limits_of(args, &p).await)
    } else {
        None
    };
    let runner = p.runner(args)?;
    let mut ran = run_load(&runner, args, &p, &fetcher, shutdown).await;
    // Read again after the load: a target swapped meanwhile fails the run.
    let mut reproducibility = reproducibility;
    reproducibility.note_during(std::mem::take(&mut ran.identities));
    reproducibility.target_at_end =
        Some(describe::ask_target(&fetcher, &p.target.models_url(), &p.target.origin()).await);
    let report = judge(args, &p, &runner, ran, reproducibility, limits);
    runner
        .close_log()
        .and_then(|()| report::write(&report, &args.out))
        .map_err(|e| write_error(args, e))?;
    Ok(Finished {
        report,
        dir: args.out.clone(),
    })
}

/// The report of what ran: the recovery analysed, the load the verdict is judged at, and
/// everything measured.
fn judge(
    args: &ReplayArgs,
    p: &Prepared,
    runner: &Runner,
    ran: Ran,
    reproducibility: describe::Reproducibility,
    limits: Option<limits::LimitsOut>,
) -> Report {
    let finished = runner.take_finished();
    let recovery = ran.fault.as_ref().map(|f| {
        recovery::analyse(
            &finished.samples,
            &finished.tables,
            f,
            args.recovery_deadline,
            &p.config.slo,
        )
    });
    let scale = args.rate_scale;
    let required_concurrency = (args.mode == Mode::Steps).then(|| {
        args.required_concurrency.unwrap_or_else(|| {
            (p.workload.concurrency.unwrap_or(1.0) * scale)
                .ceil()
                .max(1.0) as u32
        })
    });
    let required_rate = (args.mode == Mode::Ramp)
        .then(|| args.required_rate.or(p.workload.rate.map(|r| r * scale)))
        .flatten();
    let mut notes = p.workload.notes.clone();
    notes.extend(p.profile.notes());
    notes.extend(ran.driven.notes);
    report::build(&report::Inputs {
        args,
        target: &p.target_url,
        profile: &p.profile,
        profile_hash: p.hash.clone(),
        workload: &p.workload,
        config: &p.config,
        runs: &ran.driven.runs,
        samples: &finished.samples,
        tables: &finished.tables,
        started_at: ran.started_at,
        t0: ran.t0,
        interrupted: runner.aborted(),
        saturated: runner.saturated(),
        sent: runner.sent(),
        required_concurrency,
        required_rate,
        soak_rate: ran.driven.soak_rate,
        prompt_lengths: p.prompt_lengths(),
        notes,
        recovery,
        probes: p.probes.as_deref(),
        scrapes: ran.scrapes.as_ref(),
        telemetry: ran.telemetry.as_ref(),
        hosts: ran.hosts.as_ref(),
        reproducibility,
        limits,
    })
}

/// `--compare`: two reports side by side, three or more as a matrix, written to `out`.
/// Runs measured under different conditions are refused, each difference named, unless
/// `allow_different`.
pub fn compare_reports(
    files: &[PathBuf],
    out: &std::path::Path,
    options: &CompareOptions,
) -> Result<Compared, CompareError> {
    match files {
        [a, b] => compare::run(a, b, out, options),
        [_, _, _, ..] if options.quality_max_drop.is_some() => Err(CompareError::DropNeedsTwo),
        [_, _, _, ..] => matrix::run(files, out, options.allow_different)
            .map(|md| Compared { md, failure: None }),
        _ => Err(CompareError::TooFew),
    }
}

/// `goodput replay` from the command line: runs (Ctrl-C stops it cleanly), prints where
/// the report is, and returns the exit code.
pub fn run(args: ReplayArgs) -> ExitCode {
    if let Some(files) = &args.compare {
        let options = CompareOptions {
            allow_different: args.allow_different,
            quality_max_drop: args.quality_max_drop,
        };
        return match compare_reports(files, &args.out, &options) {
            Ok(c) => {
                // A closed pipe (`| head`) is not an error of the comparison.
                let _ = writeln!(std::io::stdout(), "{}", c.md);
                eprintln!("comparison written to {}", args.out.display());
                ExitCode::from(if c.failure.is_some() {
                    EXIT_FAIL
                } else {
                    EXIT_PASS
                })
            }
            Err(e) => {
                eprintln!("goodput replay: {e}");
                ExitCode::from(EXIT_ERROR)
            }
        };
    }
    let mut args = args;
    if args.command_line.is_empty() {
        args.command_line = std::env::args().collect();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("goodput replay: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    rt.block_on(async {
        match execute(&args, crate::run::shutdown_signal()).await {
            Ok(done) => {
                let r = &done.report;
                for v in &r.verdicts {
                    println!("slo gate, class {}: {}", v.class, v.verdict);
                }
                println!(
                    "max stable concurrency: {}; report: {}",
                    r.max_stable_concurrency
                        .map_or("-".into(), |c| c.to_string()),
                    done.dir.join("report.html").display()
                );
                // Last, so whoever reads the screen and not the exit code reads the verdict.
                println!("{}", done.verdict_line());
                ExitCode::from(done.exit_code())
            }
            Err(e) => {
                eprintln!("goodput replay: {e}");
                ExitCode::from(EXIT_ERROR)
            }
        }
    })
}
