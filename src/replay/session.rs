//! The load patterns as sequences of steps: trace (one step over the whole profile),
//! steps (one closed-loop step per concurrency level), ramp (open-loop steps at rising
//! rates until a class misses its SLO), soak (one long open-loop step at a fixed rate:
//! `--soak-rate`, or 70% of the knee of a quick ramp run first).

use std::time::Duration;

use super::{
    cli::{Mode, ReplayArgs},
    load::{Load, Runner, StepRun, StepSpec},
    plan::{Workload, ramp_rates},
    report::md::{num, pct},
    tally::Stats,
};

/// Soak load as a share of the knee rate.
pub const SOAK_SHARE_OF_KNEE: f64 = 0.7;
/// Quick-ramp steps (before a soak) last at most this long.
const QUICK_STEP: Duration = Duration::from_secs(5);
/// Step indices of the quick ramp, kept apart from the soak's own.
const QUICK_BASE: usize = 10_000;

/// What the steps did.
pub struct Driven {
    pub runs: Vec<StepRun>,
    pub soak_rate: Option<f64>,
    pub notes: Vec<String>,
}

/// Runs the load pattern `args.mode` asks for.
pub async fn drive(runner: &Runner, args: &ReplayArgs, workload: &Workload) -> Driven {
    let mut runs = Vec::new();
    let mut notes = Vec::new();
    let mut soak_rate = None;
    if args.repeat > 1 && args.mode != Mode::Steps {
        notes.push(format!(
            "--repeat {} applies to steps mode only; this {} run ran once",
            args.repeat,
            args.mode.as_str()
        ));
    }
    match args.mode {
        Mode::Trace => {
            let spec = StepSpec {
                index: 0,
                label: "trace".into(),
                load: Load::Trace(args.rate_scale),
                warmup: args.warmup,
                measure: workload.span.div_f64(args.rate_scale),
                slice: None,
            };
            runs.push(step(runner, spec).await);
        }
        // Limits run as steps once their probes are done (see `limits`).
        Mode::Steps | Mode::Limits => {
            let n = args.repeat.max(1) as usize;
            for (i, &c) in args.concurrency.iter().enumerate() {
                for r in 0..n {
                    if runner.stopped() {
                        break;
                    }
                    let spec = StepSpec {
                        index: i * n + r,
                        label: if n > 1 {
                            format!("c={c} #{}", r + 1)
                        } else {
                            format!("c={c}")
                        },
                        load: Load::Concurrency(c),
                        warmup: args.warmup,
                        measure: args.step_duration,
                        slice: None,
                    };
                    runs.push(step(runner, spec).await);
                }
            }
        }
        Mode::Ramp => {
            let rates = ramp_rates(args.ramp_start, args.ramp_factor, args.ramp_steps);
            runs = ramp(runner, &rates, 0, args.warmup, args.step_duration).await;
            if runs.last().is_some_and(|r| holds(runner, r)) && !runner.stopped() {
                notes.push(format!(
                    "the ramp reached its last rate ({:.2}/s) without breaking: the knee is above it (raise --ramp-steps)",
                    rates.last().copied().unwrap_or(0.0)
                ));
            }
        }
        Mode::Soak => {
            let rate = match args.soak_rate {
                Some(r) => r,
                None => {
                    let rates = ramp_rates(args.ramp_start, args.ramp_factor, args.ramp_steps);
                    let warmup = args.warmup.min(Duration::from_secs(1));
                    let quick = ramp(
                        runner,
                        &rates,
                        QUICK_BASE,
                        warmup,
                        args.step_duration.min(QUICK_STEP),
                    )
                    .await;
                    let knee = quick
                        .iter()
                        .take_while(|r| !breaks(runner, r))
                        .filter(|r| holds(runner, r))
                        .last()
                        .and_then(rate_of)
                        .unwrap_or(args.ramp_start / args.ramp_factor);
                    notes.push(format!(
                        "soak rate {:.3}/s = {:.0}% of the knee {knee:.3}/s found by a quick ramp",
                        knee * SOAK_SHARE_OF_KNEE,
                        SOAK_SHARE_OF_KNEE * 100.0
                    ));
                    knee * SOAK_SHARE_OF_KNEE
                }
            };
            soak_rate = Some(rate);
            if !runner.stopped() {
                let spec = StepSpec {
                    index: 0,
                    label: format!("soak {rate:.2}/s"),
                    load: Load::Rate(rate),
                    warmup: args.warmup,
                    measure: args.soak_duration,
                    slice: Some(args.step_duration),
                };
                runs.push(step(runner, spec).await);
            }
        }
    }
    Driven {
        runs,
        soak_rate,
        notes,
    }
}

fn rate_of(r: &StepRun) -> Option<f64> {
    match r.spec.load {
        Load::Rate(rate) => Some(rate),
        _ => None,
    }
}

/// Open-loop steps at `rates` until one in which a class with enough samples misses its
/// SLO (included); steps with too few samples to tell do not stop the ramp.
async fn ramp(
    runner: &Runner,
    rates: &[f64],
    base: usize,
    warmup: Duration,
    measure: Duration,
) -> Vec<StepRun> {
    let mut runs = Vec::new();
    for (i, &rate) in rates.iter().enumerate() {
        if runner.stopped() {
            break;
        }
        let spec = StepSpec {
            index: base + i,
            label: format!("{rate:.2}/s"),
            load: Load::Rate(rate),
            warmup,
            measure,
            slice: None,
        };
        let run = step(runner, spec).await;
        let broke = breaks(runner, &run);
        runs.push(run);
        if broke {
            break;
        }
    }
    runs
}

fn stats(runner: &Runner, run: &StepRun) -> Stats {
    runner.step_stats(run.spec.index, run.duration_s())
}

/// No class with enough samples missed its targets, and one had enough (see
/// [`Stats::holds`]).
fn holds(runner: &Runner, run: &StepRun) -> bool {
    stats(runner, run).holds()
}

/// A class with enough samples missed its targets: the ramp stops here.
fn breaks(runner: &Runner, run: &StepRun) -> bool {
    stats(runner, run).breaks()
}

/// Runs one step and prints its line above the live display.
async fn step(runner: &Runner, spec: StepSpec) -> StepRun {
    let run = runner.step(spec).await;
    let s = stats(runner, &run);
    runner.progress().println(&format!(
        "{}: {} requests, {} errors, attainment {}, P95 TTFT {} ms, P95 TPOT {} ms, goodput {} tok/s{}",
        run.spec.label,
        s.requests,
        s.errors,
        pct(s.attainment),
        num(s.ttft_ms.p95, 1),
        num(s.tpot_ms.p95, 1),
        num(Some(s.effective_goodput_tokens_per_s), 0),
        if run.cut_short { " (cut short)" } else { "" }
    ));
    run
}
