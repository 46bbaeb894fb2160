//! Configuration hot reload (SIGHUP, and a poll of the file's content hash): the new
//! file is read, fully validated and built, then published with one atomic swap per
//! consumer. An invalid file, or one that changes a setting that cannot change live, keeps
//! the old configuration running, logs every problem and counts the failure.

use std::{path::PathBuf, sync::Arc, time::Duration};

use arc_swap::ArcSwap;

use super::{ReloadMetrics, Resources};
use crate::{
    config::{self, Config, ConfigError, Overrides},
    measure::Settings,
    proxy::Forward,
    tokenize::Tokenizers,
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
    /// The loaded `[tokenizer] models`, replaced together with the configuration.
    pub(super) tokenizers: Arc<ArcSwap<Tokenizers>>,
    pub(super) settings: Arc<ArcSwap<Settings>>,
    pub(super) forward: Forward,
    pub(super) shadow: crate::shadow::Shadow,
    pub(super) tls: Option<Arc<ArcSwap<rustls::ServerConfig>>>,
    pub(super) metrics: ReloadMetrics,
}

impl Reloader {
    /// Reads, validates and applies the configuration file again.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let result = self.try_reload();
        match &result {
            Ok(()) => {
                self.metrics.reloads.inc();
                tracing::info!(path = %self.source.path.display(), "configuration reloaded");
            }
            Err(e) => {
                self.metrics.failures.inc();
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
        let blocked = old.restart_only(&new);
        if !blocked.is_empty() {
            return Err(ReloadError::RestartRequired(blocked));
        }
        // The files it names load as at start (the baseline is read to check it; the
        // running monitor keeps its own, as `drift.baseline` needs a restart).
        let resources = Resources::load(&new)?;
        // Everything is built; now publish. Requests in flight keep what they loaded.
        self.forward.replace(&new.upstream);
        self.shadow.replace(new.shadow.as_ref());
        if let (Some(handle), Some(tls)) = (&self.tls, &new.server.tls) {
            handle.store(tls.clone());
        }
        self.settings.store(Arc::new(Settings::from_config(&new)));
        self.tokenizers.store(Arc::new(resources.tokenizers));
        self.live.store(Arc::new(new));
        Ok(())
    }

    /// Reloads whenever the file's content changes, looking every `every` (on tokio's
    /// clock).
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut file = FileWatch::new(self.source.path.clone());
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if file.changed() {
                let _ = self.reload();
            }
        }
    }
}

/// A file's content as last seen, by hash. A write, a rename over it or a symlink swap
/// that changes what it reads is a change, however soon after the last one (modification
/// times have a coarse granularity on some file systems); touching it, or rewriting the
/// same text, is not.
struct FileWatch {
    path: PathBuf,
    seen: Option<blake3::Hash>,
}

impl FileWatch {
    fn new(path: PathBuf) -> FileWatch {
        let seen = Self::hash(&path);
        FileWatch { path, seen }
    }

    fn hash(path: &PathBuf) -> Option<blake3::Hash> {
        std::fs::read(path).ok().map(|bytes| blake3::hash(&bytes))
    }

    /// Whether the content differs from the last look. A file that cannot be read (being
    /// replaced) is no change: its next readable content is compared.
    fn changed(&mut self) -> bool {
        let now = Self::hash(&self.path);
        if now.is_some() && now != self.seen {
            self.seen = now;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "goodput-filewatch-{name}-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_change_of_content_is_seen_at_once_and_a_touch_is_not() {
        let dir = temp_dir("content");
        let path = dir.join("goodput.toml");
        std::fs::write(&path, "a = 1\n").unwrap();
        let mut watch = FileWatch::new(path.clone());
        assert!(!watch.changed());
        // Within the same second as the first write: seen, whatever the mtime says.
        std::fs::write(&path, "a = 2\n").unwrap();
        assert!(watch.changed());
        assert!(!watch.changed());
        // The same text written again is no change.
        std::fs::write(&path, "a = 2\n").unwrap();
        assert!(!watch.changed());
        // Gone for a moment (being replaced): no change, then the new content is one.
        std::fs::remove_file(&path).unwrap();
        assert!(!watch.changed());
        std::fs::write(&path, "a = 3\n").unwrap();
        assert!(watch.changed());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_swap_is_a_change() {
        use std::os::unix::fs::symlink;
        let dir = temp_dir("symlink");
        for (name, text) in [("v1", "a = 1\n"), ("v2", "a = 2\n")] {
            std::fs::create_dir(dir.join(name)).unwrap();
            std::fs::write(dir.join(name).join("goodput.toml"), text).unwrap();
        }
        symlink("v1", dir.join("..data")).unwrap();
        symlink("..data/goodput.toml", dir.join("goodput.toml")).unwrap();
        let mut watch = FileWatch::new(dir.join("goodput.toml"));
        symlink("v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert!(watch.changed());
        assert!(!watch.changed());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
