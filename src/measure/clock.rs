//! When a connection last read bytes: one timestamp per socket read, shared by every frame
//! those bytes make up, and where that timestamp came from.
//!
//! A read from the upstream often carries many streamed events (chunks); hyper hands them
//! to the response body one at a time. Reading the clock per frame cost a clock read per
//! event; stamping the read instead gives each frame the time its bytes arrived, which is
//! also the more exact time.
//!
//! Where the platform gives them, reads are stamped with the kernel's receive timestamp
//! (`SO_TIMESTAMPING`, see `proxy::wire`): the time the packet reached the network stack,
//! not the later time the proxy got round to reading it. Those stamps are wall-clock
//! (`CLOCK_REALTIME`) times; [`from_wall`] carries them onto the monotonic clock the
//! timeline uses by their age: how long before the wall clock's "now" the packet came,
//! taken that long before the monotonic "now". A wall clock stepped between the packet and
//! the read could make that age wrong; an age that is negative or over [`MAX_AGE`] is not
//! trusted and the read is stamped with the monotonic clock instead ([`Clock::User`]).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

/// Where a timestamp came from: the kernel's receive stamp of the packet, or the process's
/// clock when the proxy read the bytes. Record field `clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    Kernel,
    User,
}

impl Clock {
    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Kernel => "kernel",
            Clock::User => "user",
        }
    }
}

/// The oldest a kernel receive stamp may be when it is read. Bytes can wait in the socket
/// buffer while the client reads slowly (backpressure), so this is generous; older than
/// this, a wall-clock step is the likelier story.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// The monotonic time of a wall-clock `stamp` (since the Unix epoch), given the wall clock
/// and the monotonic clock read together just now. `None` when the stamp is in the future
/// or older than [`MAX_AGE`] (the wall clock was stepped).
pub fn from_wall(stamp: Duration, wall_now: Duration, now: Instant) -> Option<Instant> {
    let age = wall_now.checked_sub(stamp)?;
    if age > MAX_AGE {
        return None;
    }
    now.checked_sub(age)
}

/// The client connection's [`ReadClock`], put in each request's extensions by the data
/// path: the read that completed the request head gives the request's `t_arrival`.
#[derive(Debug, Clone)]
pub struct ClientReads(pub std::sync::Arc<ReadClock>);

/// The time of a connection's latest read. Written by the connection's I/O, read by the
/// measured body and the measurement layer; all of them run in the client connection's
/// task, so relaxed ordering is enough (a task moving between threads is synchronised by
/// the scheduler).
#[derive(Debug)]
pub struct ReadClock {
    /// Before any read can have happened: [`MAX_AGE`] before the clock was made, so that a
    /// packet that came before the connection was accepted is still after it.
    base: Instant,
    /// 0 before the first read; else 1 + (nanoseconds from `base` << 1 | 1 for a kernel
    /// stamp).
    latest: AtomicU64,
}

impl Default for ReadClock {
    fn default() -> Self {
        ReadClock::new()
    }
}

impl ReadClock {
    pub fn new() -> ReadClock {
        let now = Instant::now();
        ReadClock {
            base: now.checked_sub(MAX_AGE).unwrap_or(now),
            latest: AtomicU64::new(0),
        }
    }

    /// A read has just completed; no kernel stamp came with it.
    pub fn stamp(&self) {
        self.store(Instant::now(), Clock::User);
    }

