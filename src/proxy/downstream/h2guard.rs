//! A rate limit on the HTTP/2 control frames a client sends: `PING`s and `SETTINGS`
//! (acknowledgements aside). h2 answers each one before it reads the next frame, so a
//! flood costs no memory here, but every frame costs a wake, a parse and a write: a
//! client that reads its answers could keep a core busy within its own bandwidth. Past
//! `server.http2_max_control_frames_per_second` (a bucket that holds one second's worth)
//! the connection is closed, and counted in
//! `goodput_limit_rejections_total{limit="server.http2_max_control_frames_per_second"}`.
//!
//! The guard reads nothing itself: it looks at the bytes hyper reads, following the frame
//! headers (9 bytes each) past their payloads. A connection that does not open with the
//! HTTP/2 preface (HTTP/1 over TLS) is passed through from its first bytes on.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use prometheus_client::metrics::counter::Counter;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Instant,
};

use super::first_bytes::H2_PREFACE;

/// The limit's config key, which is also its label in `goodput_limit_rejections_total`.
pub const LIMIT: &str = "server.http2_max_control_frames_per_second";

const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

/// The error a flooding connection's read ends with.
#[derive(Debug, thiserror::Error)]
#[error("HTTP/2 control frames past {LIMIT} ({0} a second)")]
pub struct ControlFlood(u32);

/// Where the scan is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// This many bytes of the preface seen.
    Preface(usize),
    /// This many bytes of a frame header seen.
    Header(usize),
    /// This many payload bytes still to skip.
    Payload(u32),
    /// Not HTTP/2, or already over the limit: nothing more to look at.
    Off,
}

/// Up to `rate` control frames at once, refilled at `rate` a second.
#[derive(Debug)]
struct Bucket {
    rate: u32,
    tokens: f64,
    at: Option<Instant>,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        Bucket {
            rate,
            tokens: f64::from(rate),
            at: None,
        }
    }

    /// Takes one frame's place at `now`, if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let rate = f64::from(self.rate);
        if let Some(at) = self.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * rate;
            self.tokens = (self.tokens + refill).min(rate);
        }
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Follows the frames in what a connection reads and counts its control frames.
#[derive(Debug)]
struct Frames {
    scan: Scan,
    header: [u8; FRAME_HEADER],
    bucket: Bucket,
}

impl Frames {
    fn new(rate: u32) -> Frames {
        Frames {
            scan: Scan::Preface(0),
            header: [0; FRAME_HEADER],
            bucket: Bucket::new(rate),
        }
    }

    /// Looks at newly read bytes; false once the connection is over the limit.
    fn read(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match self.scan {
                Scan::Off => return true,
                Scan::Preface(seen) => {
                    let want = &H2_PREFACE[seen..];
                    let n = want.len().min(bytes.len());
                    if bytes[..n] != want[..n] {
                        self.scan = Scan::Off;
                        return true;
                    }
                    self.scan = if seen + n == H2_PREFACE.len() {
                        Scan::Header(0)
                    } else {
                        Scan::Preface(seen + n)
                    };
                    bytes = &bytes[n..];
                }
                Scan::Header(seen) => {
                    let n = (FRAME_HEADER - seen).min(bytes.len());
                    self.header[seen..seen + n].copy_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if seen + n < FRAME_HEADER {
                        self.scan = Scan::Header(seen + n);
                        continue;
                    }
                    let h = self.header;
                    let length = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                    let control = matches!(h[3], SETTINGS | PING) && h[4] & ACK == 0;
                    if control && !self.bucket.take(Instant::now()) {
                        self.scan = Scan::Off;
                        return false;
                    }
                    self.scan = if length == 0 {
                        Scan::Header(0)
                    } else {
                        Scan::Payload(length)
                    };
                }
                Scan::Payload(left) => {
                    let n = u32::try_from(bytes.len()).unwrap_or(u32::MAX).min(left);
                    bytes = &bytes[n as usize..];
                    self.scan = if n == left {
                        Scan::Header(0)
                    } else {
                        Scan::Payload(left - n)
                    };
                }
            }
        }
        true
    }
}

