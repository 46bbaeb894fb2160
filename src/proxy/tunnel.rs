//! HTTP Upgrade (e.g. WebSocket): after the upstream answers 101, the two upgraded
//! connections are joined and bytes copied both ways untouched. Such exchanges are
//! recorded with e2e and byte counts only.

use std::{
    io,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Instant,
};

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::oneshot,
};

use super::inline::Lease;
use crate::measure::{Ending, Tap};

/// Byte counts of a finished tunnel.
#[derive(Debug, Clone, Copy)]
struct Done {
    to_client: u64,
    from_client: u64,
    ending: Ending,
}

/// Carried in the 101 response's extensions so the measurement can follow the tunnel.
#[derive(Clone, Debug)]
pub struct Tunnel {
    done: Arc<Mutex<Option<oneshot::Receiver<Done>>>>,
}

impl Tunnel {
    /// Starts copying once both sides have switched protocols. `held` (the upstream
    /// budget's slot) is given back when the tunnel closes.
    pub fn spawn(client: OnUpgrade, upstream: OnUpgrade, held: Option<Lease>) -> Tunnel {
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let _held = held;
            let done = match tokio::try_join!(client, upstream) {
                Ok((c, u)) => {
                    let mut c = Counted::new(TokioIo::new(c));
                    let mut u = TokioIo::new(u);
                    let ending = match tokio::io::copy_bidirectional(&mut c, &mut u).await {
                        Ok(_) => Ending::Complete,
                        Err(e) => {
                            tracing::debug!(error = %e, "tunnel ended with an error");
                            // Blame the side whose own socket failed: a reset client aborted.
                            if c.failed {
                                Ending::ClientGone
                            } else {
                                Ending::UpstreamFailed
                            }
                        }
                    };
                    // Counted on the client's side, so a cut tunnel keeps what did flow.
                    Done {
                        to_client: c.written,
                        from_client: c.read,
                        ending,
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade failed");
                    Done {
                        to_client: 0,
                        from_client: 0,
                        ending: Ending::UpstreamFailed,
                    }
                }
            };
            let _ = tx.send(done);
        });
        Tunnel {
            done: Arc::new(Mutex::new(Some(rx))),
        }
    }

    /// Waits for the tunnel to close, then finishes the measurement.
    pub async fn measure(self, mut tap: Tap) {
        let rx = self
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let done = match rx {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        match done {
            Some(d) => {
                tap.add_tunnel_bytes(d.to_client, d.from_client);
                tap.finish(Instant::now(), d.ending);
            }
            None => tap.finish(Instant::now(), tap.dropped_ending()),
        }
    }
}

/// One side of a tunnel: counts the bytes that pass and notes whether its own I/O failed.
/// `copy_bidirectional` reports no counts when it fails, and a tunnel ended by a reset is
/// an ordinary way for a WebSocket to end.
struct Counted<T> {
    inner: T,
    read: u64,
    written: u64,
    failed: bool,
}

impl<T> Counted<T> {
    fn new(inner: T) -> Counted<T> {
        Counted {
            inner,
            read: 0,
            written: 0,
            failed: false,
        }
    }

    fn note<R>(&mut self, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if let Poll::Ready(Err(_)) = &polled {
            self.failed = true;
        }
        polled
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.read += (buf.filled().len() - before) as u64;
        }
        this.note(polled)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            this.written += n as u64;
        }
        this.note(polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.note(polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.note(polled)
    }
}
