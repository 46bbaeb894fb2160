//! Settings a reload cannot change: what the running listeners, connection builders,
//! queues and files were made from. Each section names its own keys beside its runtime
//! value (`restart_only` in its file); [`Config::restart_only`] asks every section.

use super::Config;

/// The restart-only keys a new configuration changes, in the order they were asked about.
#[derive(Debug, Default)]
pub struct Changed(Vec<&'static str>);

impl Changed {
    /// Notes `key` when the old and the new value differ.
    pub(super) fn check<T: PartialEq + ?Sized>(&mut self, old: &T, new: &T, key: &'static str) {
        if old != new {
            self.0.push(key);
        }
    }

    pub fn into_keys(self) -> Vec<&'static str> {
        self.0
    }
}

impl Config {
    /// The restart-only settings `new` changes (empty when it may be applied live).
    pub fn restart_only(&self, new: &Config) -> Vec<&'static str> {
        let mut changed = Changed::default();
        self.server.restart_only(&new.server, &mut changed);
        changed.check(&self.admin, &new.admin, "admin.listen");
        self.admin_access
            .restart_only(&new.admin_access, &mut changed);
        self.measure.restart_only(&new.measure, &mut changed);
        self.log.restart_only(&new.log, &mut changed);
        self.tokenizer.restart_only(&new.tokenizer, &mut changed);
        self.profile.restart_only(&new.profile, &mut changed);
        super::drift::restart_only(self.drift.as_ref(), new.drift.as_ref(), &mut changed);
        super::otlp::restart_only(self.otlp.as_ref(), new.otlp.as_ref(), &mut changed);
        changed.into_keys()
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Overrides, load_str};

    fn load(toml: &str) -> crate::config::Config {
        let base = "[upstream]\nurl = \"http://127.0.0.1:9\"\n";
        match load_str(&format!("{base}{toml}"), "test", &Overrides::default()) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn each_section_names_its_own_restart_only_keys() {
        let old = load("");
        let new = load(
            "[server]\nheader_read_timeout = \"5s\"\nmax_connections = 10\n\
             [measure]\nchannel_capacity = 99\n[log]\nformat = \"json\"\n\
             [tokenizer]\nworkers = 3\n[profile]\ndir = \"/tmp/x\"\n",
        );
        assert_eq!(
            old.restart_only(&new),
            [
                "server.header_read_timeout",
                "server.max_connections",
                "measure.channel_capacity",
                "log.format",
                "tokenizer.workers",
                "profile.dir",
            ]
        );
    }

    #[test]
    fn live_settings_are_no_restart() {
        let old = load("");
        let new = load("[slo]\nwindows = [\"1m\"]\n");
        assert!(
            old.restart_only(&new).is_empty(),
            "{:?}",
            old.restart_only(&new)
        );
    }
}
