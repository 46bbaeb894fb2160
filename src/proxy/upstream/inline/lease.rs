//! What a response holds of the upstream while its body streams ([`Lease`]), and how it
//! is given back: an inline connection returns to the pool (or is closed and counted),
//! a slot of hyper's client is released.

use super::*;

/// What a response holds of the upstream while its body streams: an inline connection on
/// loan (the body drives it and hands it back), or, on hyper's client, a slot of the
/// upstream budget.
pub struct Lease(pub(super) Held);

#[expect(
    clippy::large_enum_variant,
    reason = "the connection was held inline before the slot variant came; boxing it would \
              cost an allocation per request to save room only on hyper's client path"
)]
pub(super) enum Held {
    Conn {
        conn: Conn,
        pool: Arc<Pool>,
    },
    /// A relayed response: its body holds the connection; the lease only carries the
    /// connection's read clock.
    Relay(Arc<ReadClock>),
    /// Held only to be given back when dropped: the connection budget's slot and the
    /// request's place on its HTTP/2 lane.
    Slot(
        #[expect(dead_code, reason = "held for its Drop")] Slot,
        #[expect(dead_code, reason = "held for its Drop")] StreamHold,
    ),
}

impl Lease {
    /// A request on hyper's client: the slot and the lane's place are given back with the
    /// response body.
    pub fn slot(slot: Slot, stream: StreamHold) -> Lease {
        Lease(Held::Slot(slot, stream))
    }

    /// When the connection last read (inline connections): frames of the response are
    /// stamped with it.
    pub fn reads(&self) -> Option<Arc<ReadClock>> {
        match &self.0 {
            Held::Conn { conn, .. } => Some(Arc::clone(&conn.reads)),
            Held::Relay(reads) => Some(Arc::clone(reads)),
            Held::Slot(..) => None,
        }
    }

    /// Drives the connection, then polls the response body (`then`), so that the body's
    /// next bytes can arrive.
    pub fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut then: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        match &mut self.0 {
            Held::Conn { conn, .. } => conn.poll_with(cx, then),
            Held::Relay(_) | Held::Slot(..) => then(cx),
        }
    }

    /// The response body has ended: the connection goes back to the pool if it can carry
    /// another request, and is closed otherwise; a slot is given back.
    pub fn release(self) {
        if let Held::Conn { mut conn, pool } = self.0 {
            conn.nudge.forget();
            match conn.idle_state() {
                Quiet::Silent => pool.put(Pooled::Hyper(conn)),
                Quiet::Unsolicited => pool.closed(Closed::UnsolicitedBytes),
                // Every close is counted: a connection replaced here frees its slot for
                // a new one at once.
                Quiet::Closed if conn.driver.is_none() => pool.closed(Closed::ByUpstream),
                Quiet::Closed => pool.closed(Closed::NotReusable),
            }
        }
    }
}
