//! Time slices. A window of length W is cut into `n` slices of W/n, numbered from the
//! engine's epoch (its first activity), and kept in a ring of `n + 1` slots: the `n` most
//! recent complete slices plus the current one. A slot is reused (reset, allocation kept)
//! when time reaches a slice that maps onto it, so a ring never grows.
//!
//! At `now`, a window covers slices `k_now - n ..= k_now`: everything from the last W is in
//! it, plus up to one slice more (the 1m window with 5 s slices is "the last 60–65 s").
//! Rates divide by exactly that covered span, so counts and seconds always match.
//!
//! Rings are created on first use and slots when time reaches them, so a class, model or
//! level that gets no traffic costs an empty `Option`.

use std::time::{Duration, Instant};

/// Slices per sliding window: W/12 resolution (5 s for 1m, 25 s for 5m, 5 min for 1h).
pub const SLICES_PER_WINDOW: u64 = 12;

/// Where slices start and end for one window length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub window: Duration,
    slice_ns: u64,
    /// Slices per window; the ring holds one more.
    pub n: u64,
}

impl Geometry {
    pub fn new(window: Duration, n: u64) -> Geometry {
        let n = n.max(1);
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        Geometry {
            window,
            slice_ns: (window_ns / n).max(1),
            n,
        }
    }

    /// Length of one slice in seconds.
    pub fn slice_seconds(&self) -> f64 {
        self.slice_ns as f64 / 1e9
    }

    pub fn ring_len(&self) -> usize {
        usize::try_from(self.n + 1).unwrap_or(usize::MAX)
    }

    /// The slice `t` falls in; instants before the epoch count as slice 0.
    pub fn index(&self, epoch: Instant, t: Instant) -> u64 {
        let ns = t.saturating_duration_since(epoch).as_nanos() / u128::from(self.slice_ns);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// Start of slice `k`.
    pub fn start(&self, epoch: Instant, k: u64) -> Instant {
        let offset = Duration::from_nanos(k.saturating_mul(self.slice_ns));
        // Unreachable overflow (k comes from elapsed time); fall back instead of panicking.
        epoch.checked_add(offset).unwrap_or(epoch)
    }

    /// Oldest slice in the window whose newest slice is `k_now`.
    pub fn oldest(&self, k_now: u64) -> u64 {
        k_now.saturating_sub(self.n)
    }
}

/// What a slot holds.
pub trait Slice {
    /// Empty it for a new time slice, keeping allocations.
    fn reset(&mut self);
    /// Heap bytes beyond the slot itself.
    fn heap_bytes(&self) -> usize;
}

/// A fixed ring of lazily created slots, each tagged with its slice number.
#[derive(Debug)]
pub struct Ring<T> {
    slots: Vec<Option<(u64, T)>>,
}

impl<T: Slice> Ring<T> {
    pub fn new(len: usize) -> Ring<T> {
        Ring {
            slots: (0..len.max(1)).map(|_| None).collect(),
        }
    }

    /// The slot for slice `k`, reset if it held an older slice. `None` when `k` is so old
    /// that its slot already holds a newer slice (a late record; it is dropped).
    pub fn slot(&mut self, k: u64, make: impl FnOnce() -> T) -> Option<&mut T> {
        let len = self.slots.len() as u64;
        let i = usize::try_from(k % len).ok()?;
        let slot = self.slots.get_mut(i)?;
        match slot {
            Some((sk, _)) if *sk > k => return None,
            Some((sk, data)) => {
                if *sk < k {
                    data.reset();
                    *sk = k;
                }
            }
            None => *slot = Some((k, make())),
        }
        slot.as_mut().map(|(_, data)| data)
    }

    /// Slices `lo ..= hi` that have data.
    pub fn range(&self, lo: u64, hi: u64) -> impl Iterator<Item = &T> {
        self.slots
            .iter()
            .flatten()
            .filter(move |(k, _)| (lo..=hi).contains(k))
            .map(|(_, d)| d)
    }

    /// Slots created so far (never more than the ring length).
    #[cfg(test)]
    pub fn allocated(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    pub fn heap_bytes(&self) -> usize {
        let slots = self.slots.capacity() * std::mem::size_of::<Option<(u64, T)>>();
        slots
            + self
                .slots
                .iter()
                .flatten()
                .map(|(_, d)| d.heap_bytes())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Count(u64);
    impl Slice for Count {
        fn reset(&mut self) {
            self.0 = 0;
        }
        fn heap_bytes(&self) -> usize {
            0
        }
    }

    #[test]
    fn slots_are_reused_and_late_slices_dropped() {
        let mut r: Ring<Count> = Ring::new(3);
        for k in 0..10 {
            r.slot(k, Count::default).unwrap().0 += 1;
        }
        assert_eq!(r.allocated(), 3);
        assert_eq!(
            r.range(0, 9).map(|c| c.0).sum::<u64>(),
            3,
            "slices 7, 8, 9 remain"
        );
        assert_eq!(r.range(8, 9).count(), 2);
        assert!(r.slot(6, Count::default).is_none(), "slot of 6 now holds 9");
        r.slot(8, Count::default).unwrap().0 += 1;
        assert_eq!(
            r.range(8, 8).map(|c| c.0).sum::<u64>(),
            2,
            "late but still in the ring"
        );
    }

    #[test]
    fn geometry_never_divides_by_zero() {
        let g = Geometry::new(Duration::ZERO, 0);
        let t = Instant::now();
        assert_eq!(g.n, 1);
        assert_eq!(g.index(t, t + Duration::from_nanos(5)), 5);
        assert_eq!(g.index(t + Duration::from_secs(1), t), 0);
        assert_eq!(g.start(t, 3), t + Duration::from_nanos(3));
    }
}
