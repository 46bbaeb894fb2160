//! The single consumer of finished measurements. Besides the records it keeps the clock
//! of the live views: in-flight concurrency is sampled every [`SAMPLE_EVERY`], and the
//! windowed gauges are refreshed every [`REFRESH_EVERY`]. The access log's lines gathered
//! meanwhile are written out at each sample, in one write (see [`crate::telemetry`]).
//!
//! Finished measurements are taken in batches: once one arrives, the channel is looked at
//! again every [`DRAIN_EVERY`] rather than the task being woken by each one (a wake per
//! request is a scheduler's round trip on the proxy's threads); a look that finds none
//! goes back to waiting for the next, and a channel half full calls for a look at once.
//! Each passes the counting stage ([`crate::tokenize::Stage`]) on its way in.
//!
//! The shadow's records come on a channel of their own, read only when no primary record
//! is waiting and one at a time: a candidate's answers never hold a primary record up.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use super::{
    Live, ModelLabels, Recent, Sink, WindowMetrics,
    engine::Observation,
    live::{engine_config, refresh_gauges, refresh_shadow_gauges},
    profiling::Profiling,
};
use crate::{
    calibrate::ProxyTotals,
    config::Config,
    measure::{Pending, RequestMetrics, RequestRecord, Target, verdict},
    telemetry,
};

/// How often in-flight concurrency is sampled for the mean/peak and capacity views.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How often the windowed gauges are recomputed (a scrape interval is rarely shorter).
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// Finished requests handled in a row before the aggregator's clock gets a look in: a
/// backlog never holds the sampling (and the access log's writes) off for long.
const BATCH: usize = 256;
/// How long a finished measurement may wait in the channel while requests keep coming
/// (the recorder calls for a look sooner when the channel is half full).
const DRAIN_EVERY: Duration = Duration::from_millis(2);

/// The metrics the aggregator updates: per request, and the windowed gauges.
#[derive(Clone, Debug)]
pub struct AggregatorMetrics {
    pub requests: RequestMetrics,
    pub windows: WindowMetrics,
}

pub struct Aggregator {
    rx: mpsc::Receiver<Pending>,
    /// Told when `rx` is half full (see [`crate::measure::Recorder::filling`]).
    filling: Option<Arc<tokio::sync::Notify>>,
    /// Token counting on the way in, and the channel counted measurements come back on;
    /// the stage is dropped once `rx` closes, which lets its workers finish and close it.
    counting: Option<crate::tokenize::Stage>,
    counted: Option<mpsc::Receiver<Pending>>,
    config: Arc<ArcSwap<Config>>,
    /// The configuration the engine was last built from.
    engine_built_from: Arc<Config>,
    metrics: RequestMetrics,
    windows: WindowMetrics,
    recent: Arc<Recent>,
    models: ModelLabels,
    live: Live,
    profiling: Profiling,
    /// The proxy's side of self-calibration, fed while `[calibration]` is enabled.
    calibration: Option<Arc<ProxyTotals>>,
    /// Exports handed over by the wiring (OpenTelemetry, `[otlp]`); dropped when the
    /// aggregator ends, which makes their tasks send what is left and stop.
    sinks: Vec<Box<dyn Sink>>,
    /// Pairs of mirrored primaries and shadow answers, and the shadow's counters.
    shadow: Option<(crate::shadow::Book, crate::shadow::ShadowMetrics)>,
    /// The shadow's records ([`crate::shadow::Stage`]); `None` without a shadow.
    shadow_rx: Option<mpsc::Receiver<Pending>>,
    /// Where mirrored answers go to be compared ([`crate::shadow::Comparer`]).
    answers: Option<crate::shadow::Answers>,
}

