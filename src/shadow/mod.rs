//! Shadow acceptance: a share of the live generation traffic is copied to a candidate
//! system (`[shadow]`), its answers measured like the primary's and judged on their own,
//! then paired with the primary's (docs/SHADOW.md).
//!
//! - [`Shadow`] is the handle the measurement layer asks, per request head, whether a copy
//!   is taken ([`Mirror`]): generation requests only, sampled by `share`, and only while
//!   fewer than `max_in_flight` copies are under way (else dropped and counted).
//! - The copy is sent when the client's body is complete, on a task of its own with its own
//!   client ([`send`]); the answer is read to its end through the same decoders into a
//!   record with `target = "shadow"` and `pair_id` = the primary's id. Nothing the client
//!   receives waits for it, and content is never kept.
//! - [`book`] pairs shadow records with their primaries for `GET /api/v1/shadow`;
//!   [`report`] computes the side-by-side numbers and the verdict.

pub mod book;
mod metrics;
pub mod report;
mod send;
mod view;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use http::{
    HeaderMap, Method,
    header::{EXPECT, HOST},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

pub use book::Book;
pub use metrics::{DropReason, ShadowMetrics};
pub use view::{ShadowReport, View};

use crate::{
    config::{Config, ShadowConfig, slo::Targets},
    measure::{Mirror, MirrorHead, MirrorTicket, Recorder, Unmirrored},
};

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
    /// Shadow records go to the aggregator through here, counted apart from the primary's.
    /// Taken out at [`Shadow::stop`]: the aggregator ends once every sender is gone, and
    /// this handle also lives inside the aggregator (drift snapshots).
    recorder: ArcSwapOption<Recorder>,
    metrics: ShadowMetrics,
    /// Until when a re-acceptance trigger switched a disabled shadow on.
    forced_until: Mutex<Option<Instant>>,
    stop: watch::Sender<bool>,
}

/// A configured candidate: its settings, client and in-flight budget.
struct Active {
    cfg: ShadowConfig,
    client: send::Client,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active").field("cfg", &self.cfg).finish()
    }
}

impl Shadow {
    /// A shadow following `config` (off while it has no `[shadow]`); its records go into
    /// `recorder`'s channel, counted in flight apart.
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        recorder: &Recorder,
        metrics: ShadowMetrics,
    ) -> Shadow {
        let shadow = Shadow {
            inner: Arc::new(Inner {
                active: ArcSwapOption::empty(),
                recorder: ArcSwapOption::from_pointee(recorder.apart(metrics.in_flight.clone())),
                config: config.clone(),
                metrics,
                forced_until: Mutex::new(None),
                stop: watch::channel(false).0,
            }),
        };
        shadow.replace(config.load().shadow.as_ref());
        shadow
    }

    /// Applies a (re)loaded `[shadow]`: a new client only when the candidate changed;
    /// copies under way finish on what they started with.
    pub fn replace(&self, cfg: Option<&ShadowConfig>) {
        let Some(cfg) = cfg else {
            self.inner.active.store(None);
            return;
        };
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
        self.inner.active.store(Some(Arc::new(Active {
            cfg: cfg.clone(),
            client,
            permits,
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

    pub fn metrics(&self) -> &ShadowMetrics {
        &self.inner.metrics
    }

    /// Ends every copy under way (the proxy is stopping); each is counted as dropped, and
    /// no copy is sent any more.
    pub fn stop(&self) {
        self.inner.recorder.store(None);
        self.inner.stop.send_replace(true);
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

/// One request's copy, holding its place in `max_in_flight` until the copy is done.
struct Ticket {
    shadow: Arc<Inner>,
    active: Arc<Active>,
    permit: OwnedSemaphorePermit,
    job: send::Job,
}

impl MirrorTicket for Ticket {
    fn body_complete(self: Box<Self>, chunks: &[Bytes]) {
        let Ticket {
            shadow,
            active,
            permit,
            mut job,
        } = *self;
        job.body = chunks.to_vec();
        // The body is polled on a runtime thread; outside one there is nowhere to run.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(send::run(shadow, active, permit, job));
        } else {
            shadow.metrics.dropped(DropReason::Shutdown);
        }
    }

    fn abandon(self: Box<Self>, why: Unmirrored) {
        self.shadow.metrics.dropped(match why {
            Unmirrored::TooLarge => DropReason::BodyTooLarge,
            Unmirrored::Incomplete => DropReason::BodyIncomplete,
        });
    }
}
