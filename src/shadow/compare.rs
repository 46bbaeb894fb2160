//! The answers' comparison, off the aggregator and off the primary's way. For a mirrored
//! exchange the aggregator only hands over a handle to the answer's bytes ([`Answers`]),
//! kept by the measurement in a buffer of their own: no copy, no decoding, never a wait. They go into a queue
//! of their own, bounded both in answers ([`QUEUE_ANSWERS`]) and in bytes
//! ([`QUEUE_BYTES`]); when it is full the answer is not compared and the drop is counted
//! (`answer_backlog`), while its record is written as usual. The [`Comparer`] reads the
//! queue and, one answer at a time on a blocking thread, decodes it to text with token
//! marks and reduces it into its pair ([`Book::answer`]): a comparison never takes a
//! thread that serves clients, and a primary record never waits for one.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};

use super::{
    Book, DropReason, ShadowMetrics,
    answers::{Answer, Expect, Side},
    logprobs,
};
use crate::{
    config::ShadowConfig,
    decode::{Api, FinishReason, StreamKind, answer_text},
    measure::{Outcome, RequestRecord, Target},
};

/// Answers waiting at once to be compared. Comparing one takes a fraction of a
/// millisecond for the usual few-KiB answer: 256 is a backlog of many seconds of traffic
/// at any share a candidate can keep up with.
pub const QUEUE_ANSWERS: usize = 256;
/// Bytes of answers held by the queue at once (the buffers stay alive while their
/// handles wait): 64 MiB, the bound of the text waiting for a pair's other side.
pub const QUEUE_BYTES: usize = super::answers::WAITING_BYTES;

/// One side's answer, as handles to its bytes, and what its pair needs to know of it.
struct Job {
    key: String,
    side: Side,
    finish: Option<FinishReason>,
    api: Api,
    kind: StreamKind,
    /// Empty when the side has no answer to compare (it did not end well, or was cut):
    /// its pair is then done with it.
    chunks: Vec<Bytes>,
    bytes: usize,
    /// Text kept of the answer (`shadow.max_answer_bytes`).
    limit: usize,
    expect: Expect,
}

/// The aggregator's side of the queue.
#[derive(Clone, Debug)]
pub struct Answers {
    tx: mpsc::Sender<Job>,
    queued: Arc<AtomicUsize>,
    dropped: Counter,
}

impl Answers {
    /// Hands over `record`'s answer (its frames, `chunks`) when it has a pair to be
    /// compared in (a mirrored primary or a copy); one that did not end well or was cut
    /// goes without its frames, so that its pair is done with it. Never waits: a full
    /// queue drops it, counted.
    pub fn hand_over(
        &self,
        record: &RequestRecord,
        api: Api,
        kind: StreamKind,
        chunks: Vec<Bytes>,
        shadow: &ShadowConfig,
    ) {
        let Some((key, side)) = pair_key(record) else {
            return;
        };
        let chunks = if record.outcome != Outcome::Ok || record.pairing.cut.is_some() {
            Vec::new()
        } else {
            chunks
        };
        let bytes = chunks.iter().map(Bytes::len).sum();
        let before = self.queued.fetch_add(bytes, Ordering::Relaxed);
        let job = Job {
            key,
            side,
            finish: record.finish_reason,
            api,
            kind,
            chunks,
            bytes,
            limit: usize::try_from(shadow.max_answer_bytes).unwrap_or(usize::MAX),
            expect: Expect {
                deterministic: record.pairing.deterministic,
                copies: 1 + u8::from(shadow.secondary.is_some()),
                logprobs: shadow.logprobs,
            },
        };
        if before.saturating_add(bytes) > QUEUE_BYTES || self.tx.try_send(job).is_err() {
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            self.dropped.inc();
        }
    }
}

/// The pair an answer belongs to (the primary's id) and its side in it.
fn pair_key(r: &RequestRecord) -> Option<(String, Side)> {
    match r.pairing.target {
        Target::Primary if r.pairing.mirrored => Some((r.id.clone(), Side::Primary)),
        Target::Primary => None,
        Target::Shadow => Some((r.pairing.pair_id.clone()?, Side::Candidate)),
        Target::Secondary => Some((r.pairing.pair_id.clone()?, Side::Secondary)),
    }
}

/// The comparison's task; run it with [`Comparer::run`].
pub struct Comparer {
    rx: mpsc::Receiver<Job>,
    queued: Arc<AtomicUsize>,
    book: Book,
    metrics: ShadowMetrics,
    stop: watch::Receiver<bool>,
}

