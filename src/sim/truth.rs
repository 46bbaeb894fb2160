//! Ground truth: what the simulator actually did for each request.
//!
//! Tests and benchmarks compare the proxy's measurements against this record, so it is
//! taken at the server's side of the socket: `first_token_at`/`last_token_at` right before
//! an event's bytes go to hyper. A request is recorded exactly once, when its response
//! finishes or, if it never does, when its body (or the handler future) is dropped — that
//! is how a test proves a client abort cancelled the upstream request.
//!
//! The log is a bounded ring behind a `Mutex`, locked once per request at the end, never
//! per token. The same guard keeps the in-flight count used by the concurrency slowdown.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::Shared;
use super::metrics::Finished;

/// How many finished requests [`TruthLog`] keeps; older ones are forgotten.
pub const TRUTH_CAPACITY: usize = 100_000;

/// What the simulator did for one request.
#[derive(Clone, Debug)]
pub struct Truth {
    /// The `x-request-id` request header, if any.
    pub request_id: Option<String>,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Whether the response was streamed (SSE).
    pub stream: bool,
    /// HTTP status sent.
    pub status: u16,
    /// Prompt tokens reported in `usage` (the simulator's estimate).
    pub prompt_tokens: u64,
    /// Completion tokens generated and handed to hyper (for a cut stream: so far).
    pub completion_tokens: u64,
    /// Content-bearing events handed to hyper (the role chunk and usage chunk excluded;
    /// 0 for a non-streamed reply, which has no events and no token times).
    pub events: u32,
    /// When the request head reached the simulator's handler.
    pub received_at: Instant,
    /// Right before the first content event's bytes were handed to hyper.
    pub first_token_at: Option<Instant>,
    /// Right before the last content event's bytes were handed to hyper.
    pub last_token_at: Option<Instant>,
    /// Right before each content event's bytes were handed to hyper, in order; empty
    /// unless [`SimConfig::record_event_times`](super::SimConfig::record_event_times).
    pub event_times: Vec<Instant>,
    /// `stop` or `length` for generations that ran to their end.
    pub finish_reason: Option<&'static str>,
    /// The whole response was handed to hyper; false if reset or the client went away.
    pub completed: bool,
    /// The body was dropped before it finished: client disconnect or upstream cancellation.
    pub client_gone: bool,
}

/// The bounded ring of finished requests.
#[derive(Debug, Default)]
pub(crate) struct TruthLog {
    ring: Mutex<VecDeque<Truth>>,
}

impl TruthLog {
    pub(crate) fn push(&self, t: Truth) {
        // A poisoned lock only means another request panicked mid-push; the ring itself
        // is still a valid VecDeque, so keep recording.
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() >= TRUTH_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(t);
    }

    pub(crate) fn snapshot(&self) -> Vec<Truth> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter().cloned().collect()
    }
}

/// How a request ended, from the simulator's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Everything was handed to hyper.
    Completed,
    /// The simulator cut the stream on purpose.
    Reset,
}

/// One request in flight: counts it for the slowdown while alive and records its
/// [`Truth`] exactly once, at [`InFlight::finish`] or, failing that, on drop.
#[derive(Debug)]
pub(crate) struct InFlight {
    shared: Arc<Shared>,
    /// The record being filled in; `None` once it has been pushed. Boxed: a response
    /// body that carries this stays small.
    truth: Option<Box<Truth>>,
    /// The model of a generation; only generations feed `/metrics`.
    model: Option<Box<str>>,
}

impl InFlight {
    pub(crate) fn start(shared: Arc<Shared>, truth: Truth) -> Self {
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            shared,
            truth: Some(Box::new(truth)),
            model: None,
        }
    }

    /// Marks this request as a generation of `model`, observed by `/metrics` when it completes.
    pub(crate) fn generation(&mut self, model: &str) {
        self.model = Some(model.into());
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The record being filled in; `None` once it has been recorded.
    pub(crate) fn truth_mut(&mut self) -> Option<&mut Truth> {
        self.truth.as_deref_mut()
    }

    /// Notes that a content event is about to be handed to hyper.
    pub(crate) fn token_event(&mut self, tokens: u32) {
        if let Some(t) = self.truth.as_mut() {
            let now = Instant::now();
            t.first_token_at.get_or_insert(now);
            t.last_token_at = Some(now);
            if self.shared.cfg.record_event_times {
                t.event_times.push(now);
            }
            t.events += 1;
            t.completion_tokens += u64::from(tokens);
        }
    }

    pub(crate) fn finish(&mut self, end: End) {
        if let Some(mut t) = self.truth.take() {
            t.completed = end == End::Completed;
            if t.completed
                && t.status == 200
                && let Some(model) = &self.model
            {
                self.shared.metrics.observe(model, &finished(&t));
            }
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.shared.truth.push(*t);
        }
    }
}

/// What a completed generation adds to `/metrics`, from its truth at this moment.
fn finished(t: &Truth) -> Finished {
    let since = |at: Instant| at.duration_since(t.received_at).as_secs_f64();
    let decode = match (t.first_token_at, t.last_token_at) {
        (Some(first), Some(last)) => last.duration_since(first).as_secs_f64(),
        _ => 0.0,
    };
    Finished {
        e2e: since(Instant::now()),
        ttft: t.first_token_at.map(since),
        tpot: (t.completion_tokens >= 2 && t.first_token_at.is_some())
            .then(|| decode / (t.completion_tokens - 1) as f64),
        // The gaps between consecutive events add up to first → last.
        itl_sum: decode,
        itl_gaps: u64::from(t.events.saturating_sub(1)),
        decode,
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(mut t) = self.truth.take() {
            t.client_gone = true;
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.shared.truth.push(*t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> Truth {
        Truth {
            request_id: None,
            path: "/x".into(),
            stream: true,
            status: 200,
            prompt_tokens: 1,
            completion_tokens: 0,
            events: 0,
            received_at: Instant::now(),
            first_token_at: None,
            last_token_at: None,
            event_times: Vec::new(),
            finish_reason: None,
            completed: false,
            client_gone: false,
        }
    }

    #[test]
    fn records_once_on_finish_or_drop() {
        let shared = Arc::new(Shared::new(crate::sim::SimConfig::default()));
        let mut a = InFlight::start(shared.clone(), blank());
        let b = InFlight::start(shared.clone(), blank());
        assert_eq!(shared.in_flight.load(Ordering::Relaxed), 2);
        a.token_event(3);
        a.finish(End::Completed);
        a.finish(End::Reset);
        drop(a);
        drop(b);
        assert_eq!(shared.in_flight.load(Ordering::Relaxed), 0);
        let snap = shared.truth.snapshot();
        assert_eq!(snap.len(), 2);
        assert!(snap[0].completed && !snap[0].client_gone && snap[0].completion_tokens == 3);
        assert!(!snap[1].completed && snap[1].client_gone);
    }

    #[test]
    fn ring_is_bounded() {
        let log = TruthLog::default();
        for i in 0..TRUTH_CAPACITY as u64 + 5 {
            log.push(Truth {
                prompt_tokens: i,
                ..blank()
            });
        }
        let snap = log.snapshot();
        assert_eq!(snap.len(), TRUTH_CAPACITY);
        assert_eq!(snap[0].prompt_tokens, 5);
    }
}
