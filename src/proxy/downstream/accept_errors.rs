//! Failed accepts on the proxy port (out of file descriptors, say): counted, and warned
//! about at most once per [`ACCEPT_WARN_EVERY`] instead of 20 times a second.

use std::time::{Duration, Instant};

/// Failed accepts are warned about at most this often, with the number since the last
/// warning.
pub(super) const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// Failed accepts since the last warning, to warn about them at most once per
/// [`ACCEPT_WARN_EVERY`] instead of 20 times a second.
#[derive(Default)]
pub(super) struct AcceptErrors {
    last_warning: Option<Instant>,
    since: u64,
}

impl AcceptErrors {
    pub(super) fn failed(
        &mut self,
        e: &std::io::Error,
        counter: &prometheus_client::metrics::counter::Counter,
    ) {
        counter.inc();
        if let Some(failed) = self.warn_now(Instant::now()) {
            tracing::warn!(
                error = %e,
                failed,
                every = ?ACCEPT_WARN_EVERY,
                "accept failed (out of file descriptors?); backing off, warning at most once per interval"
            );
        }
    }

    /// One more failure at `now`: the number to warn about, if a warning is due.
    fn warn_now(&mut self, now: Instant) -> Option<u64> {
        self.since += 1;
        if self
            .last_warning
            .is_some_and(|at| now.saturating_duration_since(at) < ACCEPT_WARN_EVERY)
        {
            return None;
        }
        self.last_warning = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_accepts_warn_once_per_interval_with_the_count() {
        let mut errors = AcceptErrors::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(errors.warn_now(at(0)), Some(1));
        // 20 a second for the next ten seconds: silent...
        let warned: Vec<_> = (1..200)
            .filter_map(|i| errors.warn_now(at(i * 50)))
            .collect();
        assert!(warned.is_empty(), "{warned:?}");
        // ...then one warning that counts them all.
        assert_eq!(errors.warn_now(at(10_000)), Some(200));
    }
}
