//! Configuration hot reload (SIGHUP, and a poll of the file's modification time): the new
//! file is read, fully validated and built, then published with one atomic swap per
//! consumer. An invalid file, or one that changes a setting that cannot change live, keeps
//! the old configuration running, logs every problem and counts the failure.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;

use crate::{
    config::{self, Config, ConfigError, Overrides},
    measure::Settings,
    proxy::Forward,
};

/// Where the configuration came from, so it can be read again.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub overrides: Overrides,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the new configuration is invalid (keeping the running one): {0}")]
    Invalid(#[from] ConfigError),
    #[error(
        "these settings cannot change while running (restart to apply them): {}",
        .0.join(", ")
    )]
    RestartRequired(Vec<&'static str>),
}

/// Everything a reload swaps.
pub struct Reloader {
    pub(super) source: ConfigSource,
    pub(super) live: Arc<ArcSwap<Config>>,
    pub(super) settings: Arc<ArcSwap<Settings>>,
    pub(super) forward: Forward,
    pub(super) tls: Option<Arc<ArcSwap<rustls::ServerConfig>>>,
    pub(super) reloads: Counter,
    pub(super) failures: Counter,
}

/// Settings the running listeners, connection builders or buffers were sized from.
fn restart_only(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |differs: bool, key: &'static str| {
        if differs {
            changed.push(key);
        }
    };
    check(old.server.listen != new.server.listen, "server.listen");
    check(old.admin != new.admin, "admin.listen");
    check(
        old.admin_access.tls.is_some() != new.admin_access.tls.is_some(),
        "admin.tls (on/off)",
    );
    check(
        old.server.tls.is_some() != new.server.tls.is_some(),
        "server.tls (on/off)",
    );
    check(old.server.http2 != new.server.http2, "server.http2");
    check(
        old.server.header_read_timeout != new.server.header_read_timeout,
        "server.header_read_timeout",
    );
    check(
        old.server.drain_timeout != new.server.drain_timeout,
        "server.drain_timeout",
    );
    let (o, n) = (&old.server.limits, &new.server.limits);
    check(
        o.max_connections != n.max_connections,
        "server.max_connections",
    );
    check(
        o.min_connection_age != n.min_connection_age,
        "server.min_connection_age",
    );
    check(
        o.http2_max_concurrent_streams != n.http2_max_concurrent_streams,
        "server.http2_max_concurrent_streams",
    );
    check(
        o.max_request_header_bytes != n.max_request_header_bytes,
        "server.max_request_header_bytes",
    );
    check(
        o.request_body_timeout != n.request_body_timeout,
        "server.request_body_timeout",
    );
    check(
        o.http2_max_control_frames_per_second != n.http2_max_control_frames_per_second,
        "server.http2_max_control_frames_per_second",
    );
    check(
        old.server.http1_half_close != new.server.http1_half_close,
        "server.http1_half_close",
    );
    check(
        old.measure.kernel_timestamps != new.measure.kernel_timestamps,
        "measure.kernel_timestamps",
    );
    check(
        old.measure.channel_capacity != new.measure.channel_capacity,
        "measure.channel_capacity",
    );
    check(
        old.measure.recent_requests != new.measure.recent_requests,
        "measure.recent_requests",
    );
    check(
        old.measure.max_models != new.measure.max_models,
        "measure.max_models",
    );
    check(old.log.format != new.log.format, "log.format");
    check(old.log.level != new.log.level, "log.level");
    check(
        old.tokenizer.workers != new.tokenizer.workers,
        "tokenizer.workers",
    );
    check(
        old.tokenizer.queue != new.tokenizer.queue,
        "tokenizer.queue",
    );
    check(old.profile.dir != new.profile.dir, "profile.dir");
    check(old.profile.salt != new.profile.salt, "profile.salt");
    let baseline = |c: &Config| c.drift.as_ref().map(|d| d.baseline_path.clone());
    check(baseline(old) != baseline(new), "drift.baseline");
    let otlp_same = match (&old.otlp, &new.otlp) {
        (None, None) => true,
        (Some(o), Some(n)) => o.same_exporter(n),
        _ => false,
    };
    check(!otlp_same, "otlp");
    changed
}

impl Reloader {
    /// Reads, validates and applies the configuration file again.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let result = self.try_reload();
        match &result {
            Ok(()) => {
                self.reloads.inc();
                tracing::info!(path = %self.source.path.display(), "configuration reloaded");
            }
            Err(e) => {
                self.failures.inc();
                tracing::error!(path = %self.source.path.display(), error = %e, "configuration reload refused");
            }
        }
        result
    }

    fn try_reload(&self) -> Result<(), ReloadError> {
        let old = self.live.load_full();
        let new = config::load_with_salt(
            Some(&self.source.path),
            &self.source.overrides,
            &old.slo.tenant_salt,
        )?;
        let blocked = restart_only(&old, &new);
        if !blocked.is_empty() {
            return Err(ReloadError::RestartRequired(blocked));
        }
        // Everything is built; now publish. Requests in flight keep what they loaded.
        self.forward.replace(&new.upstream);
        if let (Some(handle), Some(tls)) = (&self.tls, &new.server.tls) {
            handle.store(tls.clone());
        }
        self.settings.store(Arc::new(Settings::from_config(&new)));
        self.live.store(Arc::new(new));
        Ok(())
    }

    /// Reloads whenever the file's modification time changes.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut seen: Option<SystemTime> = mtime(&self.source.path);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = mtime(&self.source.path);
            if now.is_some() && now != seen {
                seen = now;
                let _ = self.reload();
            }
        }
    }
}
