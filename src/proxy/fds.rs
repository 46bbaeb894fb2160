//! File descriptors: every client connection holds one, and so does every upstream
//! connection. Many systems start a process with a soft open-files limit of 1,024 and a
//! much higher hard one; left at 1,024, a thousand idle connections exhaust it and lock
//! every new client out. At start the soft limit is raised to the hard one and both are
//! logged.
//!
//! The limit then becomes one budget ([`Division`]): a reserve for everything else (the
//! listeners, the admin server and its clients, profile and log files, the runtime's own
//! descriptors), and the rest shared by client connections (`server.max_connections`)
//! and upstream connections (`upstream.max_connections`): half each, or what the other
//! leaves when it is configured lower. A configured number that does not fit is lowered,
//! with a warning. The division is logged and exported (`goodput_file_budget`), at start
//! and again on reload (the upstream's share; the client connections' is fixed until a
//! restart).

use super::LimitMetrics;

/// The descriptors kept for everything but connections: an eighth of the limit, at least
/// this many...
const RESERVE_MIN: u64 = 32;
/// ...and at most this many.
const RESERVE_MAX: u64 = 1024;

/// The open-files limit the connections are budgeted from.
#[derive(Debug, Clone, Copy)]
pub struct FileBudget {
    /// The soft open-files limit in force; `None` where it could not be read.
    open_files: Option<u64>,
}

/// How the open-files limit is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Division {
    /// The limit divided; `None` where there is none to respect.
    pub open_files: Option<u64>,
    /// Client connections that may be open at once.
    pub clients: usize,
    /// Upstream connections that may be open at once (on hyper's client: requests).
    pub upstream: usize,
    /// Descriptors kept for everything else.
    pub reserve: usize,
}

impl FileBudget {
    /// Raises the soft open-files limit to the hard one, logs both, and returns the
    /// budget the limit now in force allows.
    pub fn raise_open_files_limit() -> FileBudget {
        let before = rlimit::Resource::NOFILE.get();
        let open_files = match (before, rlimit::increase_nofile_limit(u64::MAX)) {
            (Ok((soft, hard)), Ok(now)) => {
                tracing::info!(soft_was = soft, soft = now, hard, "open-files limit");
                Some(now)
            }
            (before, now) => {
                let soft = before.as_ref().ok().map(|(soft, _)| *soft);
                let error = before.err().or(now.err());
                tracing::warn!(error = ?error, "cannot read or raise the open-files limit");
                soft
            }
        };
        FileBudget { open_files }
    }

    /// No limit to respect (tests, platforms without one).
    pub fn unlimited() -> FileBudget {
        FileBudget { open_files: None }
    }

    #[cfg(test)]
    pub(super) fn of(open_files: u64) -> FileBudget {
        FileBudget {
            open_files: Some(open_files),
        }
    }

    /// The descriptors kept for everything but connections, and those left for them.
    fn split(open_files: u64) -> (usize, usize) {
        let reserve = (open_files / 8)
            .clamp(RESERVE_MIN, RESERVE_MAX)
            .min(open_files);
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        (size(reserve), size(open_files - reserve))
    }

    /// The division at start, for `clients` and `upstream` connections as configured.
    pub fn divide(self, clients: usize, upstream: usize) -> Division {
        let Some(open_files) = self.open_files else {
            return Division {
                open_files: None,
                clients,
                upstream,
                reserve: 0,
            };
        };
        let (reserve, room) = FileBudget::split(open_files);
        // Half each, or what the other leaves when it asks for less; at least one each.
        let upstream = upstream
            .min((room / 2).max(room.saturating_sub(clients)))
            .max(1);
        let clients = clients.min(room.saturating_sub(upstream)).max(1);
        Division {
            open_files: Some(open_files),
            clients,
            upstream,
            reserve,
        }
    }

