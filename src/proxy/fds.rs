//! File descriptors: every client connection holds one, and so does every upstream
//! connection. Many systems start a process with a soft open-files limit of 1,024 and a
//! much higher hard one; left at 1,024, a thousand idle connections exhaust it and lock
//! every new client out. At start the soft limit is raised to the hard one and both are
//! logged; `server.max_connections` is then held to half of what is left (the other half
//! for upstream connections, files and the admin server), with a warning if that is lower
//! than configured.

/// How many client connections the open-files limit leaves room for.
#[derive(Debug, Clone, Copy)]
pub struct ClientBudget {
    /// The soft open-files limit in force; `None` where it could not be read.
    open_files: Option<u64>,
}

impl ClientBudget {
    /// Raises the soft open-files limit to the hard one, logs both, and returns the
    /// budget the limit now in force allows.
    pub fn raise_open_files_limit() -> ClientBudget {
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
        ClientBudget { open_files }
    }

    /// No limit to respect (tests, platforms without one).
    pub fn unlimited() -> ClientBudget {
        ClientBudget { open_files: None }
    }

    /// `configured` client connections, or fewer if the open-files limit has not room
    /// for them (half of it, at least one).
    pub fn cap(self, configured: usize) -> usize {
        let Some(open_files) = self.open_files else {
            return configured;
        };
        let room = usize::try_from(open_files / 2).unwrap_or(usize::MAX).max(1);
        if configured > room {
            tracing::warn!(
                max_connections = configured,
                open_files,
                using = room,
                "server.max_connections is more than the open-files limit has room for \
                 (half of it is kept for upstream connections and files); using the lower number"
            );
            return room;
        }
        configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_half_the_open_files_limit() {
        let budget = ClientBudget {
            open_files: Some(1024),
        };
        assert_eq!(budget.cap(10_000), 512);
        assert_eq!(budget.cap(100), 100);
        assert_eq!(ClientBudget::unlimited().cap(10_000), 10_000);
    }
}
