//! HTTP Upgrade (e.g. WebSocket): after the upstream answers 101, the two upgraded
//! connections are joined and bytes copied both ways untouched. Such exchanges are
//! recorded with e2e and byte counts only.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

use crate::measure::{Ending, Tap};

/// Byte counts of a finished tunnel.
#[derive(Debug, Clone, Copy)]
struct Done {
    to_client: u64,
    from_client: u64,
    clean: bool,
}

/// Carried in the 101 response's extensions so the measurement can follow the tunnel.
#[derive(Clone, Debug)]
pub struct Tunnel {
    done: Arc<Mutex<Option<oneshot::Receiver<Done>>>>,
}

impl Tunnel {
    /// Starts copying once both sides have switched protocols.
    pub fn spawn(client: OnUpgrade, upstream: OnUpgrade) -> Tunnel {
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let done = match tokio::try_join!(client, upstream) {
                Ok((c, u)) => {
                    let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
                    match tokio::io::copy_bidirectional(&mut c, &mut u).await {
                        Ok((from_client, to_client)) => Done { to_client, from_client, clean: true },
                        Err(e) => {
                            tracing::debug!(error = %e, "tunnel ended with an error");
                            Done { to_client: 0, from_client: 0, clean: false }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade failed");
                    Done { to_client: 0, from_client: 0, clean: false }
                }
            };
            let _ = tx.send(done);
        });
        Tunnel { done: Arc::new(Mutex::new(Some(rx))) }
    }

    /// Waits for the tunnel to close, then finishes the measurement.
    pub async fn measure(self, mut tap: Tap) {
        let rx = self.done.lock().unwrap_or_else(PoisonError::into_inner).take();
        let done = match rx {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        match done {
            Some(d) => {
                tap.add_tunnel_bytes(d.to_client, d.from_client);
                let ending = if d.clean { Ending::Complete } else { Ending::UpstreamFailed };
                tap.finish(Instant::now(), ending);
            }
            None => tap.finish(Instant::now(), tap.dropped_ending()),
        }
    }
}
