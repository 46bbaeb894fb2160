//! The bounded ring of the most recent finished requests behind `/api/v1/requests`. Only
//! the aggregator writes it; readers take a short lock off the data path.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use crate::measure::RequestRecord;

#[derive(Debug)]
pub struct Recent {
    ring: Mutex<VecDeque<Arc<RequestRecord>>>,
    capacity: usize,
}

impl Recent {
    pub fn new(capacity: usize) -> Recent {
        Recent {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(1 << 16))),
            capacity,
        }
    }

    pub fn push(&self, record: Arc<RequestRecord>) {
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(record);
    }

    /// The newest `limit` records, oldest first.
    pub fn latest(&self, limit: usize) -> Vec<Arc<RequestRecord>> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter()
            .skip(ring.len().saturating_sub(limit))
            .cloned()
            .collect()
    }

    /// Records finished at or after `since`, oldest first.
    pub fn since(&self, since: Instant) -> Vec<Arc<RequestRecord>> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter()
            .filter(|r| r.finished_at.is_some_and(|t| t >= since))
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
