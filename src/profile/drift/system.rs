//! The other reason to accept again: the system changed (a new engine version, new
//! weights, another model), whatever the traffic does. A task off the data path reads
//! the upstream's identity ([`crate::identity`]) every `[drift] identity_interval` and
//! hands a change to the monitor, which fires `system` at its next evaluation.
//!
//! An identity that cannot be read (the upstream down, no identity endpoint) is unknown
//! and changes nothing; only a field read both before and after can differ.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use prometheus_client::metrics::{family::Family, gauge::Gauge};
use serde::Serialize;

use crate::{
    fetch::Fetcher,
    identity::{self, Identity},
    metrics::UpstreamInfoLabels,
};

/// What changed: the identity the deployment was running on, and the one it runs on now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemChange {
    pub from: Identity,
    pub to: Identity,
    /// `upstream changed: version 0.31.0 → 0.32.0`.
    pub explanation: String,
}

#[derive(Debug, Default)]
struct State {
    /// The identity last read (unknown fields filled from earlier reads).
    current: Option<Identity>,
    /// A change the monitor has not taken yet.
    pending: Option<SystemChange>,
    /// The labels of `goodput_upstream_info` set now.
    labels: Option<UpstreamInfoLabels>,
}

impl State {
    /// Takes in one read; returns the change it made, if any.
    fn update(&mut self, read: Identity) -> Option<SystemChange> {
        if read.is_unknown() {
            return None;
        }
        let Some(current) = self.current.take() else {
            self.current = Some(read);
            return None;
        };
        let changes = current.changes(&read);
        let next = fill(read, &current);
        if changes.is_empty() {
            self.current = Some(next);
            return None;
        }
        let change = SystemChange {
            from: current,
            to: next.clone(),
            explanation: format!("upstream changed: {}", changes.join(", ")),
        };
        self.current = Some(next);
        // A second change before the monitor looked: from the first identity to the last.
        let change = match self.pending.take() {
            Some(earlier) => SystemChange {
                from: earlier.from,
                ..change
            },
            None => change,
        };
        self.pending = Some(change.clone());
        Some(change)
    }
}

/// `read` with the fields it lacks taken from `before` (a field one endpoint did not
/// answer this time is not forgotten).
fn fill(read: Identity, before: &Identity) -> Identity {
    Identity {
        engine: read.engine.or_else(|| before.engine.clone()),
        version: read.version.or_else(|| before.version.clone()),
        model: read.model.or_else(|| before.model.clone()),
        revision: read.revision.or_else(|| before.revision.clone()),
        max_model_len: read.max_model_len.or(before.max_model_len),
        server: read.server.or_else(|| before.server.clone()),
    }
}

/// The watch: the latest identity and a change waiting for the monitor. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct IdentityWatch {
    state: Arc<Mutex<State>>,
}

impl IdentityWatch {
    /// Starts reading `origin`'s identity every `interval` (the first read at once), and
    /// keeps `goodput_upstream_info` to the latest known identity. Runs until the runtime
    /// ends.
    pub fn spawn(
        origin: String,
        interval: Duration,
        info: Family<UpstreamInfoLabels, Gauge>,
    ) -> IdentityWatch {
        let watch = IdentityWatch::default();
        let task = watch.clone();
        tokio::spawn(async move {
            let fetcher = Fetcher::new(identity::FETCH_TIMEOUT, None);
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let read = identity::read(&fetcher, &origin).await;
                task.observe(read, &info);
            }
        });
        watch
    }

    /// The watch `[drift] identity_interval` asks for on `[upstream] url`, if any.
    pub fn of_config(
        cfg: &crate::config::Config,
        metrics: &crate::profile::ProfileMetrics,
    ) -> Option<IdentityWatch> {
        let every = cfg.drift.as_ref()?.identity_interval?;
        let u = &cfg.upstream;
        let origin = format!("{}://{}{}", u.scheme, u.authority, u.base_path);
        Some(IdentityWatch::spawn(
            origin,
            every,
            metrics.upstream_info.clone(),
        ))
    }

    /// Takes in one read and publishes the identity it leaves.
    fn observe(&self, read: Identity, info: &Family<UpstreamInfoLabels, Gauge>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(change) = state.update(read) {
            tracing::warn!(
                from = %change.from.describe(),
                to = %change.to.describe(),
                event = "system_changed",
                "{}",
                change.explanation
            );
        }
        let Some(current) = &state.current else {
            return;
        };
        let [engine, version, model, revision] = current.labels();
        let labels = UpstreamInfoLabels {
            engine,
            version,
            model,
            revision,
        };
        if state.labels.as_ref() != Some(&labels) {
            if let Some(old) = state.labels.take() {
                info.remove(&old);
            }
            info.get_or_create(&labels).set(1);
            state.labels = Some(labels);
        }
    }

    /// A change not yet handed to the monitor.
    pub fn take_change(&self) -> Option<SystemChange> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pending
            .take()
    }

    /// The identity last read, if any was.
    pub fn current(&self) -> Option<Identity> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .current
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(version: &str, model: &str) -> Identity {
        Identity {
            engine: Some("vllm".into()),
            version: Some(version.into()),
            model: Some(model.into()),
            ..Identity::default()
        }
    }

    #[test]
    fn a_change_of_a_known_field_is_pending_until_taken() {
        let watch = IdentityWatch::default();
        let info = Family::default();
        watch.observe(id("0.31.0", "m"), &info);
        assert!(
            watch.take_change().is_none(),
            "the first read is the reference"
        );
        watch.observe(id("0.31.0", "m"), &info);
        assert!(watch.take_change().is_none());
        watch.observe(id("0.32.0", "m"), &info);
        let change = watch.take_change().unwrap();
        assert_eq!(
            change.explanation,
            "upstream changed: version 0.31.0 → 0.32.0"
        );
        assert_eq!(change.from.version.as_deref(), Some("0.31.0"));
        assert!(watch.take_change().is_none(), "taken once");
    }

    #[test]
    fn unknown_reads_and_missing_fields_are_never_a_change() {
        let watch = IdentityWatch::default();
        let info = Family::default();
        watch.observe(id("0.31.0", "m"), &info);
        watch.observe(Identity::default(), &info);
        let partial = Identity {
            model: Some("m".into()),
            ..Identity::default()
        };
        watch.observe(partial, &info);
        assert!(watch.take_change().is_none());
        assert_eq!(watch.current().unwrap().version.as_deref(), Some("0.31.0"));
    }

    #[test]
    fn two_changes_before_the_monitor_looks_span_first_to_last() {
        let watch = IdentityWatch::default();
        let info = Family::default();
        watch.observe(id("1", "a"), &info);
        watch.observe(id("2", "a"), &info);
        watch.observe(id("2", "b"), &info);
        let change = watch.take_change().unwrap();
        assert_eq!(change.from.version.as_deref(), Some("1"));
        assert_eq!(change.to.model.as_deref(), Some("b"));
    }

    #[test]
    fn the_info_metric_follows_the_current_identity() {
        let watch = IdentityWatch::default();
        let info: Family<UpstreamInfoLabels, Gauge> = Family::default();
        watch.observe(id("1", "a"), &info);
        watch.observe(id("2", "a"), &info);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("info", "i", info);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"version="2""#), "{text}");
        assert!(
            !text.contains(r#"version="1""#),
            "the old series is gone: {text}"
        );
    }
}
