//! Sockets whose reads carry the kernel's receive timestamp.
//!
//! The time the proxy reads bytes lags the time their packet arrived by however long the
//! task took to be scheduled and to get to the read: under load, milliseconds. On Linux,
//! `SO_TIMESTAMPING` with software receive stamps makes the kernel note when each packet
//! reached the network stack, and `recvmsg` hands that time over with the bytes (the
//! stamp of the last packet the read took data from: the time the bytes were complete).
//! [`WireStream`] reads this way and notes each read's stamp in a [`ReadClock`]; where
//! the option cannot be set (another platform, another kind of socket) it reads as usual
//! and stamps reads with the process clock. The kernel turns stamping on in deferred work
//! when the first socket asks for it, so the first packets after start may come without a
//! stamp; those reads are stamped with the process clock too (and the record says `user`).
//!
//! One limit is the kernel's: packets that wait in a socket's receive queue are merged
//! (TCP receive coalescing), and the merged buffer keeps the newest packet's stamp. When
//! the proxy gets to a socket only after the next event has come too, the read's earlier
//! bytes carry the later arrival; such a read is late by how long the proxy was kept
//! from it, as a process-clock read would be (looking at the first packet with
//! `MSG_PEEK` does not help: the merge already dropped its stamp).
//!
//! The read itself stays one system call; the cost is the control message, a second
//! clock read to carry the wall-clock stamp onto the monotonic clock, and zeroing the part
//! of the buffer a read may fill (a safe `recvmsg` needs initialised memory). So that a
//! stream of small events does not zero a large buffer for every few hundred bytes, a
//! read offers room for twice what the last one took, from [`MIN_CHUNK`] up to
//! [`READ_CHUNK`]: a large body takes a few more reads while the size doubles
//! (docs/PERFORMANCE.md has the measurements).

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, ReadBuf},
    net::TcpStream,
};

use crate::measure::ReadClock;

/// The most one stamped read takes. Streamed events are far smaller; a large body takes a
/// few more reads.
pub const READ_CHUNK: usize = 16 * 1024;

/// The least room one stamped read offers.
pub const MIN_CHUNK: usize = 1024;

/// The room the next read offers after one that took `got` bytes: twice that (so a full
/// read doubles it), within [`MIN_CHUNK`]..=[`READ_CHUNK`].
fn next_chunk(got: usize) -> usize {
    got.saturating_mul(2).clamp(MIN_CHUNK, READ_CHUNK)
}

/// Whether new sockets ask the kernel for receive stamps (`measure.kernel_timestamps`,
/// on unless configured off at start). Off, every read is an ordinary one stamped by the
/// process clock.
static KERNEL_STAMPS: AtomicBool = AtomicBool::new(true);

/// Turns kernel receive stamps on or off for sockets made from now on.
pub fn kernel_timestamps(on: bool) {
    KERNEL_STAMPS.store(on, Ordering::Relaxed);
}

/// A TCP stream that notes when each read's bytes arrived (see the module doc).
#[derive(Debug)]
pub struct WireStream {
    io: TcpStream,
    reads: Arc<ReadClock>,
    /// Room for the timestamping control message, made once per connection; empty when
    /// the kernel gives no stamps on this socket.
    cmsg: Vec<u8>,
    /// The most the next stamped read takes ([`next_chunk`]).
    chunk: usize,
    /// Look before zeroing room for a stamped read after one that drained the socket
    /// ([`WireStream::probing`]).
    probe: bool,
    /// The last stamped read took less than it offered room for.
    drained: bool,
}

impl WireStream {
    /// Asks the kernel for receive stamps on `io`; reads are noted in `reads`.
    pub fn new(io: TcpStream, reads: Arc<ReadClock>) -> WireStream {
        let cmsg = if KERNEL_STAMPS.load(Ordering::Relaxed) {
            imp::enable(&io).unwrap_or_default()
        } else {
            Vec::new()
        };
        WireStream {
            io,
            reads,
            cmsg,
            chunk: MIN_CHUNK,
            probe: false,
            drained: false,
        }
    }

    /// After a stamped read that drained the socket, the next one first peeks at one byte
    /// (into a byte of its own) before it zeroes the caller's room. hyper's server reads on
    /// while a response streams, to notice the client closing, into a fresh 8 KiB buffer
    /// (the request's bytes still hold the first): zeroed and left waiting, that buffer's
    /// page would stay resident for the whole stream. The cost is one more system call
    /// when the next bytes come after such a read (on a client connection: once per
    /// request), so upstream connections, whose events each follow a drained read, do
    /// without it.
    pub fn probing(mut self) -> WireStream {
        self.probe = true;
        self
    }

