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
    measure::{Sample, Stats},
    plan::{Poisson, Template, Workload, mix},
    progress::Progress,
    prompt::Prompts,
    tables::{Key, Tables, slice_of},
};
use crate::{config::Slo, measure::Outcome};

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

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Finished> {
        self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64()
    }

    fn stopped(&self) -> bool {
        *self.abort.borrow() || self.halted.load(Ordering::Relaxed)
    }

    /// The next sequence number, or `None` once no more may be sent.
    fn next_seq(&self) -> Option<u64> {
        if self.stopped() {
            return None;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if self.s.max_requests.is_some_and(|max| seq + 1 >= max) {
            self.halted.store(true, Ordering::Relaxed);
        }
        Some(seq)
    }

    fn outgoing(&self, t: &Template, seq: u64) -> Outgoing {
        if let Some((k, p)) = self.s.probes.as_ref().and_then(|p| p.pick(seq)) {
            return Outgoing {
                api: p.api,
                model: p.model.clone(),
                body: p.body.clone(),
                id: format!("replay-{:08x}-{seq}", self.nonce),
                concurrency: 0,
                probe: Some(k),
                inject: None,
                tenant: None,
            };
        }
        if let Some((kind, body)) = self.s.injector.as_ref().and_then(|i| i.pick(seq)) {
            return Outgoing {
                api: super::plan::ReplayApi::Chat,
                model: t.model.clone(),
                body,
                id: format!("replay-{:08x}-{seq}", self.nonce),
                concurrency: 0,
                probe: None,
                inject: Some(kind),
                tenant: t.tenant.clone(),
            };
        }
        Outgoing {
            api: t.api,
            model: t.model.clone(),
            body: Bytes::from(self.s.prompts.body(t, seq)),
            id: format!("replay-{:08x}-{seq}", self.nonce),
            concurrency: 0,
            probe: None,
            inject: None,
            tenant: t.tenant.clone(),
        }
    }

    /// A closed-loop worker: one request at a time until `deadline` or a stop.
    async fn worker(self: Arc<Self>, step: usize, deadline: Instant, cancel: Cancel) {
        while Instant::now() < deadline {
            let Some(seq) = self.next_seq() else { break };
            let out = self.outgoing(self.s.workload.draw(self.s.seed, seq), seq);
            self.clone().send(out, None, step, cancel.clone()).await;
        }
    }

    /// Sends an open-loop schedule from a thread of its own (a blocking-pool thread):
    /// each body is built ahead, then the thread sleeps until the request's time (OS
    /// sleep: tens of µs precision, against the runtime timer's 1 ms) and spawns the
    /// request onto the runtime. Returns the request tasks and whether it stopped early.
    async fn open_loop(
        self: Arc<Self>,
        plan: Plan,
        start: Instant,
        step: usize,
        cancel: &Cancel,
        tag: Option<super::inject::Kind>,
    ) -> (JoinSet<()>, bool) {
        let cancel = cancel.clone();
        let run =
            tokio::task::spawn_blocking(move || self.schedule(plan, start, step, cancel, tag));
        run.await.unwrap_or_else(|_| (JoinSet::new(), true))
    }

    fn schedule(
        self: Arc<Self>,
        plan: Plan,
        start: Instant,
        step: usize,
        cancel: Cancel,
        tag: Option<super::inject::Kind>,
    ) -> (JoinSet<()>, bool) {
        let mut tasks = JoinSet::new();
        let workload = self.s.workload.clone();
        let (mut arrivals, mut k) = (None, 0usize);
        loop {
            let (at, template) = match plan {
                Plan::Rate { rate, seed, until } => {
                    let at = arrivals
                        .get_or_insert_with(|| Poisson::new(rate, seed))
                        .next_offset();
                    if at >= until {
                        return (tasks, false);
                    }
                    (at, None)
                }
                Plan::Trace { scale } => {
                    let Some(t) = workload.templates.get(k) else {
                        return (tasks, false);
                    };
                    k += 1;
                    (
                        Duration::from_secs_f64((t.at_ms / 1000.0 / scale).max(0.0)),
                        Some(t),
                    )
                }
            };
            let Some(seq) = self.next_seq() else {
                return (tasks, true);
            };
            let t = template.unwrap_or_else(|| workload.draw(self.s.seed, seq));
            let mut out = self.outgoing(t, seq);
            if out.inject.is_none() && out.probe.is_none() {
                out.inject = tag;
            }
            let scheduled = start + at;
            if !self.sleep_until(scheduled) {
                return (tasks, true);
            }
            while self.in_flight.load(Ordering::Relaxed) >= self.s.max_in_flight {
                self.saturated.store(true, Ordering::Relaxed);
                if self.stopped() {
                    return (tasks, true);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            while tasks.try_join_next().is_some() {}
            tasks.spawn(
                self.clone()
                    .send(out, Some(scheduled), step, cancel.clone()),
            );
        }
    }

    /// Sleeps the thread until `t`; false when aborted first.
    fn sleep_until(&self, t: Instant) -> bool {
        loop {
            if *self.abort.borrow() {
                return false;
            }
            let now = Instant::now();
            if now >= t {
                return true;
            }
            std::thread::sleep((t - now).min(Duration::from_millis(50)));
        }
    }

    async fn send(
        self: Arc<Self>,
        mut out: Outgoing,
        scheduled: Option<Instant>,
        step: usize,
        cancel: Cancel,
    ) {
        out.concurrency = self
            .in_flight
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let (probe, inject) = (out.probe, out.inject);
        // As the proxy keeps the tenant header's value: its salted hash.
        let tenant = match (&self.s.slo.tenant_header, &out.tenant) {
            (Some(_), Some(t)) => Some(self.s.slo.tenant_hash(t.as_bytes())),
            _ => None,
        };
        let long = out.body.len() as u64 >= self.s.slo.long_input_bytes;
        let long_before = if long {
            self.long_in_flight.fetch_add(1, Ordering::Relaxed)
        } else {
            self.long_in_flight.load(Ordering::Relaxed)
        };
        let m = self.s.client.send(out, cancel).await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if long {
            self.long_in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        let mut record = m.record;
        record.arrival.long_in_flight = long_before > 0;
        record.tenant = tenant;
        crate::measure::slo::judge(&mut record, &self.s.slo);
        let error = !matches!(record.outcome, Outcome::Ok | Outcome::ClientAbort);
        // The probe's name marks its line in the request log, whatever its outcome.
        let probe_name = probe.zip(self.s.probes.as_deref()).map(|(k, p)| p.name(k));
        // A probe is judged on its answer when it has one (errors are counted as such).
        let probe = match (probe, &self.s.probes) {
            (Some(k), Some(probes)) if record.outcome == Outcome::Ok => {
                let text = super::probes::answer_text(m.answer.as_deref().unwrap_or_default());
                let verdict = probes.check(k, &text);
                Some(Box::new(super::probes::ProbeResult {
                    probe: k,
                    passed: verdict.is_ok(),
                    request_id: record.id.clone(),
                    excerpt: verdict.is_err().then(|| super::probes::excerpt(&text)),
                    reason: verdict.err(),
                }))
            }
            _ => None,
        };
        self.s.progress.finished(record.ttft_ms, error);
        let mut finished = self.lock();
        let mut sample = Sample::of(&record, &mut finished.tables);
        sample
            .set_lag_ms(scheduled.map(|s| m.sent.saturating_duration_since(s).as_secs_f64() * 1e3));
        (sample.sent_s, sample.ended_s) = (self.secs(m.sent), self.secs(m.ended));
        (sample.step, sample.probe, sample.inject) = (step, probe, inject);
        let window = *self.window();
        sample.measured = window.measures(&sample);
        // Only measured requests are read for ITL: their gaps go to their group, the
        // others' are dropped here.
        if sample.measured {
            let key = Key {
                step,
                slice: window
                    .slice
                    .map_or(0, |d| slice_of(sample.ended_s, window.lo, d)),
                class: sample.class,
                model: sample.model,
            };
            sample.itl = finished.tables.record(key, &m.gaps_us);
        }
        // Under the samples lock: the log's order is the samples' order.
        if let Some(log) = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            log.push(super::report::json::request_line(
                &sample, &record, probe_name,
            ));
        }
        finished.samples.push(sample);
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
