//! Write coalescing on client connections, without copying.
//!
//! hyper writes a response whenever the body has no frame ready. Streaming events back
//! to back, that can be one `writev` per event (and one read per event at the client),
//! which cost the proxy about 20 times nginx's CPU per event (docs/PERFORMANCE.md).
//!
//! While a connection is in a burst (its previous write went out less than [`BURST_GAP`]
//! ago), [`Coalesce`] answers a small write with `Pending` after waking its own task: the
//! task goes to the back of the run queue, what the upstream sends meanwhile arrives (read
//! by the response body itself on a plain HTTP/1 upstream, handed over by the pooled
//! client's connection task otherwise), and the write comes back with more in it. hyper
//! keeps what it has meanwhile, in its one write buffer (`server.rs` says why flat rather
//! than a queue of the body's buffers). The write goes out
//! once a turn brought nothing new, enough is queued, or after [`MAX_YIELDS`] turns; never
//! on a timer.
//!
//! Outside a burst a write goes out at once: a lone event (tokens tens of milliseconds
//! apart, the usual LLM stream) gains nothing from waiting, and a yield costs a wake-up of
//! an idle worker thread (tokio notifies one for every yielded task), tens of microseconds
//! of added latency per event on a small VM.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::measure::Delivery;

/// A write starting this soon after the previous one is part of a burst: events are
/// arriving back to back (a benchmark, a fast speculative decoder, many tokens per read),
/// not a few per second per stream as LLM tokens normally do.
const BURST_GAP: Duration = Duration::from_millis(2);
/// Scheduler turns one write may wait for more data (each brings at most one more frame).
const MAX_YIELDS: u8 = 15;
/// A write this large goes out at once.
const ENOUGH_BYTES: usize = 32 << 10;
/// A vectored write of this many slices goes out at once (a writer that queues buffers:
/// hyper's queue holds 16, an HTTP/1 chunk is 3 slices).
const ENOUGH_SLICES: usize = 45;

pin_project! {
    /// Passes reads and writes through; holds small writes back for a scheduler turn
    /// while the connection is in a burst. Completed flushes are noted in `delivery`.
    pub struct Coalesce<IO> {
        #[pin]
        io: IO,
        pacing: Pacing,
        delivery: Arc<Delivery>,
    }
}

impl<IO> Coalesce<IO> {
    pub fn new(io: IO, delivery: Arc<Delivery>) -> Coalesce<IO> {
        Coalesce {
            io,
            pacing: Pacing::default(),
            delivery,
        }
    }
}

/// When to let a write go.
#[derive(Debug, Default)]
struct Pacing {
    /// When the previous write went out.
    last_write: Option<Instant>,
    /// Turns the current write has waited, and its size when it last waited.
    yields: u8,
    seen: usize,
    /// The rest of a partly written buffer goes out without waiting.
    write_through: bool,
}

impl Pacing {
    /// Whether the write starting now is part of a burst. Only a write's first attempt
    /// reads the clock (one read per write, never per event).
    fn in_burst(&self) -> bool {
        self.yields > 0 || self.last_write.is_some_and(|t| t.elapsed() < BURST_GAP)
    }

    /// Whether a write of `len` bytes in `slices` slices should wait one more turn; if so
    /// the task has been woken to come back.
    fn wait(&mut self, len: usize, slices: usize, cx: &Context<'_>) -> bool {
        let go = self.write_through
            || len >= ENOUGH_BYTES
            || slices >= ENOUGH_SLICES
            || self.yields >= MAX_YIELDS
            || (self.yields > 0 && len == self.seen)
            || !self.in_burst();
        if go {
            self.yields = 0;
            self.seen = 0;
            return false;
        }
        self.yields += 1;
        self.seen = len;
        cx.waker().wake_by_ref();
        true
    }

    fn wrote(&mut self, polled: &Poll<io::Result<usize>>, len: usize) {
        if let Poll::Ready(Ok(n)) = polled {
            self.write_through = *n < len;
            self.last_write = Some(Instant::now());
        }
    }
}

