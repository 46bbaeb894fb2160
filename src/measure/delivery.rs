//! What reached the client: a per-connection record of when the server's write buffer
//! was last flushed, so that a response body can tell whether the frames it handed over
//! have left the proxy.
//!
//! hyper's servers drop what they still hold when a body fails: HTTP/1 closes the
//! connection with the write buffer unsent, HTTP/2's reset clears the stream's send queue.
//! An upstream that sends its last event and ends the connection at once would lose that
//! event (and on HTTP/1 even the response head) at the client. The measured body therefore
//! holds an upstream failure back until the connection has flushed what it was given
//! before, and counts as delivered only the bytes a flush has carried.
//!
//! When a frame handed to the server has left the proxy:
//! - HTTP/1: once a flush completed after the body was polled again. The connection and
//!   the body run in one task, and hyper writes a frame to its buffer before it asks the
//!   body for more; it flushes its I/O only once that buffer is empty.
//! - HTTP/2: once a connection poll that *began* after the body was polled again ended
//!   with a completed flush (no write attempted after it, not even one the coalescing
//!   I/O held back). The body runs in a task of its own and
//!   queues frames on the stream; the connection moves them to its codec in each poll and
//!   flushes at the end, so a flush in a poll already under way may have missed the frame,
//!   and so may a flush in the middle of a poll (h2 flushes a full codec buffer before it
//!   takes the next frames off the streams' queues): a reset sent then would clear a frame
//!   still queued. After a poll that ended flushed, every frame queued before it began is
//!   on the socket, ahead of any reset.
//!
//! Per connection poll this costs one counter increment, per completed flush two stores
//! and a load, all plain ones: only the connection's task writes the counters. Waiting
//! bodies are woken only when one is waiting. A flush that misses a body arming itself on
//! another thread (HTTP/2) is followed by another: the body then wakes the connection
//! ([`Delivery::nudge`]), and that wake orders its arming before the next flush's look.

use std::{
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
};

/// One per client connection, shared by the connection (which counts polls and flushes)
/// and the bodies of the responses it carries (which wait on it).
#[derive(Debug, Default)]
pub struct Delivery {
    /// Connection polls begun.
    polls: AtomicU64,
    /// Flushes completed.
    flushes: AtomicU64,
    /// The last poll that ended with a completed flush (see the module doc).
    flushed_in: AtomicU64,
    /// The current poll's last I/O was a completed flush. The connection's task only.
    flush_last: AtomicBool,
    /// Some body waits for a flush: `flushed` must wake `waiting`.
    armed: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
    /// The connection's task, for an HTTP/2 body that needs one more poll of it.
    connection: Mutex<Option<Waker>>,
    /// A request has reached the service on this connection (a graceful shutdown of an
    /// HTTP/1 connection waits for the first one, see `proxy::server`).
    served: AtomicBool,
}

/// A point in a connection's life: what a body handed over before it is delivered once
/// [`Delivery::flushed_since`] it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// HTTP/1: the flushes completed so far.
    Flushes(u64),
    /// HTTP/2: the connection polls begun so far.
    Polls(u64),
}

impl Delivery {
    pub fn new() -> Delivery {
        Delivery::default()
    }

    /// A request has reached the service.
    pub fn request_begins(&self) {
        self.served.store(true, Ordering::Relaxed);
    }

    /// Whether a request has reached the service.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    /// The connection is about to be polled. Called by the connection's task only.
    pub fn poll_begins(&self) {
        let polls = self.polls.load(Ordering::Relaxed);
        self.polls.store(polls + 1, Ordering::Release);
    }

    /// The task that polls the connection (set when it changes, not per poll).
    pub fn connection_task(&self, waker: Waker) {
        *self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(waker);
    }

