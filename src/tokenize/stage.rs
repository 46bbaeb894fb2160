//! The counting stage, on the aggregator's way in. Every finished measurement passes
//! through it: most go straight on; one whose upstream reported no usage (and whose text
//! or prompt can be counted) is handed to the tokenizer pool, whose worker fills in the
//! counts and then sends it back to the aggregator on a channel of its own. The aggregator
//! never waits for a tokenizer, and a full pool means a fallback (output: events; input:
//! absent), counted in `goodput_tokenizer_fallback_total`.

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

/// The counting stage, kept by the aggregator: [`Stage::route`] looks at each finished
/// measurement as the aggregator takes it off the recorder's channel (no task of its own,
/// so no hop per request) and hands the few that need counting to the pool.
pub struct Stage {
    live: Arc<ArcSwap<Config>>,
    tokenizers: Arc<ArcSwap<Tokenizers>>,
    pool: Option<Pool<Job>>,
    fallbacks: Fallbacks,
}

impl Stage {
    /// The stage, and the channel its workers send counted measurements on (closed once
    /// the stage is dropped and the workers have finished their queue). The pool's size is
    /// taken from the configuration now; a reload changes tokenizers and limits, not the
    /// number of workers. `tokenizers` are the loaded `[tokenizer] models`, replaced on a
    /// reload together with the configuration.
    pub fn new(
        live: Arc<ArcSwap<Config>>,
        tokenizers: Arc<ArcSwap<Tokenizers>>,
        fallbacks: Fallbacks,
    ) -> (Stage, mpsc::Receiver<Pending>) {
        let cfg = live.load();
        let counting = &cfg.tokenizer;
        // Room for every job the pool can hold, and one per worker in hand.
        let (worker_tx, counted) = mpsc::channel(counting.queue + counting.workers.max(1));
        let worker_fallbacks = fallbacks.clone();
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
                live: live.clone(),
                tokenizers,
                pool,
                fallbacks,
            },
            counted,
        )
    }

    /// A finished measurement, back at once when there is nothing to count (or no room to
    /// count it: counts then fall back), or `None` when a worker took it: it comes back
    /// counted on the stage's channel.
    pub fn route(&self, mut pending: Pending) -> Option<Pending> {
        let config = self.live.load_full();
        let Some(wants) = wants(&mut pending, &config) else {
            return Some(pending);
        };
        let job = Job {
            pending,
            config,
            tokenizers: self.tokenizers.load_full(),
            wants,
        };
        let refused = match &self.pool {
            Some(pool) => pool.try_submit(job).err()?,
            None => job,
        };
        self.fallbacks.inc(Fallback::QueueFull);
        let mut pending = refused.pending;
        pending.output_text = None;
        Some(pending)
    }
}

/// Decides, cheaply and on the aggregator's task, whether a finished request needs counting;
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;
    use prometheus_client::metrics::{counter::Counter, gauge::Gauge};

    use super::*;
    use crate::measure::{Ending, HeadInfo, Recorder, RequestCapture, Tap};

    /// A streamed chat answer of `text` with no usage, finished, off the recorder's channel.
    fn answered(text: &str) -> Pending {
        let (recorder, mut rx) = Recorder::new(4, Counter::default(), Gauge::default());
        let (tx, request) = tokio::sync::oneshot::channel();
        let mut tap = Tap::new(
            recorder,
            "r".into(),
            Instant::now(),
            Api::ChatCompletions,
            request,
            1 << 20,
            HeadInfo::default(),
        );
        tap.count_text(1 << 20);
        tap.on_head(200, Some("text/event-stream"), None);
        let event = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
        tap.on_data(Instant::now(), &Bytes::from(event));
        tap.on_data(Instant::now(), &Bytes::from_static(b"data: [DONE]\n\n"));
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let _ = tx.send(RequestCapture {
            chunks: vec![Bytes::from_static(body)],
            complete: true,
            ..RequestCapture::default()
        });
        tap.finish(Instant::now(), Ending::Complete);
        drop(tap);
        match rx.try_recv() {
            Ok(p) => p,
            Err(e) => panic!("no measurement: {e}"),
        }
    }

    fn stage(estimate: bool) -> (Stage, mpsc::Receiver<Pending>) {
        let toml = format!(
            "[upstream]\nurl = \"http://127.0.0.1:9\"\n[tokenizer]\nestimate = {estimate}\n"
        );
        let config = match crate::config::load_str(&toml, "test", &Default::default()) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let tokenizers = match Tokenizers::from_config(&config.tokenizer) {
            Ok(t) => t,
            Err(e) => panic!("{e:?}"),
        };
        Stage::new(
            Arc::new(ArcSwap::from_pointee(config)),
            Arc::new(ArcSwap::from_pointee(tokenizers)),
            Fallbacks::new(Family::default()),
        )
    }

    #[test]
    fn a_measurement_with_nothing_to_count_comes_straight_back() {
        let (stage, _counted) = stage(false);
        let p = answered("hello there");
        let back = stage.route(p);
        assert!(back.is_some_and(|p| p.id == "r"), "handed back as it is");
    }

    #[test]
    fn one_to_count_comes_back_counted_on_the_stages_channel() {
        let (stage, mut counted) = stage(true);
        assert!(
            stage.route(answered("hello there")).is_none(),
            "taken by a worker"
        );
        let p = counted.blocking_recv();
        let p = p.unwrap_or_else(|| panic!("the worker sent nothing"));
        assert!(p.counted_output.is_some(), "output counted");
        // Dropping the stage lets the workers end and close the channel.
        drop(stage);
        assert!(counted.blocking_recv().is_none());
    }
}
