//! Running one step of load: a closed loop at a concurrency, an open loop at a Poisson
//! rate, or the profile's own arrival times (trace).
//!
//! A step runs `warmup` then its measuring window. Closed and rate steps count the
//! requests that *finish* inside the window (steady state: as many long requests leave
//! the window unfinished as entered it already running) and divide by the window's
//! length; when the window ends, requests still in flight are cancelled (client aborts at
//! the target) so the next step starts clean. A trace step sends every request at its
//! time, waits for all of them, and measures those sent after the warm-up.
//!
//! Open-loop sends are independent of how fast the target answers: the schedule is
//! computed ahead, the body is built before waiting for its time, and each request runs
//! in its own task. The delay between the scheduled and the actual send is the
//! generator's schedule lag; a cap on requests in flight (`--max-in-flight`) delays sends
//! and marks the run saturated rather than exhausting the machine.
//!
//! Two stop signals: *halt* (`--max-requests` reached) stops sending and lets requests
//! finish; *abort* (Ctrl-C) also cancels what is in flight.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use tokio::{sync::watch, task::JoinSet};

use super::{
    client::{Client, Outgoing},
    plan::{Poisson, Template, Workload, mix},
    progress::Progress,
    prompt::Prompts,
    tables::{Key, Tables, slice_of},
    tally::{Sample, Stats},
};
use crate::{measure::Outcome, slo::Slo};

mod send;

/// The load of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    Concurrency(u32),
    /// Requests per second, Poisson arrivals.
    Rate(f64),
    /// The profile's arrival times divided by the scale.
    Trace(f64),
}

#[derive(Debug, Clone)]
pub struct StepSpec {
    pub index: usize,
    pub label: String,
    pub load: Load,
    pub warmup: Duration,
    /// Measuring window (ignored by trace, which runs to the end of the profile).
    pub measure: Duration,
    /// The intervals the report cuts the step into (soak): measured requests' gaps are
    /// kept per interval.
    pub slice: Option<Duration>,
}

/// What one step did.
#[derive(Debug, Clone)]
pub struct StepRun {
    pub spec: StepSpec,
    /// Step start, measuring window start and end, seconds after the run started.
    pub started_s: f64,
    pub window_start_s: f64,
    pub window_end_s: f64,
    /// Stopped before its planned end (`--max-requests` or Ctrl-C).
    pub cut_short: bool,
    /// `--burst`: its start and end, seconds after the run started.
    pub burst: Option<(f64, f64)>,
}

impl StepRun {
    pub fn duration_s(&self) -> f64 {
        (self.window_end_s - self.window_start_s).max(0.0)
    }
}

/// What a run is made of.
pub struct Setup {
    pub client: Client,
    pub workload: Arc<Workload>,
    pub prompts: Prompts,
    pub slo: Arc<Slo>,
    pub seed: u64,
    pub progress: Progress,
    pub max_requests: Option<u64>,
    pub max_in_flight: u32,
    pub probes: Option<Arc<super::probes::Probes>>,
    pub injector: Option<super::inject::Injector>,
    /// `--burst`: requests/s and how long, once per step.
    pub burst: Option<(f64, Duration)>,
    /// `requests.jsonl`, written as requests finish.
    pub log: Option<super::log::RequestLog>,
}

/// The measuring window of the step running now: a request is measured when it is
/// decided, as it finishes (see [`Window::measures`]).
#[derive(Debug, Clone, Copy)]
struct Window {
    step: usize,
    /// Seconds after the run started.
    lo: f64,
    hi: f64,
    trace: bool,
    /// [`StepSpec::slice`], seconds.
    slice: Option<f64>,
}

impl Window {
    /// Closed and rate steps measure what finishes inside the window; trace measures what
    /// was sent after the warm-up and not cancelled; extra requests are never measured.
    /// A step cut short lowers `hi` under the lock at the instant it takes as its end, so
    /// a request that finished before that instant is inside, one after it outside.
    fn measures(&self, s: &Sample) -> bool {
        s.step == self.step
            && s.inject.is_none()
            && if self.trace {
                s.sent_s >= self.lo && s.outcome != Outcome::ClientAbort
            } else {
                s.ended_s >= self.lo && s.ended_s < self.hi
            }
    }
}

