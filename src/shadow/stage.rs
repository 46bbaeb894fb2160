//! The shadow's records on their own way to the aggregator, never on the primary's: the
//! shadow's recorder has a queue of its own (`shadow.record_queue`; full, a record is
//! dropped and counted `backlog`, never waited for), and this stage reads it. A record
//! that needs token counting is counted on a blocking thread, one at a time and never in
//! the primary's tokenizer pool; each then goes to the aggregator on a channel it reads
//! only when no primary record is waiting. When the shadow stops, what is still queued
//! here is dropped: each record's held place counts it as `shutdown`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};

use crate::{
    config::Config,
    measure::Pending,
    tokenize::{Fallbacks, Tokenizers, count_tokens, wants},
};

/// Records ready for the aggregator waiting at once: the backlog itself waits in the
/// shadow's queue, where it can be dropped without waiting.
const HANDOFF: usize = 8;

/// The shadow's queue, as [`super::Shadow::new`] makes it, for [`Stage::new`].
pub struct Queue {
    pub(super) rx: mpsc::Receiver<Pending>,
    pub(super) stop: watch::Receiver<bool>,
}

/// The stage's task; run it with [`Stage::run`].
pub struct Stage {
    rx: mpsc::Receiver<Pending>,
    stop: watch::Receiver<bool>,
    tx: mpsc::Sender<Pending>,
    live: Arc<ArcSwap<Config>>,
    tokenizers: Arc<ArcSwap<Tokenizers>>,
    fallbacks: Fallbacks,
}

impl Stage {
    /// The stage over `queue`; the aggregator reads the returned receiver
    /// ([`crate::stats::Aggregator::with_shadow`]).
    pub fn new(
        queue: Queue,
        live: Arc<ArcSwap<Config>>,
        tokenizers: Arc<ArcSwap<Tokenizers>>,
        fallbacks: Fallbacks,
    ) -> (Stage, mpsc::Receiver<Pending>) {
        let (tx, out) = mpsc::channel(HANDOFF);
        let stage = Stage {
            rx: queue.rx,
            stop: queue.stop,
            tx,
            live,
            tokenizers,
            fallbacks,
        };
        (stage, out)
    }

    /// Runs until the shadow stops (or its last recorder is gone); then drops what is
    /// still queued, and the aggregator's channel closes behind it.
    pub async fn run(mut self) {
        while let Some(pending) = self.next().await {
            let pending = match self.counted(pending).await {
                Ok(Some(pending)) => pending,
                // Lost in counting (a tokenizer that panicked): its place counted it.
                Ok(None) => continue,
                Err(Stopped) => break,
            };
            let mut stop = self.stop.clone();
            let sent = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => false,
                sent = self.tx.send(pending) => sent.is_ok(),
            };
            if !sent {
                break;
            }
        }
        self.rx.close();
        while let Ok(lost) = self.rx.try_recv() {
            drop(lost);
        }
    }

    /// The next record, or `None` once the shadow stopped (a dropped shadow counts).
    async fn next(&mut self) -> Option<Pending> {
        let mut stop = self.stop.clone();
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => None,
            pending = self.rx.recv() => pending,
        }
    }

    /// `pending` with its tokens counted where needed. When the shadow stops meanwhile
    /// the count is not waited for: the record is lost, and counted so when it ends.
    async fn counted(&mut self, mut pending: Pending) -> Result<Option<Pending>, Stopped> {
        let config = self.live.load_full();
        if pending.pairing.cut.is_some() {
            // A cut answer is not judged: the tokens of its first `max_answer_bytes` say
            // nothing, and counting them is the costliest part of a large answer.
            pending.output_text = None;
        }
        let Some(wants) = wants(&mut pending, &config) else {
            return Ok(Some(pending));
        };
        let tokenizers = self.tokenizers.load_full();
        let fallbacks = self.fallbacks.clone();
        let counting = tokio::task::spawn_blocking(move || {
            if let Some(reason) = count_tokens(&mut pending, &config, &tokenizers, wants) {
                fallbacks.inc(reason);
            }
            pending
        });
        let mut stop = self.stop.clone();
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => Err(Stopped),
            counted = counting => Ok(counted.ok()),
        }
    }
}

/// The shadow stopped.
struct Stopped;