    /// The division after a reload configured `upstream` connections: client connections
    /// keep their share (it changes only with a restart), the upstream gets what is left.
    pub fn redivide(self, before: Division, upstream: usize) -> Division {
        let Some(open_files) = self.open_files else {
            return Division { upstream, ..before };
        };
        let (reserve, room) = FileBudget::split(open_files);
        Division {
            upstream: upstream.min(room.saturating_sub(before.clients)).max(1),
            reserve,
            ..before
        }
    }
}

impl Division {
    /// Logs the division (with a warning for each configured number it lowered) and
    /// exports it on `/metrics`.
    pub fn publish(
        &self,
        configured_clients: usize,
        configured_upstream: usize,
        limits: &LimitMetrics,
    ) {
        let Some(open_files) = self.open_files else {
            return;
        };
        tracing::info!(
            open_files,
            client_connections = self.clients,
            upstream_connections = self.upstream,
            reserve = self.reserve,
            "open-files budget"
        );
        if self.clients < configured_clients {
            tracing::warn!(
                max_connections = configured_clients,
                open_files,
                using = self.clients,
                "server.max_connections is more than the open-files budget has room for \
                 (the rest is kept for upstream connections and files); using the lower number"
            );
        }
        if self.upstream < configured_upstream {
            tracing::warn!(
                max_connections = configured_upstream,
                open_files,
                using = self.upstream,
                "upstream.max_connections is more than the open-files budget has room for \
                 (the rest is kept for client connections and files); using the lower number"
            );
        }
        let set = |share: &'static str, n: u64| {
            limits
                .file_budget
                .get_or_create(&crate::metrics::ShareLabel { share })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set("open_files", open_files);
        set("client_connections", self.clients as u64);
        set("upstream_connections", self.upstream as u64);
        set("reserve", self.reserve as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_shared_by_clients_upstreams_and_a_reserve() {
        let d = FileBudget::of(1024).divide(10_000, 1_024);
        assert_eq!((d.clients, d.upstream, d.reserve), (448, 448, 128));
        assert_eq!(d.clients + d.upstream + d.reserve, 1024);
        // Configured lower: the other side gets the rest.
        let d = FileBudget::of(1024).divide(10_000, 100);
        assert_eq!((d.clients, d.upstream), (796, 100));
        let d = FileBudget::of(1024).divide(50, 10_000);
        assert_eq!((d.clients, d.upstream), (50, 846));
        // Both fit: as configured.
        let d = FileBudget::of(1 << 20).divide(10_000, 1_024);
        assert_eq!((d.clients, d.upstream, d.reserve), (10_000, 1_024, 1024));
        // No limit: as configured.
        let d = FileBudget::unlimited().divide(10_000, 1_024);
        assert_eq!((d.clients, d.upstream), (10_000, 1_024));
        // A tiny limit still leaves one of each.
        let d = FileBudget::of(16).divide(10_000, 1_024);
        assert_eq!((d.clients, d.upstream), (1, 1));
    }

    #[test]
    fn a_reload_gives_the_upstream_what_the_clients_leave() {
        let budget = FileBudget::of(1024);
        let start = budget.divide(10_000, 100);
        assert_eq!(start.clients, 796);
        let d = budget.redivide(start, 10_000);
        assert_eq!((d.clients, d.upstream), (796, 100));
        let d = budget.redivide(start, 50);
        assert_eq!((d.clients, d.upstream), (796, 50));
    }

    #[test]
    fn the_division_is_exported() {
        let limits = LimitMetrics::default();
        FileBudget::of(1024)
            .divide(10_000, 1_024)
            .publish(10_000, 1_024, &limits);
        let get = |share| {
            limits
                .file_budget
                .get_or_create(&crate::metrics::ShareLabel { share })
                .get()
        };
        assert_eq!(get("open_files"), 1024);
        assert_eq!(get("client_connections"), 448);
        assert_eq!(get("upstream_connections"), 448);
        assert_eq!(get("reserve"), 128);
    }
}