impl Aggregator {
    pub fn new(
        rx: mpsc::Receiver<Pending>,
        config: Arc<ArcSwap<Config>>,
        metrics: AggregatorMetrics,
        recent: Arc<Recent>,
        max_models: usize,
        live: Live,
        profiling: Profiling,
    ) -> Aggregator {
        let engine_built_from = config.load_full();
        Aggregator {
            rx,
            filling: None,
            counting: None,
            counted: None,
            config,
            engine_built_from,
            metrics: metrics.requests,
            windows: metrics.windows,
            recent,
            models: ModelLabels::new(max_models),
            live,
            profiling,
            calibration: None,
            sinks: Vec::new(),
            shadow: None,
            shadow_rx: None,
            answers: None,
        }
    }

    /// Passes every finished measurement through `stage` on its way in; `counted` is the
    /// stage's channel back.
    pub fn with_counting(
        mut self,
        stage: crate::tokenize::Stage,
        counted: mpsc::Receiver<Pending>,
    ) -> Aggregator {
        self.counting = Some(stage);
        self.counted = Some(counted);
        self
    }

    /// Looks at the channel when `filling` is told it is half full, not only on its clock
    /// (`filling` from [`crate::measure::Recorder::filling`] of the channel's recorder).
    pub fn with_filling(mut self, filling: Arc<tokio::sync::Notify>) -> Aggregator {
        self.filling = Some(filling);
        self
    }

    /// Also hands every judged request, and the gauges, to `sink`.
    pub fn with_sink(mut self, sink: Box<dyn Sink>) -> Aggregator {
        self.sinks.push(sink);
        self
    }

    /// Reads shadow records from `records`, keeps them apart, in `book`, and pairs
    /// mirrored primaries with them; hands their answers to `answers` to be compared.
    pub fn with_shadow(
        mut self,
        book: crate::shadow::Book,
        metrics: crate::shadow::ShadowMetrics,
        records: mpsc::Receiver<Pending>,
        answers: crate::shadow::Answers,
    ) -> Aggregator {
        self.shadow = Some((book, metrics));
        self.shadow_rx = Some(records);
        self.answers = Some(answers);
        self
    }

    /// Also adds every finished request to `totals` while `[calibration]` is enabled.
    pub fn with_calibration(mut self, totals: Arc<ProxyTotals>) -> Aggregator {
        self.calibration = Some(totals);
        self
    }

    /// Runs until every data-path handle is gone (and the shadow's stage has ended) and
    /// both queues are drained.
    pub async fn run(mut self) {
        let mut sample = tokio::time::interval(SAMPLE_EVERY);
        sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_refresh = Instant::now();
        // Targets and cost are known before any traffic: expose them at once.
        refresh_gauges(
            &self.live.lock(),
            &self.config.load(),
            &self.windows,
            last_refresh,
        );
        let mut primary_open = true;
        let mut shadow_rx = self.shadow_rx.take();
        let mut counted = self.counted.take();
        let filling = self.filling.take();
        // When the channel is looked at next; `None`: waiting for a measurement instead.
        let mut next_look: Option<tokio::time::Instant> = None;
        while primary_open || counted.is_some() || shadow_rx.is_some() {
            // In this order: the clock (ready once per sample, so a busy channel never
            // holds the sampling off), the primary's records, and only then the shadow's.
            tokio::select! {
                biased;
                _ = sample.tick() => {
                    let now = Instant::now();
                    let in_flight = u64::try_from(self.metrics.in_flight.get()).unwrap_or(0);
                    self.follow_config();
                    let mut engine = self.live.lock();
                    engine.sample_in_flight(now, in_flight);
                    if now.duration_since(last_refresh) >= REFRESH_EVERY {
                        last_refresh = now;
                        engine.advance(now);
                        refresh_gauges(&engine, &self.config.load(), &self.windows, now);
                        if let Some((book, _)) = &self.shadow {
                            let windows: Vec<(String, Duration)> =
                                engine.windows().map(|(l, d)| (l.to_owned(), d)).collect();
                            refresh_shadow_gauges(book, &windows, &self.windows, now);
                        }
                        if self.sinks.iter().any(|s| s.wants_gauges()) {
                            let gauges = engine.gauges(now);
                            for sink in self.sinks.iter().filter(|s| s.wants_gauges()) {
                                sink.refresh(&gauges);
                            }
                        }
                    }
                    drop(engine);
                    self.profiling.tick(&self.config.load(), now);
                    // The access log's lines of the last tick, in one write.
                    telemetry::flush_access_log();
                }
                () = look_at(next_look, filling.as_deref()), if next_look.is_some() => {
                    let (took, open) = self.drain();
                    if !open {
                        self.primary_closed(&mut primary_open);
                    }
                    // A full batch leaves more behind: looked at again at once (after
                    // the clock, should it be due).
                    let after = if took == BATCH { Duration::ZERO } else { DRAIN_EVERY };
                    next_look = (took > 0 && primary_open)
                        .then(|| tokio::time::Instant::now() + after);
                }
                pending = self.rx.recv(), if primary_open && next_look.is_none() => match pending {
                    Some(pending) => {
                        self.handle_batch(pending);
                        next_look = Some(tokio::time::Instant::now() + DRAIN_EVERY);
                    }
                    None => self.primary_closed(&mut primary_open),
                },
                pending = recv(&mut counted), if counted.is_some() => match pending {
                    Some(pending) => self.handle(pending),
                    None => counted = None,
                },
                pending = recv(&mut shadow_rx), if shadow_rx.is_some() => match pending {
                    Some(pending) => self.handle(pending),
                    None => shadow_rx = None,
                },
            }
        }
        telemetry::flush_access_log();
        self.profiling.shutdown().await;
    }

