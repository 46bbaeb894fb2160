//! Where finished measurements go: a bounded channel to the aggregator. The data path
//! only ever `try_send`s; when the channel is full the measurement is dropped and counted,
//! and the traffic never notices.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicI64, Ordering},
};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokio::sync::mpsc;

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
            },
            rx,
        )
    }

    pub(crate) fn submit(&self, pending: Pending) {
        if self.tx.try_send(pending).is_err() {
            self.dropped.inc();
        }
    }

    pub(crate) fn started(&self, long_input: bool) -> Arrival {
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

    pub(crate) fn ended(&self, long_input: bool) {
        self.in_flight.dec();
        if long_input {
            self.long_in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// From now on, streams that end without finishing were cut by the proxy's shutdown.
    pub fn mark_cutting(&self) {
        self.cutting.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_cutting(&self) -> bool {
        self.cutting.load(Ordering::Relaxed)
    }
}
