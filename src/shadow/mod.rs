//! Shadow acceptance: a share of the live generation traffic is copied to a candidate
//! system (`[shadow]`), its answers measured like the primary's and judged on their own,
//! then paired with the primary's (docs/SHADOW.md).
//!
//! - [`Shadow`] is the handle the measurement layer asks, per request head, whether a copy
//!   is taken ([`Mirror`]): generation requests only, sampled by `share`, and only while
//!   fewer than `max_in_flight` copies are under way (else dropped and counted).
//! - The copy is sent when the client's body is complete, on a task of its own with its own
//!   client, on the shadow's own thread ([`send`], `worker`); the answer is read (up to
//!   `max_answer_bytes`) through the same decoders into a record with `target = "shadow"`
//!   and `pair_id` = the primary's id. Nothing the client receives waits for it, and
//!   content is never kept.
//! - Its record takes a way of its own to the aggregator ([`Stage`]), behind the primary's.
//!   A copy is in flight from the moment it is taken until its record is written or it is
//!   dropped, and every copy taken ends one of these two ways, counted.
//! - [`book`] pairs shadow records with their primaries for `GET /api/v1/shadow`;
//!   [`report`] computes the side-by-side numbers and the verdict.
//! - The answers of a pair are compared by the [`Comparer`], off the aggregator: it is
//!   handed handles to the answers' bytes ([`Answers`]), decodes them on a blocking thread and
//!   keeps only numbers (`answers` compares).

mod answers;
pub mod book;
mod compare;
mod logprobs;
mod metrics;
pub mod report;
mod samples;
mod send;
mod shift;
mod stage;
mod view;
mod worker;

use std::{
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use http::{
    HeaderMap, Method,
    header::{EXPECT, HOST},
};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

pub use answers::Answer;
pub use book::Book;
pub use compare::{Answers, Comparer, QUEUE_ANSWERS};
pub use metrics::{DropReason, ShadowMetrics};
pub use stage::{Queue, Stage};
pub use view::{ShadowReport, View};

use crate::{
    config::{Config, ShadowConfig, shadow::DEFAULT_RECORD_QUEUE},
    measure::{Held, Mirror, MirrorHead, MirrorTicket, Recorder, Unmirrored},
    slo::Targets,
};
use worker::Worker;

/// The shadow: its current configuration and client, shared by every request.
#[derive(Clone, Debug)]
pub struct Shadow {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    active: ArcSwapOption<Active>,
    /// The live configuration (SLO classes for `shadow.classes`, tokenizer, limits).
    config: Arc<ArcSwap<Config>>,
    /// Shadow records go into the shadow's own queue through here ([`Stage`]). Taken out
    /// at [`Shadow::stop`]: no copy is sent after.
    recorder: ArcSwapOption<Recorder>,
    metrics: ShadowMetrics,
    /// Until when a re-acceptance trigger switched a disabled shadow on.
    forced_until: Mutex<Option<Instant>>,
    /// True once the proxy is stopping; the copies under way and the stage watch it.
    stop: watch::Sender<bool>,
    /// The shadow's thread, started with the first `[shadow]` (`None` if it could not be).
    worker: OnceLock<Option<Worker>>,
}

/// A configured candidate: its settings, client and in-flight budget, and the
/// secondary's when one is configured.
struct Active {
    cfg: ShadowConfig,
    client: send::Client,
    permits: Arc<Semaphore>,
    secondary: Option<Leg>,
}

/// The secondary's own client and in-flight budget (`max_in_flight` of its own, so that
/// a slow secondary never takes the candidate's places, nor the other way round).
struct Leg {
    client: send::Client,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active").field("cfg", &self.cfg).finish()
    }
}

impl Shadow {
    /// A shadow following `config` (off while it has no `[shadow]`), and the queue its
    /// records go into, `shadow.record_queue` long (as configured at start), for a
    /// [`Stage`] to read.
    pub fn new(config: Arc<ArcSwap<Config>>, metrics: ShadowMetrics) -> (Shadow, Queue) {
        let capacity = config
            .load()
            .shadow
            .as_ref()
            .map_or(DEFAULT_RECORD_QUEUE, |s| s.record_queue);
        // Shadow copies are in flight by their held place (`ShadowMetrics::hold`), not
        // by the recorder's count, which is kept out of every view.
        let (recorder, rx) = Recorder::new(
            capacity.max(1),
            metrics.counter(DropReason::Backlog),
            Gauge::default(),
        );
        let (stop, stopped) = watch::channel(false);
        let shadow = Shadow {
            inner: Arc::new(Inner {
                active: ArcSwapOption::empty(),
                recorder: ArcSwapOption::from_pointee(recorder),
                config: config.clone(),
                metrics,
                forced_until: Mutex::new(None),
                stop,
                worker: OnceLock::new(),
            }),
        };
        shadow.replace(config.load().shadow.as_ref());
        (shadow, Queue { rx, stop: stopped })
    }