    /// Whether reads carry the kernel's stamps.
    #[cfg(test)]
    pub fn kernel_stamps(&self) -> bool {
        !self.cmsg.is_empty()
    }

    #[cfg(test)]
    pub fn reads(&self) -> &Arc<ReadClock> {
        &self.reads
    }

    /// Resolves once the socket has something to read (or has closed).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.poll_read_ready(cx)
    }

    /// The room the next read should offer: twice what the last read took, within
    /// [`MIN_CHUNK`]..=[`READ_CHUNK`] (what a stamped read takes at most).
    pub fn next_read(&self) -> usize {
        self.chunk
    }

    /// What an idle connection holds: nothing to read (a read attempt would block), its
    /// end (FIN, or an error such as RST), or bytes nobody asked for. The attempt takes at
    /// most one byte off the socket; a connection that is not `Silent` is not reused.
    pub fn idle_state(&self) -> Quiet {
        let mut one = [0u8; 1];
        match self.io.try_read(&mut one) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Quiet::Silent,
            Ok(0) | Err(_) => Quiet::Closed,
            Ok(_) => Quiet::Unsolicited,
        }
    }

    /// Receives into `buf` without taking the bytes off the socket (no stamp).
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.peek(buf).await
    }
}

/// What an idle connection was found holding ([`WireStream::idle_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quiet {
    /// Open, nothing to read: it may carry the next request.
    Silent,
    /// The peer closed it (FIN) or it failed (RST).
    Closed,
    /// The peer sent bytes while no request was outstanding.
    Unsolicited,
}

