//! Idle connections make room. At `server.max_connections`, a new client would be turned
//! away while the places are held by connections that ask nothing: ones that never sent a
//! complete request head (a flood of silent connections holds every place for the full
//! `server.header_read_timeout`), and keep-alive connections idle between requests. So a
//! new connection that finds no place closes one of those to take its place: first one
//! idle between requests, then one that never sent a request, each the one that has
//! waited longest. None younger than `server.min_connection_age` is closed, so that a
//! slow but honest client has a few seconds for its request head. A connection with a
//! request in flight is never closed.
//!
//! Each open connection has a [`Presence`]: a request holds it busy ([`Busy`]) from the
//! moment it reaches the service until its response body is dropped. The registry is
//! looked through only when the cap is reached.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::Notify;

use crate::metrics::WaitingLabel;

/// The open client connections, for closing one to make room.
pub struct Room {
    open: Mutex<Open>,
    next: AtomicU64,
    min_age: Duration,
    closed: Family<WaitingLabel, Counter>,
}

struct Open {
    conns: HashMap<u64, Arc<Presence>>,
    /// No connection can have waited the minimum age before this (found by the last look
    /// that found none): until then a flood at the cap costs no look through them all.
    none_before: Option<Instant>,
}

/// One open connection: when it came, whether a request is in flight, since when it
/// waits, and the signal to close it.
pub struct Presence {
    id: u64,
    admitted: Instant,
    in_flight: AtomicUsize,
    /// A request has reached the service.
    served: AtomicBool,
    /// When the last request in flight ended, as nanoseconds after `admitted`.
    idle_since: AtomicU64,
    /// Told to close (to make room).
    closing: AtomicBool,
    close: Notify,
}

/// A connection's place in the [`Room`], given up when dropped (the connection closed).
pub struct Registered {
    room: Arc<Room>,
    presence: Arc<Presence>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.room
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .conns
            .remove(&self.presence.id);
    }
}

impl Registered {
    pub fn presence(&self) -> &Arc<Presence> {
        &self.presence
    }
}

impl Room {
    pub fn new(min_age: Duration, closed: Family<WaitingLabel, Counter>) -> Room {
        Room {
            open: Mutex::new(Open {
                conns: HashMap::new(),
                none_before: None,
            }),
            next: AtomicU64::new(0),
            min_age,
            closed,
        }
    }

    /// A newly admitted connection.
    pub fn register(self: &Arc<Self>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let presence = Arc::new(Presence {
            id,
            admitted: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            close: Notify::new(),
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .conns
            .insert(id, Arc::clone(&presence));
        Registered {
            room: Arc::clone(self),
            presence,
        }
    }

    /// Tells the connection that has waited longest for a request (idle between requests
    /// first) to close, if one has waited at least the minimum age; true if one was told.
    pub fn make_room(&self) -> bool {
        self.make_room_at(Instant::now())
    }

    fn make_room_at(&self, now: Instant) -> bool {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.none_before.is_some_and(|at| now < at) {
            return false;
        }
        // Rarely more than one round: a connection whose request arrived meanwhile is
        // passed over.
        let mut passed: Vec<u64> = Vec::new();
        loop {
            let mut best: Option<((bool, Instant), &Arc<Presence>)> = None;
            let mut earliest: Option<Instant> = None;
            for p in open.conns.values() {
                let Some(waiting) = p.waiting_since() else {
                    continue;
                };
                if now.saturating_duration_since(waiting) < self.min_age {
                    earliest = Some(earliest.map_or(waiting, |e| e.min(waiting)));
                    continue;
                }
                if passed.contains(&p.id) {
                    continue;
                }
                // Idle between requests (`false`) before never served, then the longest
                // waiting.
                let key = (!p.served.load(Ordering::Acquire), waiting);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, p));
                }
            }
            let Some(((never_served, _), p)) = best else {
                // A connection that is busy now waits from the end of its request, later.
                open.none_before = Some(earliest.unwrap_or(now) + self.min_age);
                return false;
            };
            if p.close() {
                let waiting = if never_served {
                    "first_request"
                } else {
                    "next_request"
                };
                self.closed.get_or_create(&WaitingLabel { waiting }).inc();
                open.none_before = None;
                return true;
            }
            passed.push(p.id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .conns
            .len()
    }
}

impl Presence {
    /// Since when it has waited for a request; `None` with one in flight, or closing.
    fn waiting_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 || self.closing.load(Ordering::Acquire) {
            return None;
        }
        let idle = Duration::from_nanos(self.idle_since.load(Ordering::Acquire));
        Some(self.admitted + idle)
    }

