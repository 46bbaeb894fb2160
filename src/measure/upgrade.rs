//! Following an upgraded exchange (HTTP Upgrade, e.g. WebSocket) to its end: the data path
//! joins the two upgraded connections and, when they close, sends how much flowed each way
//! and how it ended; the measurement waits for that and finishes the record with it.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use tokio::sync::oneshot;

use super::{Ending, Tap};

/// Byte counts and ending of a closed tunnel, counted on the client's side.
#[derive(Debug, Clone, Copy)]
pub struct TunnelDone {
    pub to_client: u64,
    pub from_client: u64,
    pub ending: Ending,
}

/// Carried in the 101 response's extensions so the measurement can follow the tunnel.
#[derive(Clone, Debug)]
pub struct Upgraded {
    done: Arc<Mutex<Option<oneshot::Receiver<TunnelDone>>>>,
}

impl Upgraded {
    /// The sender the data path reports the tunnel's end on, and the extension that goes
    /// with the response.
    pub fn channel() -> (oneshot::Sender<TunnelDone>, Upgraded) {
        let (tx, rx) = oneshot::channel();
        let upgraded = Upgraded {
            done: Arc::new(Mutex::new(Some(rx))),
        };
        (tx, upgraded)
    }

    /// Waits for the tunnel to close, then finishes the measurement. A tunnel whose task
    /// ended without reporting (it panicked, or the runtime shut down) ends as the tap's
    /// drop would have it.
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