impl Comparer {
    /// The comparer into `book`, and the handle the aggregator hands answers to
    /// ([`crate::stats::Aggregator::with_shadow`]); it stops with the shadow (`stop`).
    pub fn new(
        book: Book,
        metrics: ShadowMetrics,
        stop: watch::Receiver<bool>,
        capacity: usize,
    ) -> (Comparer, Answers) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let answers = Answers {
            tx,
            queued: queued.clone(),
            dropped: metrics.counter(DropReason::AnswerBacklog),
        };
        let comparer = Comparer {
            rx,
            queued,
            book,
            metrics,
            stop,
        };
        (comparer, answers)
    }

    /// Runs until the shadow stops or the aggregator's handle is gone; what is still
    /// queued then is dropped (there is nobody left to read a comparison).
    pub async fn run(mut self) {
        loop {
            let mut stop = self.stop.clone();
            let job = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => None,
                job = self.rx.recv() => job,
            };
            let Some(job) = job else { break };
            self.queued.fetch_sub(job.bytes, Ordering::Relaxed);
            let (book, metrics) = (self.book.clone(), self.metrics.clone());
            let comparing = tokio::task::spawn_blocking(move || compare(job, &book, &metrics));
            let mut stop = self.stop.clone();
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                _ = comparing => {}
            }
        }
        self.rx.close();
    }
}

/// Decodes one side's answer (and a copy's tokens, with log-probabilities) and reduces
/// it into its pair.
fn compare(job: Job, book: &Book, metrics: &ShadowMetrics) {
    let answer = (!job.chunks.is_empty())
        .then(|| answer_text(job.api, job.kind, &job.chunks, job.limit))
        .flatten()
        .map(|text| {
            let tokens = (job.expect.logprobs && job.side != Side::Primary)
                .then(|| logprobs::tokens(job.api, job.kind, &job.chunks))
                .flatten();
            let marks = text.marks().map(<[u32]>::to_vec);
            Answer {
                text: text.into_text(),
                marks,
                finish: job.finish,
                tokens,
            }
        });
    drop(job.chunks);
    if let Some(result) = book.answer(&job.key, job.side, answer, job.expect) {
        metrics.compared(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Pairing;

    fn record(id: &str, target: Target, pair_id: Option<&str>) -> RequestRecord {
        let mut r = crate::measure::record::example::record();
        r.id = id.to_owned();
        r.finish_reason = Some(FinishReason::Stop);
        r.pairing = Pairing {
            target,
            pair_id: pair_id.map(str::to_owned),
            mirrored: target == Target::Primary,
            deterministic: true,
            ..Pairing::default()
        };
        r
    }

    fn shadow_config() -> ShadowConfig {
        let text =
            "[upstream]\nurl = \"http://127.0.0.1:9\"\n[shadow]\nurl = \"http://127.0.0.1:9\"\n";
        let config = crate::config::load_str(text, "test", &Default::default()).unwrap();
        config.shadow.clone().unwrap()
    }

    fn sse(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| {
                Bytes::from(format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w}\"}}}}]}}\n\n"
                ))
            })
            .collect()
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let metrics = ShadowMetrics::default();
        let (_stop_tx, stop) = watch::channel(false);
        let (_comparer, answers) = Comparer::new(Book::default(), metrics.clone(), stop, 1);
        let cfg = shadow_config();
        let primary = record("a", Target::Primary, None);
        for _ in 0..3 {
            answers.hand_over(
                &primary,
                Api::ChatCompletions,
                StreamKind::Sse,
                sse(&["x"]),
                &cfg,
            );
        }
        assert_eq!(metrics.counter(DropReason::AnswerBacklog).get(), 2);
        // An answer that has no pair is not handed over at all.
        let mut unpaired = record("b", Target::Primary, None);
        unpaired.pairing.mirrored = false;
        answers.hand_over(
            &unpaired,
            Api::ChatCompletions,
            StreamKind::Sse,
            sse(&["x"]),
            &cfg,
        );
        assert_eq!(metrics.counter(DropReason::AnswerBacklog).get(), 2);
    }

    #[tokio::test]
    async fn answers_are_decoded_and_compared_by_the_comparer() {
        let metrics = ShadowMetrics::default();
        let book = Book::default();
        let (stop_tx, stop) = watch::channel(false);
        let (comparer, answers) = Comparer::new(book.clone(), metrics.clone(), stop, 8);
        let running = tokio::spawn(comparer.run());
        let cfg = shadow_config();
        let (api, kind) = (Api::ChatCompletions, StreamKind::Sse);
        answers.hand_over(
            &record("a", Target::Primary, None),
            api,
            kind,
            sse(&["the ", "model"]),
            &cfg,
        );
        answers.hand_over(
            &record("a:shadow", Target::Shadow, Some("a")),
            api,
            kind,
            sse(&["the ", "mouse"]),
            &cfg,
        );
        let differs = metrics
            .answer_pairs
            .get_or_create(&super::super::metrics::ResultLabel { result: "differs" });
        let compared = async {
            while differs.get() == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), compared)
            .await
            .unwrap();
        let _ = stop_tx.send(true);
        running.await.unwrap();
    }
}
