//! Write coalescing on client connections, without copying.
//!
//! hyper writes a response whenever the body has no frame ready, and the upstream body
//! hands over one frame at a time from the upstream connection's task. Streaming events
//! back to back, that is one `writev` per event (and one read per event at the client),
//! which cost the proxy about 20 times nginx's CPU per event (docs/PERFORMANCE.md).
//!
//! [`Coalesce`] answers a small write with `Pending` once, after waking its own task: the
//! task goes to the back of the run queue, the upstream connection's task runs and hands
//! over the next frame, and the write comes back with more in it. hyper keeps the buffers
//! meanwhile (`Bytes` handles, nothing is copied). A write goes out at once when the
//! previous yield brought nothing new (a lone event waits one scheduler turn, a few
//! microseconds, never a timer), when enough is queued, or after [`MAX_YIELDS`] turns.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Scheduler turns one write may wait for more data.
const MAX_YIELDS: u8 = 8;
/// A write this large goes out at once.
const ENOUGH_BYTES: usize = 32 << 10;
/// hyper's write queue holds 16 buffers, an HTTP/1 chunk is 3 slices: when the queue is
/// nearly full, waiting gains nothing.
const ENOUGH_SLICES: usize = 40;

pin_project! {
    /// Passes reads and writes through; holds small writes back for a scheduler turn.
    pub struct Coalesce<IO> {
        #[pin]
        io: IO,
        // Turns the current write has waited, and its size when it last waited.
        yields: u8,
        seen: usize,
        // The rest of a partly written buffer goes out without waiting.
        write_through: bool,
    }
}

impl<IO> Coalesce<IO> {
    pub fn new(io: IO) -> Coalesce<IO> {
        Coalesce {
            io,
            yields: 0,
            seen: 0,
            write_through: false,
        }
    }
}

/// Whether a write of `len` bytes in `slices` slices should wait one more turn; if so the
/// task has been woken to come back.
fn wait(
    yields: &mut u8,
    seen: &mut usize,
    write_through: bool,
    len: usize,
    slices: usize,
    cx: &Context<'_>,
) -> bool {
    let go = write_through
        || len >= ENOUGH_BYTES
        || slices >= ENOUGH_SLICES
        || *yields >= MAX_YIELDS
        || (*yields > 0 && len == *seen);
    if go {
        *yields = 0;
        *seen = 0;
        return false;
    }
    *yields += 1;
    *seen = len;
    cx.waker().wake_by_ref();
    true
}

impl<IO: AsyncWrite> AsyncWrite for Coalesce<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if wait(
            this.yields,
            this.seen,
            *this.write_through,
            buf.len(),
            1,
            cx,
        ) {
            return Poll::Pending;
        }
        let polled = this.io.poll_write(cx, buf);
        *this.write_through = matches!(polled, Poll::Ready(Ok(n)) if n < buf.len());
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let len = bufs.iter().map(|b| b.len()).sum();
        if wait(
            this.yields,
            this.seen,
            *this.write_through,
            len,
            bufs.len(),
            cx,
        ) {
            return Poll::Pending;
        }
        let polled = this.io.poll_write_vectored(cx, bufs);
        *this.write_through = matches!(polled, Poll::Ready(Ok(n)) if n < len);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
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
    async fn bytes_pass_unchanged_and_a_lone_write_goes_out() {
        let (mut client, server) = duplex(1 << 16);
        let mut io = Coalesce::new(server);
        io.write_all(b"data: one\n\n").await.unwrap();
        let slices = [IoSlice::new(b"data: "), IoSlice::new(b"two\n\n")];
        let n = io.write_vectored(&slices).await.unwrap();
        assert_eq!(n, 11);
        let mut got = vec![0u8; 22];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"data: one\n\ndata: two\n\n");
    }

    #[test]
    fn waits_while_the_write_grows_and_not_longer() {
        let cx = Context::from_waker(std::task::Waker::noop());
        let (mut yields, mut seen) = (0, 0);
        assert!(
            wait(&mut yields, &mut seen, false, 100, 3, &cx),
            "first turn waits"
        );
        assert!(
            wait(&mut yields, &mut seen, false, 200, 6, &cx),
            "it grew: wait again"
        );
        assert!(
            !wait(&mut yields, &mut seen, false, 200, 6, &cx),
            "nothing new: go"
        );
        assert_eq!((yields, seen), (0, 0));
        assert!(
            !wait(&mut yields, &mut seen, true, 10, 1, &cx),
            "a partial write's rest goes"
        );
        assert!(!wait(&mut yields, &mut seen, false, ENOUGH_BYTES, 1, &cx));
        assert!(!wait(&mut yields, &mut seen, false, 10, ENOUGH_SLICES, &cx));
        let mut len = 1;
        while wait(&mut yields, &mut seen, false, len, 1, &cx) {
            len += 1;
        }
        assert_eq!(len, usize::from(MAX_YIELDS) + 1, "bounded by MAX_YIELDS");
    }
}
