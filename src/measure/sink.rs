//! Where finished measurements go: a bounded channel to the aggregator. The data path
//! only ever `try_send`s; when the channel is full the measurement is dropped and counted,
//! and the traffic never notices.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
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
}

impl Recorder {
    pub fn new(capacity: usize, dropped: Counter, in_flight: Gauge) -> (Recorder, mpsc::Receiver<Pending>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Recorder { tx, dropped, in_flight, cutting: Arc::new(AtomicBool::new(false)) }, rx)
    }

    pub(crate) fn submit(&self, pending: Pending) {
        if self.tx.try_send(pending).is_err() {
            self.dropped.inc();
        }
    }

    pub(crate) fn started(&self) {
        self.in_flight.inc();
    }

    pub(crate) fn ended(&self) {
        self.in_flight.dec();
    }

    /// From now on, streams that end without finishing were cut by the proxy's shutdown.
    pub fn mark_cutting(&self) {
        self.cutting.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_cutting(&self) -> bool {
        self.cutting.load(Ordering::Relaxed)
    }
}