    /// A read has just completed with the kernel's receive stamp `wall` (since the Unix
    /// epoch). Reads of one stream come in order, so a stamp never goes back before the
    /// previous read's.
    pub fn stamp_kernel(&self, wall: Duration) {
        let now = Instant::now();
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|wall_now| from_wall(wall, wall_now, now));
        match at {
            Some(at) => {
                let floor = self.latest().unwrap_or(self.base);
                self.store(at.max(floor), Clock::Kernel);
            }
            None => self.store(now, Clock::User),
        }
    }

    fn store(&self, at: Instant, clock: Clock) {
        let since = at.saturating_duration_since(self.base).as_nanos();
        let since = u64::try_from(since).unwrap_or(u64::MAX).min(u64::MAX >> 2);
        let kernel = u64::from(clock == Clock::Kernel);
        self.latest
            .store(((since << 1) | kernel) + 1, Ordering::Relaxed);
    }

    /// When the latest read completed; `None` before the first.
    pub fn latest(&self) -> Option<Instant> {
        self.latest_read().map(|(at, _)| at)
    }

    /// When the latest read completed, and by which clock; `None` before the first.
    pub fn latest_read(&self) -> Option<(Instant, Clock)> {
        match self.latest.load(Ordering::Relaxed) {
            0 => None,
            n => {
                let n = n - 1;
                let clock = if n & 1 == 1 {
                    Clock::Kernel
                } else {
                    Clock::User
                };
                Some((self.base + Duration::from_nanos(n >> 1), clock))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall() -> Duration {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
    }

    #[test]
    fn the_latest_read_is_kept_to_the_nanosecond() {
        let clock = ReadClock::new();
        assert_eq!(clock.latest(), None);
        let before = Instant::now();
        clock.stamp();
        let after = Instant::now();
        let (first, how) = clock.latest_read().unwrap();
        assert_eq!(how, Clock::User);
        assert!(
            before <= first && first <= after,
            "{before:?} {first:?} {after:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
        clock.stamp();
        let second = clock.latest().unwrap();
        assert!(second >= first + Duration::from_millis(2));
    }

    #[test]
    fn wall_stamps_map_onto_the_monotonic_clock_by_their_age() {
        let now = Instant::now();
        let wall_now = Duration::from_secs(1_800_000_000) + Duration::from_nanos(123_456_789);
        let ago = |d: Duration| wall_now - d;
        assert_eq!(from_wall(ago(Duration::ZERO), wall_now, now), Some(now));
        assert_eq!(
            from_wall(ago(Duration::from_micros(1_500)), wall_now, now),
            Some(now - Duration::from_micros(1_500))
        );
        assert_eq!(
            from_wall(ago(MAX_AGE), wall_now, now),
            now.checked_sub(MAX_AGE)
        );
        // A wall clock stepped back after the packet (the stamp is "in the future"), or
        // forward by more than any read waits: not trusted.
        assert_eq!(
            from_wall(wall_now + Duration::from_nanos(1), wall_now, now),
            None
        );
        assert_eq!(
            from_wall(ago(MAX_AGE + Duration::from_nanos(1)), wall_now, now),
            None
        );
        assert_eq!(from_wall(Duration::ZERO, wall_now, now), None);
    }

    #[test]
    fn kernel_stamps_are_kept_as_such_and_never_go_back() {
        let clock = ReadClock::new();
        let before = Instant::now();
        clock.stamp_kernel(wall() - Duration::from_millis(3));
        let after = Instant::now();
        let (at, how) = clock.latest_read().unwrap();
        assert_eq!(how, Clock::Kernel);
        // 3 ms before the read, give or take the microseconds between the clock reads.
        let slack = Duration::from_millis(1);
        assert!(
            at + Duration::from_millis(3) >= before - slack
                && at + Duration::from_millis(3) <= after + slack,
            "{before:?} {at:?} {after:?}"
        );
        // An older stamp on a later read (TCP delivers in order): held at the previous one.
        clock.stamp_kernel(wall() - Duration::from_millis(50));
        assert_eq!(clock.latest_read(), Some((at, Clock::Kernel)));
    }

    #[test]
    fn untrustworthy_kernel_stamps_fall_back_to_the_process_clock() {
        let clock = ReadClock::new();
        let before = Instant::now();
        clock.stamp_kernel(wall() + Duration::from_secs(5));
        let (at, how) = clock.latest_read().unwrap();
        assert_eq!(how, Clock::User);
        assert!(at >= before);
        clock.stamp_kernel(Duration::ZERO);
        assert_eq!(clock.latest_read().unwrap().1, Clock::User);
    }

    #[test]
    fn a_packet_from_before_the_clock_was_made_still_fits() {
        let earlier = wall() - Duration::from_millis(20);
        let made = Instant::now();
        let clock = ReadClock::new();
        clock.stamp_kernel(earlier);
        let (at, how) = clock.latest_read().unwrap();
        assert_eq!(how, Clock::Kernel);
        assert!(at < made, "{at:?} {made:?}");
    }

    #[test]
    fn clock_names_are_the_record_values() {
        for c in [Clock::Kernel, Clock::User] {
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
        }
    }
}