    /// Applies a (re)loaded `[shadow]`: a new client only when the candidate changed;
    /// copies under way finish on what they started with.
    pub fn replace(&self, cfg: Option<&ShadowConfig>) {
        let Some(cfg) = cfg else {
            self.inner.active.store(None);
            return;
        };
        if !*self.inner.stop.borrow() {
            self.inner.worker.get_or_init(|| {
                Worker::start()
                    .inspect_err(|e| {
                        tracing::error!(
                            error = %e,
                            "cannot start the shadow's thread; copies run beside the clients'"
                        );
                    })
                    .ok()
            });
        }
        let current = self.inner.active.load_full();
        let (client, permits) = match current.as_deref() {
            Some(a) if a.cfg.same_target(cfg) => {
                let permits = if a.cfg.max_in_flight == cfg.max_in_flight {
                    a.permits.clone()
                } else {
                    Arc::new(Semaphore::new(cfg.max_in_flight))
                };
                (a.client.clone(), permits)
            }
            _ => (
                crate::proxy::pooled_client(&cfg.target),
                Arc::new(Semaphore::new(cfg.max_in_flight)),
            ),
        };
        let secondary = cfg
            .secondary
            .as_ref()
            .map(|target| match current.as_deref() {
                Some(Active {
                    cfg: old,
                    secondary: Some(leg),
                    ..
                }) if old.same_secondary(cfg) => Leg {
                    client: leg.client.clone(),
                    permits: if old.max_in_flight == cfg.max_in_flight {
                        leg.permits.clone()
                    } else {
                        Arc::new(Semaphore::new(cfg.max_in_flight))
                    },
                },
                _ => Leg {
                    client: crate::proxy::pooled_client(target),
                    permits: Arc::new(Semaphore::new(cfg.max_in_flight)),
                },
            });
        self.inner.active.store(Some(Arc::new(Active {
            cfg: cfg.clone(),
            client,
            permits,
            secondary,
        })));
    }

    /// A re-acceptance trigger fired: mirror for `for_` even if `[shadow] enabled = false`.
    pub fn switch_on_for(&self, for_: Duration) {
        let until = Instant::now() + for_;
        if let Ok(mut f) = self.inner.forced_until.lock() {
            *f = Some(f.map_or(until, |t| t.max(until)));
        }
    }

    /// Whether copies are being taken now, and until when a trigger keeps them on.
    pub fn state(&self) -> State {
        let active = self.inner.active.load();
        let forced = self.forced_until();
        State {
            configured: active.is_some(),
            enabled: active.as_ref().is_some_and(|a| a.cfg.enabled) || forced.is_some(),
            share: active.as_ref().map_or(0.0, |a| a.cfg.share),
            forced_for: forced.map(|t| t.saturating_duration_since(Instant::now())),
        }
    }

    /// Diffy's thresholds of the current `[shadow]` (the defaults without one).
    pub fn thresholds(&self) -> report::Thresholds {
        let active = self.inner.active.load();
        let d = crate::config::shadow::ShadowSection::default();
        report::Thresholds {
            relative: active
                .as_ref()
                .map_or(d.answers_relative, |a| a.cfg.answers_relative),
            absolute: active
                .as_ref()
                .map_or(d.answers_absolute, |a| a.cfg.answers_absolute),
        }
    }

    pub fn metrics(&self) -> &ShadowMetrics {
        &self.inner.metrics
    }

    /// Flips once the proxy is stopping (for the [`Comparer`]).
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.inner.stop.subscribe()
    }

    /// Ends every copy under way (the proxy is stopping): no copy is sent any more, and
    /// each under way, or whose record still waits in the shadow's queue, is counted as
    /// dropped (`shutdown`) instead of written. Returns once the shadow's thread is gone,
    /// so that every copy it ran has been counted.
    pub async fn stop(&self) {
        self.inner.recorder.store(None);
        self.inner.stop.send_replace(true);
        if let Some(Some(worker)) = self.inner.worker.get() {
            worker.end().await;
        }
    }

    fn forced_until(&self) -> Option<Instant> {
        let f = self.inner.forced_until.lock().ok()?;
        f.filter(|t| *t > Instant::now())
    }
}

/// What `GET /api/v1/shadow` says of the shadow itself.
#[derive(Debug, Clone, Copy)]
pub struct State {
    pub configured: bool,
    pub enabled: bool,
    pub share: f64,
    /// Left of a trigger's switch-on, when one is running.
    pub forced_for: Option<Duration>,
}

