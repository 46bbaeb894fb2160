//! HTTP Upgrade (e.g. WebSocket): after the upstream answers 101, the two upgraded
//! connections are joined and bytes copied both ways untouched. Such exchanges are
//! recorded with e2e and byte counts only.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::upstream::inline::Lease;
use crate::measure::{Ending, TunnelDone, Upgraded};

/// Joins the two upgraded connections once both sides have switched protocols, and
/// returns what the measurement follows the tunnel with. `held` (the upstream budget's
/// slot) is given back when the tunnel closes.
pub fn spawn(client: OnUpgrade, upstream: OnUpgrade, held: Option<Lease>) -> Upgraded {
    let (tx, upgraded) = Upgraded::channel();
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
                TunnelDone {
                    to_client: c.written,
                    from_client: c.read,
                    ending,
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                TunnelDone {
                    to_client: 0,
                    from_client: 0,
                    ending: Ending::UpstreamFailed,
                }
            }
        };
        let _ = tx.send(done);
    });
    upgraded
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
