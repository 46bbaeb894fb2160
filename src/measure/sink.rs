//! Where finished measurements go: a bounded channel to the aggregator. The data path
//! only ever `try_send`s; when the channel is full the measurement is dropped and counted,
//! and the traffic never notices. A measurement that must be accounted for to its end (a
//! shadow copy's) carries a [`Held`] place, given up exactly once however it ends.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicI64, Ordering},
};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokio::sync::{
    Notify,
    mpsc::{self, error::TrySendError},
};

use super::tap::Pending;

/// The data path's handle on the measurement path. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Recorder {
    tx: mpsc::Sender<Pending>,
    dropped: Counter,
    in_flight: Gauge,
    /// Set when the drain deadline passed and remaining streams are being cut, so those
    /// records say the proxy ended them rather than the client.
    cutting: Arc<AtomicBool>,
    /// Long-input requests in flight, to tell whether long requests slow down short ones.
    long_in_flight: Arc<AtomicI64>,
    /// Every measurement open now, judged or not (tunnels and passthrough included).
    open: Arc<AtomicI64>,
    /// Told when the channel is half full: its reader looks at it on a clock of its own
    /// (in batches, not woken by each measurement) and comes at once when it fills.
    filling: Arc<Notify>,
}

/// The load a request arrived into.
#[derive(Debug, Clone, Copy, Default)]
pub struct Arrival {
    /// In-flight requests including this one.
    pub concurrency: u32,
    /// Whether another long-input request was in flight.
    pub long_in_flight: bool,
}

impl Recorder {
    pub fn new(
        capacity: usize,
        dropped: Counter,
        in_flight: Gauge,
    ) -> (Recorder, mpsc::Receiver<Pending>) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            Recorder {
                tx,
                dropped,
                in_flight,
                cutting: Arc::new(AtomicBool::new(false)),
                long_in_flight: Arc::new(AtomicI64::new(0)),
                open: Arc::new(AtomicI64::new(0)),
                filling: Arc::new(Notify::new()),
            },
            rx,
        )
    }

    /// Hands a finished measurement on. When the channel is full it is dropped and counted
    /// as `dropped`; a held one whose channel is closed counts its own loss instead.
    pub(crate) fn submit(&self, pending: Pending) {
        match self.tx.try_send(pending) {
            Ok(()) => {
                if self.tx.capacity() * 2 <= self.tx.max_capacity() {
                    self.filling.notify_one();
                }
            }
            Err(TrySendError::Full(mut p)) => {
                self.dropped.inc();
                if let Some(held) = p.held.take() {
                    held.settle();
                }
            }
            Err(TrySendError::Closed(p)) if p.held.is_some() => {}
            Err(TrySendError::Closed(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Told whenever a measurement leaves the channel half full or more (see `filling`).
    pub fn filling(&self) -> Arc<Notify> {
        Arc::clone(&self.filling)
    }

    /// A request arrived. Only judged (generation) requests are counted in flight; a
    /// passthrough request (a metrics scrape, a health probe) is told the load it met.
    pub(crate) fn started(&self, judged: bool, long_input: bool) -> Arrival {
        self.open.fetch_add(1, Ordering::Relaxed);
        if !judged {
            return Arrival {
                concurrency: u32::try_from(self.in_flight.get().max(0)).unwrap_or(u32::MAX),
                long_in_flight: self.long_in_flight.load(Ordering::Relaxed) > 0,
            };
        }
        let before = self.in_flight.inc();
        let long_before = if long_input {
            self.long_in_flight.fetch_add(1, Ordering::Relaxed)
        } else {
            self.long_in_flight.load(Ordering::Relaxed)
        };
        Arrival {
            concurrency: u32::try_from(before.saturating_add(1)).unwrap_or(u32::MAX),
            long_in_flight: long_before > 0,
        }
    }

    /// A request [`started`](Recorder::started) with the same arguments ended.
    pub(crate) fn ended(&self, judged: bool, long_input: bool) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        if !judged {
            return;
        }
        self.in_flight.dec();
        if long_input {
            self.long_in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Judged (generation) requests in flight now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// Measurements open now, of every kind: none once every record is out.
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }

    /// From now on, streams that end without finishing were cut by the proxy's shutdown.
    pub fn mark_cutting(&self) {
        self.cutting.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_cutting(&self) -> bool {
        self.cutting.load(Ordering::Relaxed)
    }
}

/// A measurement's place in a gauge, from before it starts until its record is written or
/// it is given up: up while held, down exactly once when dropped, wherever that happens
/// (on the data path, in a channel, in a task the runtime drops at exit). Dropped without
/// [`Held::settle`], it was lost on the way and counts `lost` too; so nothing held can
/// end uncounted.
#[derive(Debug)]
pub struct Held {
    gauge: Gauge,
    lost: Option<Counter>,
}

impl Held {
    /// Takes a place in `gauge`; `lost` is counted if the place is dropped unsettled.
    pub fn new(gauge: Gauge, lost: Counter) -> Held {
        gauge.inc();
        Held {
            gauge,
            lost: Some(lost),
        }
    }

    /// Gives the place up as accounted for: its record was written, or the reason it was
    /// not was counted by whoever settles it.
    pub fn settle(mut self) {
        self.lost = None;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.gauge.dec();
        if let Some(lost) = self.lost.take() {
            lost.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_judged_requests_count_in_flight() {
        let gauge = Gauge::default();
        let (recorder, _rx) = Recorder::new(4, Counter::default(), gauge.clone());
        let first = recorder.started(true, true);
        assert_eq!(first.concurrency, 1);
        assert!(!first.long_in_flight);
        // A health probe meets the load but adds none.
        let probe = recorder.started(false, false);
        assert_eq!(probe.concurrency, 1);
        assert!(probe.long_in_flight);
        assert_eq!(gauge.get(), 1);
        let second = recorder.started(true, false);
        assert_eq!(second.concurrency, 2);
        assert!(second.long_in_flight);
        recorder.ended(false, false);
        assert_eq!(recorder.in_flight(), 2);
        recorder.ended(true, true);
        assert_eq!(recorder.open(), 1);
        recorder.ended(true, false);
        assert_eq!(gauge.get(), 0);
        assert_eq!(recorder.open(), 0);
        assert!(!recorder.started(false, false).long_in_flight);
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn a_held_place_is_given_up_once_and_counts_only_when_lost() {
        let (gauge, lost) = (Gauge::default(), Counter::default());
        let settled = Held::new(gauge.clone(), lost.clone());
        let dropped = Held::new(gauge.clone(), lost.clone());
        assert_eq!(gauge.get(), 2);
        settled.settle();
        assert_eq!((gauge.get(), lost.get()), (1, 0));
        drop(dropped);
        assert_eq!((gauge.get(), lost.get()), (0, 1));
    }
}