    /// `first` and whatever else is queued behind it (up to [`BATCH`]).
    fn handle_batch(&mut self, first: Pending) {
        self.take(first);
        for _ in 1..BATCH {
            match self.rx.try_recv() {
                Ok(pending) => self.take(pending),
                Err(_) => break,
            }
        }
    }

    /// Everything queued now, up to [`BATCH`]: how many were taken, and whether the
    /// channel is still open.
    fn drain(&mut self) -> (usize, bool) {
        for took in 0..BATCH {
            match self.rx.try_recv() {
                Ok(pending) => self.take(pending),
                Err(mpsc::error::TryRecvError::Empty) => return (took, true),
                Err(mpsc::error::TryRecvError::Disconnected) => return (took, false),
            }
        }
        (BATCH, true)
    }

    /// The data path is gone: the counting stage goes too, so its workers finish their
    /// queue and close the channel back.
    fn primary_closed(&mut self, open: &mut bool) {
        *open = false;
        self.counting = None;
    }

    /// A measurement off the recorder's channel: through the counting stage, then handled
    /// (now, or when a worker has counted it).
    fn take(&mut self, pending: Pending) {
        let pending = match &self.counting {
            Some(stage) => stage.route(pending),
            None => Some(pending),
        };
        if let Some(pending) = pending {
            self.handle(pending);
        }
    }

    /// Rebuilds the engine's configuration after a reload (keeping its data when the
    /// windows still mean the same thing).
    fn follow_config(&mut self) {
        let current = self.config.load_full();
        if !Arc::ptr_eq(&current, &self.engine_built_from) {
            let mut engine = self.live.lock();
            let kept = engine.reconfigure(engine_config(&current));
            refresh_gauges(&engine, &current, &self.windows, Instant::now());
            tracing::info!(kept_windows = kept, "SLO view reconfigured");
            self.engine_built_from = current;
        }
    }