    /// Has the connection polled once more. An HTTP/2 body that waits for a flush in a
    /// poll begun after its mark needs one: the poll that carried its frame may have begun
    /// just before the mark, and nothing else may wake the connection. The wake also
    /// orders the body's arming before that poll's flush, which then wakes it.
    pub fn nudge(&self) {
        if let Some(task) = &*self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            task.wake_by_ref();
        }
    }

    /// The connection's I/O completed a flush: everything the server had written is on
    /// the socket. Called by the connection's task only (its I/O flushes).
    pub fn flushed(&self) {
        self.flush_last.store(true, Ordering::Relaxed);
        let flushes = self.flushes.load(Ordering::Relaxed);
        self.flushes.store(flushes + 1, Ordering::Release);
        if self.armed.load(Ordering::Acquire) {
            self.wake_all();
        }
    }

    /// The connection's I/O was handed bytes to write (taken, partly taken, or held back
    /// for coalescing) or could not complete a flush: a flush before it no longer ends
    /// the poll. A held-back write matters most: h2 may have flushed once in the poll
    /// (a chained DATA frame fills its codec), then had its next write held back and
    /// returned with frames still in the streams' queues, where a reset would clear them.
    /// Called by the connection's task only.
    pub fn writing(&self) {
        self.flush_last.store(false, Ordering::Relaxed);
    }

    /// The connection's poll has returned. If its last I/O was a completed flush, every
    /// HTTP/2 frame queued before the poll began is on the socket. Called by the
    /// connection's task only.
    pub fn poll_ends(&self) {
        if !self.flush_last.swap(false, Ordering::Relaxed) {
            return;
        }
        self.flushed_in
            .store(self.polls.load(Ordering::Relaxed), Ordering::Release);
        if self.armed.load(Ordering::Acquire) {
            self.wake_all();
        }
    }

    /// Now: call it when the body is polled again after handing a frame over.
    pub fn mark(&self, http2: bool) -> Mark {
        if http2 {
            Mark::Polls(self.polls.load(Ordering::Acquire))
        } else {
            Mark::Flushes(self.flushes.load(Ordering::Acquire))
        }
    }

    /// Whether what was handed over before `mark` has been flushed (see the module doc).
    pub fn flushed_since(&self, mark: Mark) -> bool {
        match mark {
            Mark::Flushes(n) => self.flushes.load(Ordering::Acquire) > n,
            Mark::Polls(p) => self.flushed_in.load(Ordering::Acquire) > p,
        }
    }

    /// Ready once [`Delivery::flushed_since`] `mark`; until then the task is woken by
    /// the next flush.
    pub fn poll_flushed_since(&self, cx: &Context<'_>, mark: Mark) -> Poll<()> {
        if self.flushed_since(mark) {
            return Poll::Ready(());
        }
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
            self.armed.store(true, Ordering::SeqCst);
        }
        // A flush between the first check and arming would have found nobody to wake.
        if self.flushed_since(mark) {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    fn wake_all(&self) {
        let woken = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            self.armed.store(false, Ordering::SeqCst);
            std::mem::take(&mut *waiting)
        };
        for waker in woken {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn http2_counts_only_a_poll_begun_after_the_mark_that_ended_flushed() {
        let d = Delivery::new();
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let cx = Context::from_waker(&waker);
        d.poll_begins();
        let mark = d.mark(true);
        // A flush in the poll the mark was taken in may have missed the frame.
        d.writing();
        d.flushed();
        d.poll_ends();
        assert!(d.poll_flushed_since(&cx, mark).is_pending());
        // A poll without a flush (a held write) delivers nothing either.
        d.poll_begins();
        d.writing();
        d.poll_ends();
        assert!(!d.flushed_since(mark));
        // Nor one that flushed a full codec buffer and then wrote the frames it took off
        // the streams' queues after it, without flushing again.
        d.poll_begins();
        d.writing();
        d.flushed();
        d.writing();
        d.poll_ends();
        // The mid-poll flush woke the body (as every flush does while one waits): polled
        // again, it is still not delivered and waits on.
        assert!(d.poll_flushed_since(&cx, mark).is_pending());
        let woken = count.0.load(Ordering::SeqCst);
        // One that ends with a completed flush does, and wakes the waiter.
        d.poll_begins();
        d.writing();
        d.flushed();
        d.poll_ends();
        assert!(
            count.0.load(Ordering::SeqCst) > woken,
            "the poll's end wakes the waiter"
        );
        assert!(d.poll_flushed_since(&cx, mark).is_ready());
        // Nobody waits now: a flush wakes no one.
        let woken = count.0.load(Ordering::SeqCst);
        d.poll_begins();
        d.flushed();
        d.poll_ends();
        assert_eq!(count.0.load(Ordering::SeqCst), woken);
    }

    #[test]
    fn http1_counts_any_flush_after_the_mark() {
        let d = Delivery::new();
        d.poll_begins();
        d.flushed();
        let mark = d.mark(false);
        assert!(!d.flushed_since(mark));
        // The same poll: connection and body share a task, the frame was buffered first.
        d.flushed();
        assert!(d.flushed_since(mark));
    }

    #[test]
    fn a_nudge_wakes_the_connection_task() {
        let d = Delivery::new();
        d.nudge();
        let count = Arc::new(Count::default());
        d.connection_task(Waker::from(Arc::clone(&count)));
        d.nudge();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn every_waiting_body_is_woken_once() {
        let d = Delivery::new();
        let counts: Vec<_> = (0..3).map(|_| Arc::new(Count::default())).collect();
        let mark = d.mark(true);
        for c in &counts {
            let waker = Waker::from(Arc::clone(c));
            let cx = Context::from_waker(&waker);
            // Polled twice: registered once.
            assert!(d.poll_flushed_since(&cx, mark).is_pending());
            assert!(d.poll_flushed_since(&cx, mark).is_pending());
        }
        d.poll_begins();
        d.flushed();
        d.poll_ends();
        for c in &counts {
            assert!(d.flushed_since(mark));
            assert!(c.0.load(Ordering::SeqCst) >= 1);
        }
    }
}
