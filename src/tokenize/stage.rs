//! The counting stage between the data path and the aggregator. Every finished
//! measurement passes through it: most go straight on; one whose upstream reported no
//! usage (and whose text or prompt can be counted) is handed to the tokenizer pool, whose
//! worker fills in the counts and then sends it on to the aggregator itself. Neither this
//! task nor the aggregator ever waits for a tokenizer, and a full pool means a fallback
//! (output: events; input: absent), counted in `goodput_tokenizer_fallback_total`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tokio::sync::mpsc;

use super::{Fallback, Tokenizers, count::count_tokens, pool::Pool};
use crate::config::Config;
use crate::decode::{Api, StreamKind};
use crate::measure::Pending;
use crate::metrics::{ReasonLabel, names};

/// What a counting job must fill in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wants {
    pub input: bool,
    pub output: bool,
}

/// One request to count, with the configuration it arrived under.
pub(crate) struct Job {
    pub pending: Pending,
    pub config: Arc<Config>,
    pub tokenizers: Arc<Tokenizers>,
    pub wants: Wants,
}

/// The fallback counter, by reason.
#[derive(Clone, Debug)]
pub struct Fallbacks(Family<ReasonLabel, Counter>);

impl Fallbacks {
    pub fn new(family: Family<ReasonLabel, Counter>) -> Fallbacks {
        Fallbacks(family)
    }

    /// Creates the counter and registers it in `registry`.
    pub fn register(registry: &mut Registry) -> Fallbacks {
        let family = Family::default();
        names::TOKENIZER_FALLBACK.register(registry, family.clone());
        Fallbacks(family)
    }

    pub(crate) fn inc(&self, reason: Fallback) {
        self.0
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }
}

/// The stage's task; run it with [`Stage::run`].
pub struct Stage {
    rx: mpsc::Receiver<Pending>,
    tx: mpsc::Sender<Pending>,
    live: Arc<ArcSwap<Config>>,
    tokenizers: Arc<ArcSwap<Tokenizers>>,
    pool: Option<Pool<Job>>,
    fallbacks: Fallbacks,
}

impl Stage {
    /// Puts the stage on `rx` (the recorder's channel); the aggregator reads the returned
    /// receiver instead. The pool's size is taken from the configuration now; a reload
    /// changes tokenizers and limits, not the number of workers. `tokenizers` are the
    /// loaded `[tokenizer] models`, replaced on a reload together with the configuration.
    pub fn new(
        rx: mpsc::Receiver<Pending>,
        live: Arc<ArcSwap<Config>>,
        tokenizers: Arc<ArcSwap<Tokenizers>>,
        fallbacks: Fallbacks,
    ) -> (Stage, mpsc::Receiver<Pending>) {
        let cfg = live.load();
        let (tx, out) = mpsc::channel(cfg.measure.channel_capacity.max(1));
        let worker_tx = tx.clone();
        let worker_fallbacks = fallbacks.clone();
        let counting = &cfg.tokenizer;
        let pool = Pool::new(
            "goodput-tokenize",
            counting.workers,
            counting.queue,
            move |job: Job| {
                let mut pending = job.pending;
                if let Some(reason) =
                    count_tokens(&mut pending, &job.config, &job.tokenizers, job.wants)
                {
                    worker_fallbacks.inc(reason);
                }
                // A worker thread may block; the aggregator draining its queue releases it.
                let _ = worker_tx.blocking_send(pending);
            },
        );
        let pool = match pool {
            Ok(pool) => Some(pool),
            Err(e) => {
                tracing::error!(error = %e, "cannot start tokenizer workers; token counts fall back");
                None
            }
        };
        (
            Stage {
                rx,
                tx,
                live: live.clone(),
                tokenizers,
                pool,
                fallbacks,
            },
            out,
        )
    }

    /// Runs until the data path's last recorder is gone; the workers then finish their
    /// queue and close the aggregator's channel behind them.
    pub async fn run(mut self) {
        while let Some(mut pending) = self.rx.recv().await {
            let config = self.live.load_full();
            let Some(wants) = wants(&mut pending, &config) else {
                if self.tx.send(pending).await.is_err() {
                    return;
                }
                continue;
            };
            let job = Job {
                pending,
                config,
                tokenizers: self.tokenizers.load_full(),
                wants,
            };
            let refused = match &self.pool {
                Some(pool) => pool.try_submit(job).err(),
                None => Some(job),
            };
            if let Some(job) = refused {
                self.fallbacks.inc(Fallback::QueueFull);
                let mut pending = job.pending;
                pending.output_text = None;
                if self.tx.send(pending).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Decides, cheaply and on the stage's task, whether a finished request needs counting;
/// takes the request body capture out of its channel when it does.
pub(crate) fn wants(p: &mut Pending, config: &Config) -> Option<Wants> {
    let counting = &config.tokenizer;
    let answered = p.status.is_some_and(|s| s < 400) && p.proxy_failure.is_none() && !p.tunnel;
    if !counting.enabled() || !answered || p.api == Api::Unknown {
        p.output_text = None;
        return None;
    }
    let usage = p.timeline.usage.unwrap_or_default();
    let json_body = p.kind == StreamKind::Json && !p.body_overflow && !p.body.is_empty();
    if json_body && body_reports_usage(p) {
        return None;
    }
    let output = usage.output_tokens.is_none()
        && (json_body || p.output_text.as_ref().is_some_and(|t| !t.is_empty()));
    // The body is wanted for the prompt, and for the model that picks the tokenizer. A
    // receiver whose capture has not arrived is left in place for the aggregator.
    if (output || usage.input_tokens.is_none())
        && let Some(rx) = p.request.as_mut()
        && let Ok(capture) = rx.try_recv()
    {
        p.request = None;
        p.request_capture = Some(capture);
    }
    let input = usage.input_tokens.is_none()
        && p.request_capture
            .as_ref()
            .is_some_and(|c| c.complete && !c.overflow && !c.chunks.is_empty());
    if !(input || output) {
        p.output_text = None;
        return None;
    }
    Some(Wants { input, output })
}

/// A quick look for the dialect's usage key in a non-streaming body, so that bodies which
/// report usage (nearly all) never take a worker's time. A key split across two chunks is
/// missed; the worker then parses the body and finds the usage after all.
fn body_reports_usage(p: &Pending) -> bool {
    let key: &[u8] = match p.api {
        Api::OllamaChat | Api::OllamaGenerate => b"\"eval_count\"",
        Api::LlamaCppCompletion => b"\"tokens_predicted\"",
        Api::TgiGenerate { .. } => b"\"generated_tokens\"",
        _ => b"\"usage\"",
    };
    let finder = memchr::memmem::Finder::new(key);
    p.body.iter().any(|chunk| finder.find(chunk).is_some())
}