/// A client connection whose HTTP/2 control frames are rate limited (see the module doc).
pub struct H2Guard<IO> {
    io: IO,
    frames: Frames,
    flooded: Option<Counter>,
}

impl<IO> H2Guard<IO> {
    /// At most `rate` control frames a second; a connection past it counts in `flooded`.
    pub fn new(io: IO, rate: u32, flooded: Counter) -> H2Guard<IO> {
        H2Guard {
            io,
            frames: Frames::new(rate),
            flooded: Some(flooded),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for H2Guard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.flooded.is_none() {
            return Poll::Ready(Err(flood(this.frames.bucket.rate)));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && this.frames.scan != Scan::Off
            && !this.frames.read(&buf.filled()[before..])
        {
            if let Some(counter) = this.flooded.take() {
                counter.inc();
            }
            tracing::debug!(
                limit = LIMIT,
                "HTTP/2 control frame flood; connection closed"
            );
            return Poll::Ready(Err(flood(this.frames.bucket.rate)));
        }
        polled
    }
}

fn flood(rate: u32) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, ControlFlood(rate))
}

write_through!(impl [IO: AsyncWrite + Unpin] for H2Guard<IO>, |this| std::pin::Pin::new(&mut this.get_mut().io));

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    }

    fn ping() -> Vec<u8> {
        frame(PING, 0, &[7; 8])
    }

    /// A connection's bytes: the preface, then `frames`.
    fn stream(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut s = H2_PREFACE.to_vec();
        for f in frames {
            s.extend_from_slice(f);
        }
        s
    }

    /// Feeds `bytes` in pieces of `piece` bytes; whether it stayed within the limit.
    fn within(frames: &mut Frames, bytes: &[u8], piece: usize) -> bool {
        bytes.chunks(piece).all(|c| frames.read(c))
    }

    #[tokio::test(start_paused = true)]
    async fn control_frames_past_the_rate_close_however_the_bytes_are_split() {
        for piece in [1, 2, 5, 9, 17, 100, 10_000] {
            let mut frames = Frames::new(10);
            let mut ten = vec![frame(SETTINGS, 0, &[0; 6])];
            ten.extend((0..9).map(|_| ping()));
            assert!(within(&mut frames, &stream(&ten), piece), "{piece}");
            // Data frames, headers and acknowledgements do not count...
            let others = [
                frame(0x0, 0, &[b'x'; 300]),
                frame(0x1, 0x4, &[1; 40]),
                frame(PING, ACK, &[0; 8]),
                frame(SETTINGS, ACK, &[]),
            ];
            assert!(within(&mut frames, &others.concat(), piece), "{piece}");
            // ...the eleventh PING in the same second does.
            assert!(!within(&mut frames, &ping(), piece), "{piece}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_refills_at_the_rate() {
        let mut frames = Frames::new(10);
        assert!(within(&mut frames, &stream(&vec![ping(); 10]), 64));
        tokio::time::advance(Duration::from_millis(500)).await;
        // Half a second: five more, not six.
        assert!(within(&mut frames, &vec![ping(); 5].concat(), 64));
        assert!(!frames.read(&ping()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_client_within_the_rate_is_never_closed() {
        let mut frames = Frames::new(10);
        assert!(frames.read(H2_PREFACE));
        for _ in 0..1000 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert!(frames.read(&ping()));
        }
    }

    #[test]
    fn http1_is_passed_through_from_its_first_bytes() {
        let mut frames = Frames::new(1);
        assert!(frames.read(b"POST /v1/chat/completions HTTP/1.1\r\n"));
        assert_eq!(frames.scan, Scan::Off);
        // Bytes that would be PING frames are not looked at.
        assert!(frames.read(&vec![ping(); 100].concat()));
    }
}
