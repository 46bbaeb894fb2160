//! The aggregator's profile side: each finished request becomes an anonymized profile line
//! (tenant and prompt blocks only as salted hashes) for the recorder and the live drift
//! monitor; the monitor is evaluated periodically, its status published to metrics, the
//! admin API and (on a change) the webhook, and a snapshot of the live window is written
//! when re-acceptance becomes necessary.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Instant, SystemTime},
};

use crate::{
    config::Config,
    decode::Api,
    measure::RequestRecord,
    profile::{
        Anonymizer, Clock, Profile, ProfileLine, ProfileMetrics, ProfileRecorder,
        drift::{DriftStatus, IdentityWatch, Monitor, SYSTEM, Webhook, write_snapshot},
    },
};

/// The latest drift status, shared with `GET /api/v1/drift`.
pub type DriftView = Arc<Mutex<Option<DriftStatus>>>;

pub struct Profiling {
    anon: Anonymizer,
    recorder: Option<ProfileRecorder>,
    monitor: Option<Monitor>,
    webhook: Option<Webhook>,
    view: DriftView,
    metrics: ProfileMetrics,
    last_evaluation: Instant,
    /// The shadow a fired trigger may switch on, and whose verdict a snapshot records.
    shadow: Option<crate::shadow::View>,
    /// The upstream's identity, read on a timer (`[drift] identity_interval`).
    identity: Option<IdentityWatch>,
}

impl Profiling {
    /// Starts recording (when `[profile] dir` is set) and drift detection (when
    /// `[drift] baseline` is set; `baseline` is that profile, read). A recorder that cannot
    /// start is logged; traffic goes on.
    pub fn start(
        cfg: &Config,
        baseline: Option<&Profile>,
        metrics: &ProfileMetrics,
        view: DriftView,
    ) -> Profiling {
        let anon = Anonymizer::new(&cfg.profile);
        let recorder = cfg.profile.dir.as_ref().and_then(|dir| {
            match ProfileRecorder::start(&cfg.profile, anon.clone(), metrics, Clock::of_runtime()) {
                Ok(r) => {
                    tracing::info!(dir = %dir.display(), salt_id = anon.salt_id(), "recording profiles");
                    Some(r)
                }
                Err(e) => {
                    tracing::error!(error = %e, "profile recording could not start");
                    None
                }
            }
        });
        let monitor = cfg
            .drift
            .as_ref()
            .zip(baseline)
            .map(|(d, b)| Monitor::new(d, b));
        let webhook = cfg
            .drift
            .as_ref()
            .and_then(|d| d.webhook.clone())
            .map(Webhook::start);
        Profiling {
            anon,
            recorder,
            monitor,
            webhook,
            view,
            metrics: metrics.clone(),
            last_evaluation: Instant::now(),
            shadow: None,
            identity: None,
        }
    }

    /// Fires the `system` trigger on what `watch` reads (only with drift detection on).
    pub fn with_identity(mut self, watch: Option<IdentityWatch>) -> Profiling {
        self.identity = watch.filter(|_| self.monitor.is_some());
        self
    }

    /// Lets a fired trigger switch `shadow` on (`[drift] shadow_on_trigger`) and snapshots
    /// record its verdict.
    pub fn with_shadow(mut self, shadow: crate::shadow::View) -> Profiling {
        self.shadow = Some(shadow);
        self
    }

    /// Whether lines are wanted at all (so the aggregator can skip reading bodies).
    pub fn active(&self) -> bool {
        self.recorder.is_some() || self.monitor.is_some()
    }

    /// One finished, SLO-judged request; `max_tokens` as its record's making read it from
    /// the body.
    pub fn observe(
        &mut self,
        record: &RequestRecord,
        api: Api,
        body: Option<&[u8]>,
        max_tokens: Option<u64>,
    ) {
        if !self.active() {
            return;
        }
        let blocks = body.map_or_else(Vec::new, |b| {
            self.anon.blocks(api, record.model.as_deref(), b)
        });
        let tenant = record.tenant.map(|t| self.anon.tenant(t));
        let line = ProfileLine::from_record(record, max_tokens, tenant, blocks);
        if let Some(m) = self.monitor.as_mut() {
            m.observe(&line, record.finished_at.unwrap_or_else(Instant::now));
        }
        if let Some(r) = &self.recorder {
            r.record(line);
        }
    }

    /// Evaluates drift when `[drift] every` has passed, or at once when the upstream's
    /// identity changed.
    pub fn tick(&mut self, cfg: &Config, now: Instant) {
        let (Some(monitor), Some(drift)) = (self.monitor.as_mut(), cfg.drift.as_ref()) else {
            return;
        };
        let change = self.identity.as_ref().and_then(IdentityWatch::take_change);
        let system = change.is_some();
        if let Some(change) = change {
            monitor.system_changed(change);
        }
        if !system && now.duration_since(self.last_evaluation) < drift.every {
            return;
        }
        self.last_evaluation = now;
        let status = monitor.evaluate(now);
        status.publish(&self.metrics);
        status.log_transitions();
        if !status.transitions.is_empty()
            && let Some(w) = &self.webhook
        {
            w.notify(&status);
        }
        if status.fired() {
            let lines: Vec<ProfileLine> = monitor.window_lines().cloned().collect();
            let mut header = self.anon.header(SystemTime::now(), &cfg.profile.contract);
            if status.transitions.iter().any(|t| t.dimension == SYSTEM) {
                header.system_change = status
                    .system
                    .as_ref()
                    .and_then(|s| serde_json::to_value(s).ok());
            }
            if let Some(shadow) = &self.shadow {
                if let Some(on_for) = drift.shadow_on_trigger {
                    shadow.shadow.switch_on_for(on_for);
                    tracing::warn!(
                        for_s = on_for.as_secs(),
                        "shadow switched on by the re-acceptance trigger"
                    );
                }
                header.shadow = shadow.verdicts(drift.window, &cfg.slo);
            }
            let dir = drift.snapshot_dir.clone();
            tokio::task::spawn_blocking(move || match write_snapshot(&dir, &header, &lines) {
                Ok(path) => {
                    tracing::warn!(path = %path.display(), "live profile snapshot written for re-acceptance")
                }
                Err(e) => tracing::error!(error = %e, "writing the drift snapshot failed"),
            });
        }
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
    }

    /// Flushes and closes the profile files.
    pub async fn shutdown(self) {
        if let Some(r) = self.recorder {
            r.shutdown().await;
        }
    }
}
