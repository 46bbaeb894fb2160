//! When an upstream connection last read bytes: one timestamp per socket read, shared by
//! every frame those bytes make up.
//!
//! A read from the upstream often carries many streamed events (chunks); hyper hands them
//! to the response body one at a time. Reading the clock per frame cost a clock read per
//! event; stamping the read instead gives each frame the time its bytes arrived, which is
//! also the more exact time.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// The time of a connection's latest read. Written by the connection's I/O, read by the
/// measured body; both run in the client connection's task, so relaxed ordering is enough
/// (a task moving between threads is synchronised by the scheduler).
#[derive(Debug)]
pub struct ReadClock {
    base: Instant,
    /// Nanoseconds from `base` to the latest read, plus one; 0 before the first read.
    latest: AtomicU64,
}

impl Default for ReadClock {
    fn default() -> Self {
        ReadClock::new()
    }
}

impl ReadClock {
    pub fn new() -> ReadClock {
        ReadClock {
            base: Instant::now(),
            latest: AtomicU64::new(0),
        }
    }

    /// A read has just completed.
    pub fn stamp(&self) {
        let since = self.base.elapsed().as_nanos();
        let since = u64::try_from(since).unwrap_or(u64::MAX - 1);
        self.latest.store(since + 1, Ordering::Relaxed);
    }

    /// When the latest read completed; `None` before the first.
    pub fn latest(&self) -> Option<Instant> {
        match self.latest.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n - 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_read_is_kept_to_the_nanosecond() {
        let clock = ReadClock::new();
        assert_eq!(clock.latest(), None);
        let before = Instant::now();
        clock.stamp();
        let after = Instant::now();
        let first = clock.latest().unwrap();
        assert!(
            before <= first && first <= after,
            "{before:?} {first:?} {after:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
        clock.stamp();
        let second = clock.latest().unwrap();
        assert!(second >= first + Duration::from_millis(2));
    }
}
