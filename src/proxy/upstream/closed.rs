//! Why the upstream pool closes a connection that carried its response to the end, as
//! `goodput_upstream_connections_closed_total{reason}` counts it.

#[cfg(test)]
use crate::proxy::UPSTREAM_CLOSED_REASONS;

/// Why the pool closed an upstream connection that had carried its response to the end
/// (`goodput_upstream_connections_closed_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Bytes arrived that no request asked for: after a response, or while idle. The
    /// next request must never read them as its answer.
    UnsolicitedBytes,
    /// The upstream closed it (FIN or RST) while it idled.
    ByUpstream,
    /// Idle for `upstream.pool_idle_timeout`.
    IdleTimeout,
    /// `upstream.pool_max_idle_per_host` connections were already idle.
    PoolFull,
    /// Still open as its response ended, but hyper's handle could not take another
    /// request: closed rather than pooled.
    NotReusable,
}

impl Closed {
    /// The label value, one of [[`UPSTREAM_CLOSED_REASONS`](crate::proxy::UPSTREAM_CLOSED_REASONS) (exported at 0 from the
    /// start; a test keeps the two lists equal).
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::UnsolicitedBytes => "unsolicited_bytes",
            Closed::ByUpstream => "closed_by_upstream",
            Closed::IdleTimeout => "idle_timeout",
            Closed::PoolFull => "pool_full",
            Closed::NotReusable => "not_reusable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_exported_from_the_start() {
        let all = [
            Closed::UnsolicitedBytes,
            Closed::ByUpstream,
            Closed::IdleTimeout,
            Closed::PoolFull,
            Closed::NotReusable,
        ];
        let names: Vec<_> = all.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, UPSTREAM_CLOSED_REASONS);
    }
}