/// Runs the steps of one run; cheap to clone (tasks hold a clone).
#[derive(Clone)]
pub struct Runner(Arc<Inner>);

struct Inner {
    s: Setup,
    t0: Instant,
    abort_tx: watch::Sender<bool>,
    abort: watch::Receiver<bool>,
    halted: AtomicBool,
    in_flight: AtomicU32,
    /// Requests in flight whose body is at least `[slo] long_input_bytes` (as the proxy
    /// counts them).
    long_in_flight: AtomicU32,
    seq: AtomicU64,
    saturated: AtomicBool,
    finished: Mutex<Finished>,
    window: Mutex<Window>,
    log: Mutex<Option<super::log::RequestLog>>,
    /// Random per run, in every request id (`replay-<nonce>-<seq>`), so runs against the
    /// same proxy never share ids.
    nonce: u32,
}

/// Sets the run's abort signal (Ctrl-C) from outside.
#[derive(Clone)]
pub struct AbortHandle(watch::Sender<bool>);

impl AbortHandle {
    pub fn abort(&self) {
        self.0.send_replace(true);
    }
}

impl Runner {
    pub fn new(mut setup: Setup) -> Runner {
        let (abort_tx, abort) = watch::channel(false);
        let log = setup.log.take();
        Runner(Arc::new(Inner {
            s: setup,
            window: Mutex::new(Window {
                step: usize::MAX,
                lo: 0.0,
                hi: 0.0,
                trace: false,
                slice: None,
            }),
            log: Mutex::new(log),
            t0: Instant::now(),
            abort_tx,
            abort,
            halted: AtomicBool::new(false),
            in_flight: AtomicU32::new(0),
            long_in_flight: AtomicU32::new(0),
            seq: AtomicU64::new(0),
            saturated: AtomicBool::new(false),
            finished: Mutex::new(Finished::default()),
            nonce: rand::random(),
        }))
    }

    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.0.abort_tx.clone())
    }

    /// Turns true when the run is aborted (Ctrl-C).
    pub fn abort_signal(&self) -> watch::Receiver<bool> {
        self.0.abort.clone()
    }

    pub fn aborted(&self) -> bool {
        *self.0.abort.borrow()
    }

    /// No more requests will be sent (aborted or `--max-requests` reached).
    pub fn stopped(&self) -> bool {
        self.0.stopped()
    }

    /// The in-flight cap delayed at least one open-loop send.
    pub fn saturated(&self) -> bool {
        self.0.saturated.load(Ordering::Relaxed)
    }

    pub fn sent(&self) -> u64 {
        self.0.seq.load(Ordering::Relaxed)
    }

    pub fn started(&self) -> Instant {
        self.0.t0
    }

    pub fn progress(&self) -> &Progress {
        &self.0.s.progress
    }

    /// The numbers of step `index`'s measured requests over `duration_s` (after the step).
    pub fn step_stats(&self, index: usize, duration_s: f64) -> Stats {
        let f = self.0.lock();
        let measured: Vec<&Sample> = f
            .samples
            .iter()
            .filter(|s| s.step == index && s.measured)
            .collect();
        Stats::of(&measured, duration_s, &self.0.s.slo, &f.tables)
    }

    /// Every request finished so far, in finishing order, and what they point into, moved
    /// out of the runner (after the last step, so the report is built without a copy).
    pub fn take_finished(&self) -> Finished {
        std::mem::take(&mut *self.0.lock())
    }

    /// Flushes and closes `requests.jsonl` (after the last step).
    pub fn close_log(&self) -> std::io::Result<()> {
        let log = self
            .0
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        log.map_or(Ok(()), super::log::RequestLog::close)
    }

    /// Runs one step to its end (or until stopped).
    pub async fn step(&self, spec: StepSpec) -> StepRun {
        let me = &self.0;
        me.s.progress.set_step(&spec.label);
        let start = Instant::now();
        let (cancel_tx, cancel) = watch::channel(false);
        let window_start = start + spec.warmup;
        let mut window_end = window_start + spec.measure;
        *me.window() = Window {
            step: spec.index,
            lo: me.secs(window_start),
            hi: me.secs(window_end),
            trace: matches!(spec.load, Load::Trace(_)),
            slice: spec.slice.map(|d| d.as_secs_f64()),
        };
        let mut tasks = JoinSet::new();
        let mut cut_short = false;
        // The burst: centred in the measuring window, no longer than it.
        let burst = me.s.burst.map(|(rate, d)| {
            let d = d.min(spec.measure);
            let at = window_start + (spec.measure - d) / 2;
            let (me, cancel) = (me.clone(), cancel.clone());
            let seed = me.s.seed ^ mix(spec.index as u64 ^ 0xb0_0575);
            let index = spec.index;
            let task = tokio::spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                let plan = Plan::Rate {
                    rate,
                    seed,
                    until: d,
                };
                let kind = Some(super::inject::Kind::Burst);
                let (mut tasks, _) = me.open_loop(plan, at, index, &cancel, kind).await;
                wait_all(&mut tasks).await;
            });
            (task, at, d)
        });
        match spec.load {
            Load::Concurrency(c) => {
                for _ in 0..c {
                    tasks.spawn(me.clone().worker(spec.index, window_end, cancel.clone()));
                }
                tokio::select! {
                    () = tokio::time::sleep_until(window_end.into()) => {}
                    () = wait_all(&mut tasks) => cut_short = true,
                    () = aborted(me.abort.clone()) => cut_short = true,
                }
            }
            Load::Rate(rate) => {
                let plan = Plan::Rate {
                    rate,
                    seed: me.s.seed ^ mix(spec.index as u64),
                    until: spec.warmup + spec.measure,
                };
                (tasks, cut_short) = me
                    .clone()
                    .open_loop(plan, start, spec.index, &cancel, None)
                    .await;
                let until_end = tokio::time::sleep_until(window_end.into());
                tokio::select! {
                    () = until_end => {}
                    () = wait_all(&mut tasks), if cut_short => {}
                    () = aborted(me.abort.clone()) => cut_short = true,
                }
            }
            Load::Trace(scale) => {
                let plan = Plan::Trace { scale };
                (tasks, cut_short) = me
                    .clone()
                    .open_loop(plan, start, spec.index, &cancel, None)
                    .await;
                tokio::select! {
                    () = wait_all(&mut tasks) => {}
                    () = aborted(me.abort.clone()) => cut_short = true,
                }
                window_end = Instant::now();
            }
        }
        if cut_short {
            let mut w = me.window();
            window_end = window_end.min(Instant::now());
            w.hi = me.secs(window_end);
        }
        cancel_tx.send_replace(true);
        wait_all(&mut tasks).await;
        let burst = match burst {
            Some((task, at, d)) => {
                let _ = task.await;
                Some((me.secs(at), me.secs(at + d)))
            }
            None => None,
        };
        let trace = matches!(spec.load, Load::Trace(_));
        let (lo, hi) = (me.secs(window_start), me.secs(window_end));
        let mut last = lo;
        for s in me
            .lock()
            .samples
            .iter()
            .filter(|s| s.step == spec.index && s.measured)
        {
            last = last.max(s.ended_s);
        }
        StepRun {
            spec,
            started_s: me.secs(start),
            window_start_s: lo,
            window_end_s: if trace { last } else { hi },
            cut_short,
            burst,
        }
    }
}

/// The run's finished requests and the tables they point into.
#[derive(Debug, Default)]
pub struct Finished {
    pub samples: Vec<Sample>,
    pub tables: Tables,
}

type Cancel = watch::Receiver<bool>;

/// An open-loop schedule.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Poisson arrivals until `until`, lengths drawn from the profile.
    Rate {
        rate: f64,
        seed: u64,
        until: Duration,
    },
    /// The profile's requests at their arrival times divided by `scale`.
    Trace { scale: f64 },
}

async fn wait_all(tasks: &mut JoinSet<()>) {
    while tasks.join_next().await.is_some() {}
}

async fn aborted(mut abort: watch::Receiver<bool>) {
    if abort.wait_for(|a| *a).await.is_err() {
        std::future::pending::<()>().await;
    }
}