impl Mirror for Shadow {
    fn ticket(&self, head: &MirrorHead<'_>) -> Option<Box<dyn MirrorTicket>> {
        if !head.api.is_generation() || head.parts.method != Method::POST {
            return None;
        }
        let active = self.inner.active.load_full()?;
        if !active.cfg.enabled && self.forced_until().is_none() {
            return None;
        }
        let share = active.cfg.share;
        if share <= 0.0 || (share < 1.0 && rand::random::<f64>() >= share) {
            return None;
        }
        let Ok(permit) = active.permits.clone().try_acquire_owned() else {
            self.inner.metrics.dropped(DropReason::InFlight);
            return None;
        };
        let held = self.inner.metrics.hold();
        // The secondary under the same rules, with places of its own: without one, the
        // candidate's copy still goes (the pair is then judged without noise).
        let secondary = active.secondary.as_ref().and_then(|leg| {
            match leg.permits.clone().try_acquire_owned() {
                Ok(permit) => Some((permit, self.inner.metrics.hold())),
                Err(_) => {
                    self.inner.metrics.dropped(DropReason::InFlight);
                    None
                }
            }
        });
        let mut headers = head.parts.headers.clone();
        crate::proxy::strip_hop_by_hop(&mut headers, false);
        headers.remove(HOST);
        // The body is sent whole at once; a copy has no reason to wait for a 100.
        headers.remove(EXPECT);
        for name in &active.cfg.drop_headers {
            headers.remove(name);
        }
        Some(Box::new(Ticket {
            shadow: self.inner.clone(),
            job: send::Job {
                path: head
                    .parts
                    .uri
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned(),
                headers,
                pair_id: head.id.to_owned(),
                api: head.api,
                tenant: head.tenant,
                slo_overrides: slo_overrides(&head.parts.headers, &self.inner.config.load()),
                body: Vec::new(),
            },
            active,
            permit,
            held,
            secondary,
        }))
    }
}

/// The primary's per-request objective headers, so the copy is held to the same targets.
fn slo_overrides(headers: &HeaderMap, config: &Config) -> Targets {
    if config.slo.header_objectives == crate::slo::HeaderObjectives::Off {
        return Targets::default();
    }
    crate::measure::header_targets(headers).0
}

/// One request's copy, holding its place in `max_in_flight` until the copy is done, and
/// in flight until its record is written (or it is dropped; a ticket dropped unused
/// counts as `shutdown`).
struct Ticket {
    shadow: Arc<Inner>,
    active: Arc<Active>,
    permit: OwnedSemaphorePermit,
    held: Held,
    job: send::Job,
    /// The secondary's place and hold, when it takes this copy too.
    secondary: Option<(OwnedSemaphorePermit, Held)>,
}

impl MirrorTicket for Ticket {
    fn answer_limit(&self) -> u64 {
        self.active.cfg.max_answer_bytes
    }

    fn body_complete(self: Box<Self>, chunks: &[Bytes]) {
        let Ticket {
            shadow,
            active,
            permit,
            held,
            mut job,
            secondary,
        } = *self;
        job.body = chunks.to_vec();
        // The task keeps no hold on the shadow itself: dropping the shadow ends its thread.
        let cx = || send::Context {
            config: shadow.config.clone(),
            metrics: shadow.metrics.clone(),
            recorder: shadow.recorder.load_full(),
            stop: shadow.stop.subscribe(),
        };
        if let Some((permit, held)) = secondary {
            let job = job.clone();
            spawn(
                &shadow,
                send::run(
                    cx(),
                    active.clone(),
                    send::Copy::Secondary,
                    permit,
                    held,
                    job,
                ),
            );
        }
        spawn(
            &shadow,
            send::run(cx(), active, send::Copy::Candidate, permit, held, job),
        );
    }

    fn abandon(self: Box<Self>, why: Unmirrored) {
        let reason = match why {
            Unmirrored::TooLarge => DropReason::BodyTooLarge,
            Unmirrored::Incomplete => DropReason::BodyIncomplete,
        };
        self.shadow.metrics.give_up(self.held, reason);
        if let Some((_, held)) = self.secondary {
            self.shadow.metrics.give_up(held, reason);
        }
    }
}

/// Runs a copy's task on the shadow's thread.
fn spawn(shadow: &Inner, task: impl std::future::Future<Output = ()> + Send + 'static) {
    match shadow.worker.get() {
        Some(Some(worker)) => worker.spawn(task),
        // Without a thread of its own the copy runs beside the client's request; a
        // task dropped unrun (outside a runtime) counts itself as `shutdown`.
        _ => {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                drop(rt.spawn(task));
            }
        }
    }
}

#[cfg(test)]
mod tests;