impl AsyncRead for WireStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.cmsg.is_empty() || buf.remaining() == 0 {
            let before = buf.filled().len();
            let read = Pin::new(&mut this.io).poll_read(cx, buf);
            if let Poll::Ready(Ok(())) = read {
                this.chunk = next_chunk(buf.filled().len() - before);
                this.reads.stamp();
            }
            return read;
        }
        loop {
            std::task::ready!(this.io.poll_read_ready(cx))?;
            if this.probe && this.drained {
                let mut one = [0u8; 1];
                std::task::ready!(this.io.poll_peek(cx, &mut ReadBuf::new(&mut one)))?;
                this.drained = false;
            }
            let cmsg = &mut this.cmsg;
            let want = buf.remaining().min(this.chunk);
            let dst = buf.initialize_unfilled_to(want);
            let got = this.io.try_io(tokio::io::Interest::READABLE, || {
                imp::recv(&this.io, dst, cmsg)
            });
            match got {
                Ok((n, stamp)) => {
                    buf.advance(n);
                    this.chunk = next_chunk(n);
                    this.drained = n < want;
                    // Bytes, or the end of the stream (no packet, so no stamp): now.
                    match stamp {
                        Some(wall) => this.reads.stamp_kernel(wall),
                        None => this.reads.stamp(),
                    }
                    return Poll::Ready(Ok(()));
                }
                // Readiness was cleared: wait for the next.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

write_through!(impl [] for WireStream, |this| std::pin::Pin::new(&mut this.get_mut().io));

#[cfg(target_os = "linux")]
mod imp {
    use std::{io, os::fd::AsRawFd, time::Duration};

    use nix::sys::socket::{
        ControlMessageOwned, MsgFlags, TimestampingFlag, recvmsg, setsockopt, sockopt,
    };
    use tokio::net::TcpStream;

    /// Turns on software receive stamps; the control-message room to read them with.
    pub fn enable(io: &TcpStream) -> io::Result<Vec<u8>> {
        let flags = TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE
            | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE;
        setsockopt(io, sockopt::Timestamping, &flags)?;
        Ok(nix::cmsg_space!(nix::sys::socket::Timestamps))
    }

    /// One `recvmsg` into `dst`: the bytes read and the software receive stamp (since the
    /// Unix epoch) when one came.
    pub fn recv(
        io: &TcpStream,
        dst: &mut [u8],
        cmsg: &mut [u8],
    ) -> io::Result<(usize, Option<Duration>)> {
        let mut iov = [io::IoSliceMut::new(dst)];
        let msg = recvmsg::<()>(io.as_raw_fd(), &mut iov, Some(cmsg), MsgFlags::empty())?;
        let mut stamp = None;
        // A truncated control message (ENOBUFS) only loses the stamp, not the bytes.
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmTimestampsns(ts) = c {
                    let (s, ns) = (ts.system.tv_sec(), ts.system.tv_nsec());
                    if s > 0 || ns > 0 {
                        stamp = Some(Duration::new(
                            u64::try_from(s).unwrap_or(0),
                            u32::try_from(ns).unwrap_or(0),
                        ));
                    }
                }
            }
        }
        Ok((msg.bytes, stamp))
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::{io, time::Duration};

    use tokio::net::TcpStream;

    pub fn enable(_: &TcpStream) -> io::Result<Vec<u8>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    pub fn recv(
        _: &TcpStream,
        _: &mut [u8],
        _: &mut [u8],
    ) -> io::Result<(usize, Option<Duration>)> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::measure::Clock;

    async fn pair() -> (TcpStream, TcpStream) {
        kernel_timestamps(true);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn reads_carry_the_packets_arrival_not_the_reads_time() {
        let (mut client, server) = pair().await;
        let mut wire = WireStream::new(server, Arc::new(ReadClock::new()));
        if !cfg!(target_os = "linux") {
            assert!(!wire.kernel_stamps());
            return;
        }
        assert!(wire.kernel_stamps());
        // The kernel switches receive stamping on (a static key) in deferred work when
        // the first socket asks: packets that came before that have no stamp. Exchange
        // bytes until one is stamped.
        let mut one = [0u8; 1];
        for _ in 0..10_000 {
            client.write_all(b"x").await.unwrap();
            wire.read_exact(&mut one).await.unwrap();
            if wire.reads().latest_read().unwrap().1 == Clock::Kernel {
                break;
            }
            tokio::task::yield_now().await;
        }
        let sent = Instant::now();
        // On loopback the packet is in the receive queue once the write returns.
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let written = Instant::now();
        // The proxy gets to the read late (a busy worker): the stamp must not move.
        std::thread::sleep(Duration::from_millis(30));
        let mut buf = [0u8; 64];
        let n = wire.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");
        let (at, how) = wire.reads().latest_read().unwrap();
        assert_eq!(how, Clock::Kernel);
        // The stamp is taken inside the write; carried onto the monotonic clock it can
        // only come out earlier (by a preemption between the two clock reads), never later.
        assert!(
            at + Duration::from_millis(25) >= sent && at <= written + Duration::from_millis(1),
            "stamp {at:?} outside the write {sent:?}..{written:?}"
        );
    }

    /// After a read that drained the socket, a probing stream zeroes no room until bytes
    /// come (hyper's end-of-stream read into a fresh buffer stays untouched); the other
    /// zeroes the room it offers before it finds nothing.
    #[tokio::test]
    async fn a_probing_stream_leaves_the_room_untouched_while_nothing_comes() {
        for probing in [false, true] {
            let (mut client, server) = pair().await;
            let wire = WireStream::new(server, Arc::new(ReadClock::new()));
            let mut wire = if probing { wire.probing() } else { wire };
            if !wire.kernel_stamps() {
                return;
            }
            client.write_all(b"request").await.unwrap();
            let mut buf = [0u8; 64];
            let n = wire.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"request");
            let mut room = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut next = ReadBuf::uninit(&mut room);
            let polled = std::future::poll_fn(|cx| {
                Poll::Ready(Pin::new(&mut wire).poll_read(cx, &mut next))
            })
            .await;
            assert!(polled.is_pending());
            let zeroed = next.initialized().len();
            assert_eq!(
                zeroed,
                if probing { 0 } else { MIN_CHUNK },
                "probing {probing}"
            );
            // Bytes then come and are read as ever.
            client.write_all(b"next request").await.unwrap();
            let n = wire.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"next request");
            client.shutdown().await.unwrap();
            assert_eq!(wire.read(&mut buf).await.unwrap(), 0);
        }
    }

    #[test]
    fn the_read_size_follows_what_reads_take() {
        assert_eq!(next_chunk(0), MIN_CHUNK);
        assert_eq!(next_chunk(300), MIN_CHUNK);
        assert_eq!(next_chunk(MIN_CHUNK), 2 * MIN_CHUNK);
        assert_eq!(next_chunk(3000), 6000);
        assert_eq!(next_chunk(READ_CHUNK), READ_CHUNK);
        assert_eq!(next_chunk(usize::MAX), READ_CHUNK);
    }

    #[tokio::test]
    async fn bytes_pass_unchanged_across_small_reads_and_the_end_is_stamped() {
        let (mut client, server) = pair().await;
        let mut wire = WireStream::new(server, Arc::new(ReadClock::new()));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        wire.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, data);
        // The end of the stream came with no packet to stamp: the process clock.
        assert_eq!(wire.reads().latest_read().unwrap().1, Clock::User);
        // Writes pass through.
        let (mut client, server) = pair().await;
        let mut wire = WireStream::new(server, Arc::new(ReadClock::new()));
        wire.write_all(b"pong").await.unwrap();
        let mut buf = [0u8; 4];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
    }
}