    /// Marks it closing, unless a request has just arrived; true if marked.
    fn close(&self) -> bool {
        if self.closing.swap(true, Ordering::AcqRel) {
            return false;
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            self.closing.store(false, Ordering::Release);
            return false;
        }
        self.close.notify_one();
        true
    }

    /// A request has reached the service: the connection is busy until the [`Busy`]
    /// (kept with the response body) is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Release);
        Busy(Arc::clone(self))
    }

    /// Resolves when the connection is to close to make room (and has no request in
    /// flight: one that arrived meanwhile keeps it open).
    pub async fn closing(&self) {
        loop {
            self.close.notified().await;
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            self.closing.store(false, Ordering::Release);
        }
    }
}

/// A request in flight on a connection.
pub struct Busy(Arc<Presence>);

impl Drop for Busy {
    fn drop(&mut self) {
        let p = &self.0;
        let since = u64::try_from(p.admitted.elapsed().as_nanos()).unwrap_or(u64::MAX);
        p.idle_since.store(since, Ordering::Release);
        p.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project! {
    /// A response body that keeps its connection busy until it is dropped.
    pub struct Held<B> {
        #[pin]
        inner: B,
        busy: Busy,
    }
}

impl<B> Held<B> {
    pub fn new(inner: B, busy: Busy) -> Held<B> {
        Held { inner, busy }
    }
}

impl<B: Body<Data = Bytes>> Body for Held<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(min_age: Duration) -> Arc<Room> {
        Arc::new(Room::new(min_age, Family::default()))
    }

    fn closed(room: &Room, waiting: &'static str) -> u64 {
        room.closed.get_or_create(&WaitingLabel { waiting }).get()
    }

    #[test]
    fn idle_between_requests_go_first_then_the_oldest_silent_one() {
        let room = room(Duration::from_secs(3));
        let silent_old = room.register();
        let silent_young = room.register();
        let served = room.register();
        drop(served.presence().busy());
        let busy = room.register();
        let _request = busy.presence().busy();
        let later = Instant::now() + Duration::from_secs(4);
        // Too young, all of them: nothing is closed (and nothing is looked at again
        // before the oldest can be old enough).
        assert!(!room.make_room_at(Instant::now()));
        assert!(room.open.lock().unwrap().none_before.is_some());
        // The one idle between requests first...
        assert!(room.make_room_at(later));
        assert!(served.presence().closing.load(Ordering::Acquire));
        assert_eq!(closed(&room, "next_request"), 1);
        // ...then the silent ones, oldest first; never the one with a request in flight.
        assert!(room.make_room_at(later));
        assert!(silent_old.presence().closing.load(Ordering::Acquire));
        assert!(room.make_room_at(later));
        assert!(silent_young.presence().closing.load(Ordering::Acquire));
        assert!(!room.make_room_at(later));
        assert!(!busy.presence().closing.load(Ordering::Acquire));
        assert_eq!(closed(&room, "first_request"), 2);
        assert_eq!(room.len(), 4);
        drop((silent_old, silent_young, served, busy));
        assert_eq!(room.len(), 0);
    }

    #[tokio::test]
    async fn a_connection_told_to_close_learns_it() {
        let room = room(Duration::ZERO);
        let conn = room.register();
        let presence = Arc::clone(conn.presence());
        let waiting = tokio::spawn(async move { presence.closing().await });
        assert!(room.make_room());
        waiting.await.unwrap();
    }
}