impl<IO: AsyncWrite> AsyncWrite for Coalesce<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if !buf.is_empty() {
            this.delivery.writing();
        }
        if this.pacing.wait(buf.len(), 1, cx) {
            return Poll::Pending;
        }
        let polled = this.io.poll_write(cx, buf);
        this.pacing.wrote(&polled, buf.len());
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let len = bufs.iter().map(|b| b.len()).sum();
        if len > 0 {
            this.delivery.writing();
        }
        if this.pacing.wait(len, bufs.len(), cx) {
            return Poll::Pending;
        }
        let polled = this.io.poll_write_vectored(cx, bufs);
        this.pacing.wrote(&polled, len);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    /// The server flushes its I/O once its own buffer is empty: what it was given is on
    /// the socket (or in TLS's buffer, which the inner flush empties).
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let flushed = this.io.poll_flush(cx);
        match flushed {
            Poll::Ready(Ok(())) => this.delivery.flushed(),
            // Bytes still wait below (TLS's buffer): not a flush that ends a poll.
            _ => this.delivery.writing(),
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

impl<IO: AsyncRead> AsyncRead for Coalesce<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    #[tokio::test]
    async fn bytes_pass_unchanged_and_burst_writes_go_out() {
        let (mut client, server) = duplex(1 << 16);
        let mut io = Coalesce::new(server, Arc::default());
        io.write_all(b"data: one\n\n").await.unwrap();
        // Right after a write: a burst, so this one waits a turn, then goes.
        let slices = [IoSlice::new(b"data: "), IoSlice::new(b"two\n\n")];
        let n = io.write_vectored(&slices).await.unwrap();
        assert_eq!(n, 11);
        let mut got = vec![0u8; 22];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"data: one\n\ndata: two\n\n");
    }

    fn in_burst() -> Pacing {
        Pacing {
            last_write: Some(Instant::now()),
            ..Pacing::default()
        }
    }

    #[test]
    fn a_lone_write_goes_at_once() {
        let cx = Context::from_waker(std::task::Waker::noop());
        assert!(!Pacing::default().wait(100, 3, &cx), "first write");
        let idle = Pacing {
            last_write: Instant::now().checked_sub(BURST_GAP * 2),
            ..Pacing::default()
        };
        assert!(!idle.in_burst());
    }

    #[test]
    fn in_a_burst_it_waits_while_the_write_grows_and_not_longer() {
        let cx = Context::from_waker(std::task::Waker::noop());
        let mut p = in_burst();
        assert!(p.wait(100, 3, &cx), "first turn waits");
        assert!(p.wait(200, 6, &cx), "it grew: wait again");
        assert!(!p.wait(200, 6, &cx), "nothing new: go");
        assert_eq!((p.yields, p.seen), (0, 0));
        assert!(!in_burst().wait(ENOUGH_BYTES, 1, &cx));
        assert!(!in_burst().wait(10, ENOUGH_SLICES, &cx));
        let mut partial = in_burst();
        partial.write_through = true;
        assert!(
            !partial.wait(10, 1, &cx),
            "the rest of a partial write goes"
        );
        let mut p = in_burst();
        let mut len = 1;
        while p.wait(len, 1, &cx) {
            len += 1;
        }
        assert_eq!(len, usize::from(MAX_YIELDS) + 1, "bounded by MAX_YIELDS");
    }

    /// h2 can flush a full codec buffer in mid-poll, then have its next write held back
    /// here and return with frames still queued on their streams: that poll must not
    /// count as having ended flushed, or a reset sent next would clear those frames.
    #[test]
    fn a_write_held_back_after_a_flush_keeps_the_poll_from_counting_as_flushed() {
        let (_client, server) = duplex(1 << 16);
        let delivery = Arc::new(Delivery::new());
        let mut io = std::pin::pin!(Coalesce::new(server, Arc::clone(&delivery)));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        delivery.poll_begins();
        let mark = delivery.mark(true);
        delivery.poll_ends();
        delivery.poll_begins();
        let first = io.as_mut().poll_write(&mut cx, b"data: one\n\n");
        assert!(matches!(first, Poll::Ready(Ok(11))));
        assert!(io.as_mut().poll_flush(&mut cx).is_ready());
        let held = io.as_mut().poll_write(&mut cx, b"data: two\n\n");
        assert!(
            held.is_pending(),
            "a write right after another is held back"
        );
        delivery.poll_ends();
        assert!(!delivery.flushed_since(mark), "bytes are still held back");
        // The next poll writes them and flushes: now it counts.
        delivery.poll_begins();
        assert!(io.as_mut().poll_write(&mut cx, b"data: two\n\n").is_ready());
        assert!(io.as_mut().poll_flush(&mut cx).is_ready());
        delivery.poll_ends();
        assert!(delivery.flushed_since(mark));
    }
}
