//! A deadline on a client connection's first bytes. hyper-util's `auto` builder first
//! reads until it can tell HTTP/1 from the HTTP/2 preface, and that read has no timer:
//! hyper's HTTP/1 header-read timeout only starts once HTTP/1 was chosen. Without this, a
//! client that connects and sends nothing (or a partial preface) holds a connection forever.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

pub(super) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pin_project! {
    /// Passes every byte through; until the bytes read either leave the HTTP/2 preface or
    /// complete it, a read that is still pending at the deadline fails with `TimedOut`.
    pub struct FirstBytes<IO> {
        #[pin]
        io: IO,
        // Boxed: one allocation per connection, dropped as soon as the version is known.
        deadline: Option<Pin<Box<Sleep>>>,
        matched: usize,
    }
}

impl<IO> FirstBytes<IO> {
    pub fn new(io: IO, timeout: Duration) -> FirstBytes<IO> {
        FirstBytes {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            matched: 0,
        }
    }
}

impl<IO: AsyncRead> AsyncRead for FirstBytes<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.io.poll_read(cx, buf);
        let Some(deadline) = this.deadline.as_mut() else {
            return polled;
        };
        match &polled {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                let decided = new.is_empty()
                    || new.iter().any(|b| {
                        let same = H2_PREFACE.get(*this.matched) == Some(b);
                        *this.matched += 1;
                        !same
                    })
                    || *this.matched >= H2_PREFACE.len();
                if decided {
                    *this.deadline = None;
                }
            }
            Poll::Ready(Err(_)) => {}
            Poll::Pending => {
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client sent no request head in time",
                    )));
                }
            }
        }
        polled
    }
}

write_through!(impl [IO: AsyncWrite] for FirstBytes<IO>, |this| this.project().io);

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    const T: Duration = Duration::from_millis(300);

    /// Whether a read still pending well past the deadline fails with `TimedOut`.
    async fn times_out_after(sent: &[u8]) -> bool {
        let (mut client, server) = duplex(1024);
        let mut io = FirstBytes::new(server, T);
        client.write_all(sent).await.unwrap();
        let mut buf = vec![0u8; sent.len()];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, sent, "bytes pass unchanged");
        let mut more = [0u8; 1];
        match tokio::time::timeout(T * 3, io.read(&mut more)).await {
            Ok(Err(e)) => e.kind() == io::ErrorKind::TimedOut,
            Ok(Ok(n)) => panic!("unexpected read of {n} bytes"),
            Err(_) => false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn silence_and_partial_preface_time_out() {
        assert!(times_out_after(b"").await);
        assert!(times_out_after(b"P").await);
        assert!(times_out_after(b"PRI * HTTP/2.0\r\n").await);
    }

    #[tokio::test(start_paused = true)]
    async fn http1_or_a_full_preface_disarms_the_deadline() {
        assert!(!times_out_after(b"POST / HTTP/1.1\r\n").await);
        assert!(!times_out_after(b"GET").await);
        assert!(!times_out_after(H2_PREFACE).await);
    }
}
