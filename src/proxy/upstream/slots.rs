//! The upstream connection budget (`upstream.max_connections`), shared by both ways to the
//! upstream: the inline HTTP/1 pool ([`super::inline`]), where each open connection holds
//! a slot (idle ones too), and hyper's pooled client (TLS, HTTP/2, upgrades), where each
//! request holds one for as long as its response streams. A request that finds none free
//! waits up to `upstream.pool_wait_timeout`, taking a slot or (inline) a connection that
//! came back to the pool, whichever comes first; then it gets a 503. A connection that
//! cannot be opened for want of descriptors waits the same way (both; see
//! [`super::files_wait`] for hyper's client), trying
//! again as connections come back and every [`FILES_RETRY`].
//!
//! Without it, every client stream opens its own upstream connection: 5,000 HTTP/2 streams
//! on one client connection made 4,883 upstream connections and ran out of descriptors.

use std::{pin::pin, sync::Arc, time::Duration};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::error::ProxyError;
use crate::proxy::LimitMetrics;

/// How often a request that could not connect for want of descriptors tries again
/// while it waits (besides whenever a connection comes back to the pool).
pub const FILES_RETRY: Duration = Duration::from_millis(20);

/// One upstream connection's (or, on hyper's client, one request's) place in the budget;
/// given back when dropped.
pub type Slot = OwnedSemaphorePermit;

/// What a wait for a way to the upstream ended with.
pub enum Got<T> {
    /// A free slot: open a connection with it.
    Slot(Slot),
    /// What the caller's `other` found (an idle connection, holding its own slot).
    Other(T),
}

pub struct Slots {
    free: Arc<Semaphore>,
    wait: Duration,
    /// Told when an inline connection goes back to the pool, for requests waiting on one.
    returned: Notify,
    limits: LimitMetrics,
}

impl Slots {
    /// What the proxy's bounds count, for the pools sharing this budget.
    pub fn limits(&self) -> &LimitMetrics {
        &self.limits
    }

    pub fn new(max: usize, wait: Duration, limits: LimitMetrics) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            wait,
            returned: Notify::new(),
            limits,
        }
    }

    /// `upstream.pool_wait_timeout`.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// After a connect failed for want of descriptors: waits until a connection comes
    /// back to the pool or [`FILES_RETRY`] passes (a descriptor may have been freed
    /// elsewhere), then says to try again; false once `until` has passed.
    pub async fn wait_for_files(&self, until: tokio::time::Instant) -> bool {
        let now = tokio::time::Instant::now();
        if now >= until {
            return false;
        }
        tokio::select! {
            () = self.returned.notified() => {}
            () = tokio::time::sleep_until((now + FILES_RETRY).min(until)) => {}
        }
        true
    }

    /// A connection went back to the pool: one waiting request may take it.
    pub fn returned(&self) {
        self.returned.notify_one();
    }

    /// A slot, waiting for one up to the pool wait timeout.
    pub async fn take(&self) -> Result<Slot, ProxyError> {
        match self.take_or(|| None::<()>).await? {
            Got::Slot(slot) => Ok(slot),
            Got::Other(()) => Err(ProxyError::UpstreamBusy(self.wait)),
        }
    }

    /// What `other` finds (tried first, and again each time a connection is returned), or
    /// a free slot, waiting up to the pool wait timeout.
    pub async fn take_or<T>(
        &self,
        mut other: impl FnMut() -> Option<T>,
    ) -> Result<Got<T>, ProxyError> {
        if let Some(t) = other() {
            return Ok(Got::Other(t));
        }
        if let Ok(slot) = Arc::clone(&self.free).try_acquire_owned() {
            return Ok(Got::Slot(slot));
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Listening before looking, so that a return in between is not missed.
            let mut returned = pin!(self.returned.notified());
            returned.as_mut().enable();
            if let Some(t) = other() {
                return Ok(Got::Other(t));
            }
            tokio::select! {
                slot = Arc::clone(&self.free).acquire_owned() => match slot {
                    Ok(slot) => return Ok(Got::Slot(slot)),
                    // The semaphore is never closed.
                    Err(_) => break,
                },
                () = &mut returned => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.limits.rejected("upstream.max_connections");
        Err(ProxyError::UpstreamBusy(self.wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_for_descriptors_ends_at_a_returned_connection_or_the_deadline() {
        let slots = Arc::new(slots(1));
        let start = tokio::time::Instant::now();
        let until = start + Duration::from_secs(10);
        // Nothing returned: a short pause, then try again.
        assert!(slots.wait_for_files(until).await);
        assert_eq!(start.elapsed(), FILES_RETRY);
        // A connection coming back ends the wait at once.
        slots.returned();
        let at = tokio::time::Instant::now();
        assert!(slots.wait_for_files(until).await);
        assert_eq!(at.elapsed(), Duration::ZERO);
        // Past the deadline: give up.
        tokio::time::sleep_until(until).await;
        assert!(!slots.wait_for_files(until).await);
    }

    fn slots(max: usize) -> Slots {
        Slots::new(max, Duration::from_secs(10), LimitMetrics::default())
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_a_slot_then_gets_503() {
        let slots = slots(1);
        let held = slots.take().await.unwrap();
        let start = tokio::time::Instant::now();
        let err = slots.take().await.unwrap_err();
        assert!(matches!(err, ProxyError::UpstreamBusy(_)), "{err}");
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        drop(held);
        assert!(slots.take().await.is_ok(), "a freed slot is taken at once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_the_waiting_request() {
        let slots = Arc::new(slots(1));
        let held = slots.take().await.unwrap();
        let waiting = tokio::spawn({
            let slots = Arc::clone(&slots);
            async move { slots.take().await.is_ok() }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(held);
        assert!(waiting.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_returned_connection_goes_to_the_waiting_request() {
        let slots = Arc::new(slots(1));
        let _held = slots.take().await.unwrap();
        let idle = Arc::new(std::sync::Mutex::new(None::<u32>));
        let waiting = tokio::spawn({
            let (slots, idle) = (Arc::clone(&slots), Arc::clone(&idle));
            async move {
                match slots.take_or(|| idle.lock().unwrap().take()).await {
                    Ok(Got::Other(n)) => Some(n),
                    _ => None,
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        *idle.lock().unwrap() = Some(7);
        slots.returned();
        assert_eq!(waiting.await.unwrap(), Some(7));
    }
}