    fn handle(&mut self, mut pending: Pending) {
        // A shadow copy is in flight until its record is written, below.
        let held = pending.held.take();
        let api = pending.api;
        let body = if self.profiling.active() {
            pending.request_body()
        } else {
            None
        };
        let answer = (self.answers.is_some()
            && (pending.pairing.mirrored || pending.pairing.target.is_copy()))
        .then(|| (std::mem::take(&mut pending.answer), pending.kind));
        let finished = pending.finish_all();
        let (mut record, gaps) = (finished.record, finished.gaps);
        let config = self.config.load();
        // A handle to the answer's kept bytes goes to the shadow's comparer: nothing is decoded
        // or compared here, and a full queue drops them rather than wait.
        if let (Some((chunks, kind)), Some(answers), Some(shadow)) =
            (answer, &self.answers, config.shadow.as_ref())
        {
            answers.hand_over(&record, api, kind, chunks, shadow);
        }
        if record.pairing.target.is_copy() {
            verdict::judge(&mut record, &config.slo);
            self.shadow_answer(record, config.log.access_log);
            if let Some(held) = held {
                held.settle();
            }
            return;
        }
        if !verdict::judge(&mut record, &config.slo) {
            self.passthrough(record, config.log.access_log);
            return;
        }
        self.profiling
            .observe(&record, api, body.as_deref(), finished.max_tokens);
        let model = self.models.label(record.model.as_deref());
        let miss_cause = verdict::MissCause::of(&record);
        self.metrics.observe(&record, &model, &gaps, miss_cause);
        self.live.lock().observe(&Observation {
            started: record.finished_at.map_or_else(Instant::now, |end| {
                end.checked_sub(Duration::from_secs_f64(record.e2e_ms / 1000.0))
                    .unwrap_or(end)
            }),
            finished: record.finished_at.unwrap_or_else(Instant::now),
            class: &record.slo_class,
            model: &model,
            outcome: record.outcome,
            slo_met: record.slo_met,
            // The SLO's figures: from the end of the request body (docs/DESIGN.md
            // "Latencies"), equal to ttft_ms and e2e_ms when the body came with the head.
            ttft_ms: record.ttft_after_upload_ms,
            tpot_ms: record.tpot_ms,
            e2e_ms: record.e2e_after_upload_ms,
            itl_us: &gaps,
            input_tokens: record.input_tokens,
            output_tokens: record.output_tokens,
            concurrency_at_start: record.arrival.concurrency,
            long_in_flight_at_start: record.arrival.long_in_flight,
            miss_cause,
            finish_reason: record.finish_reason,
            cached_input_tokens: record.cached_input_tokens,
            engine_parts: record.engine.parts().map(|(_, v)| v),
            miss_component: record.slo_miss_component,
        });
        if config.calibration.enabled
            && let Some(totals) = &self.calibration
        {
            totals.observe(&model, &record, &gaps);
        }
        for sink in &self.sinks {
            sink.observe(&record, &model, &gaps);
        }
        if record.pairing.mirrored
            && let Some((book, _)) = &self.shadow
        {
            book.note(&record);
        }
        if config.log.access_log {
            super::access::log(&record);
        }
        self.recent.push(Arc::new(record));
    }

    /// A candidate's answer to a mirrored copy: judged on its own, kept as a record, and
    /// out of every view of the primary (metrics, attainment, capacity, drift, profiles).
    fn shadow_answer(&mut self, record: RequestRecord, log: bool) {
        if let Some((book, metrics)) = &self.shadow {
            // The secondary describes the primary's noise, not the candidate.
            if record.pairing.target == Target::Shadow {
                metrics.answered(record.outcome);
            }
            book.note(&record);
        }
        if log {
            super::access::log(&record);
        }
        self.recent.push(Arc::new(record));
    }

    /// A request that is no generation and that no class opted in to: counted and kept
    /// as a record, but out of the SLO views, profiles, drift and calibration.
    fn passthrough(&mut self, record: RequestRecord, log: bool) {
        self.metrics.passthrough(&record);
        if log {
            super::access::log(&record);
        }
        self.recent.push(Arc::new(record));
    }
}

/// Resolves at `at`, or sooner when `filling` is told the channel is half full.
async fn look_at(at: Option<tokio::time::Instant>, filling: Option<&tokio::sync::Notify>) {
    let Some(at) = at else {
        return std::future::pending().await;
    };
    match filling {
        Some(filling) => {
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = filling.notified() => {}
            }
        }
        None => tokio::time::sleep_until(at).await,
    }
}

/// The next record on `rx`; never ready without one.
async fn recv(rx: &mut Option<mpsc::Receiver<Pending>>) -> Option<Pending> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
