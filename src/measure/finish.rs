//! Turning what the data path saw into a [`RequestRecord`], per the normative
//! definitions in docs/DESIGN.md. Runs on the aggregator, off the request's hot path: this is
//! where request and non-streaming response bodies are parsed.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    record::{
        EngineSplit, EngineTimingSource, ItlSummary, Outcome, RequestRecord, TokenCount,
        TokenSource, WallClock,
    },
    tap::{Ending, Pending, Timeline},
};
use crate::decode::{self, Api, BodyInfo, RequestInfo, StreamKind, Usage};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The numbers docs/DESIGN.md defines for one response, derived from what was seen of it by
/// [`derive`]. Shared by the proxy's records ([`Pending::finish`]) and the client-side
/// measurement of `goodput replay`, so that both measure by the same code.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Derived {
    pub ttft: Option<Duration>,
    pub ttfo: Option<Duration>,
    pub tpot: Option<Duration>,
    pub output_tokens: Option<u64>,
    pub output_tokens_source: Option<TokenSource>,
    pub input_tokens: Option<u64>,
    pub input_tokens_source: Option<TokenSource>,
}

/// TTFT, TTFO, TPOT and the token counts of a response whose request arrived (or, for a
/// client, was sent) at `t_arrival`. `body_usage` is a non-streaming body's usage; the
/// `counted_*` are counts made off the path (the tokenizer stage), `None` where nobody
/// counted; `decoded` says whether the stream had a decoder (its events then bound the
/// output count).
pub fn derive(
    t_arrival: Instant,
    tl: &Timeline,
    body_usage: Option<Usage>,
    counted_input: Option<TokenCount>,
    counted_output: Option<TokenCount>,
    decoded: bool,
) -> Derived {
    let usage = tl.usage.or(body_usage);
    // usage > tokenizer/estimate (counted off the path) > events. A count of zero over
    // a stream that had content events means the text was not where it was looked
    // for: the events say more. So does an estimate close to the event count (see
    // `one_token_per_event`).
    let events = tl.events;
    let counted = counted_output
        .filter(|c| c.n > 0 || events == 0)
        .filter(|c| {
            !(decoded && c.source == TokenSource::Estimate && one_token_per_event(c.n, events))
        });
    let (output_tokens, output_tokens_source) =
        match (usage.and_then(|u| u.output_tokens), counted, decoded) {
            (Some(n), _, _) => (Some(n), Some(TokenSource::Usage)),
            (None, Some(c), _) => (Some(c.n), Some(c.source)),
            (None, None, true) => (Some(events), Some(TokenSource::Events)),
            (None, None, false) => (None, None),
        };
    let (input_tokens, input_tokens_source) =
        match (usage.and_then(|u| u.input_tokens), counted_input) {
            (Some(n), _) => (Some(n), Some(TokenSource::Usage)),
            (None, Some(c)) => (Some(c.n), Some(c.source)),
            (None, None) => (None, None),
        };
    let ttft = tl.first.map(|f| f.saturating_duration_since(t_arrival));
    let ttfo = tl
        .first_answer
        .map(|f| f.saturating_duration_since(t_arrival));
    let tpot = match (tl.first, tl.last, output_tokens) {
        (Some(first), Some(last), Some(n)) if n >= 2 => {
            Some(last.saturating_duration_since(first) / u32::try_from(n - 1).unwrap_or(u32::MAX))
        }
        _ => None,
    };
    Derived {
        ttft,
        ttfo,
        tpot,
        output_tokens,
        output_tokens_source,
        input_tokens,
        input_tokens_source,
    }
}

/// Whether a stream of `events` content events whose text the estimate (o200k_base, not
/// the model's tokenizer) puts at `estimate` tokens carried one token per event, as vLLM,
/// SGLang and llama.cpp stream by default: then the event count is exact and the
/// estimate is not. Measured on llama-cpp-python's server (scripts/token-sources.py,
/// docs/METRICS.md "Counting without usage"): events exact in 40 of 40 streams, the estimate off
/// by one of 32 tokens in every one. Each event carries at least one token, so an estimate below the
/// event count is wrong; well above it (more than a quarter more), the events carry
/// several tokens each (speculative decoding, a gateway that batches) and the estimate is
/// the nearer one.
fn one_token_per_event(estimate: u64, events: u64) -> bool {
    events > 0 && estimate.saturating_mul(4) <= events.saturating_mul(5)
}

/// How a request ended (docs/DESIGN.md's outcomes). `proxy_failure` is set when the measuring
/// side answered or failed by itself (the proxy's 502/504; a client that could not
/// connect); `stream_error` when the stream or body carried an error object;
/// `unterminated` when a decoded stream never sent its dialect's terminal event.
pub fn outcome(
    proxy_failure: Option<Outcome>,
    status: Option<u16>,
    ending: Ending,
    stream_error: bool,
    unterminated: bool,
) -> Outcome {
    if let Some(o) = proxy_failure {
        return o;
    }
    if let Some(s) = status.filter(|s| *s >= 400) {
        return Outcome::from_status(s);
    }
    match ending {
        Ending::ClientGone => Outcome::ClientAbort,
        Ending::ShutdownCut => Outcome::ProxyError,
        Ending::IdleTimeout => Outcome::Timeout,
        Ending::UpstreamFailed => Outcome::UpstreamReset,
        Ending::Complete if stream_error => Outcome::UpstreamError,
        // A stream that closed cleanly at the HTTP level but never sent its terminal
        // event (`[DONE]`) was cut short upstream.
        Ending::Complete if unterminated => Outcome::UpstreamReset,
        Ending::Complete => Outcome::Ok,
    }
}

/// The body in one piece: the piece itself when it already is one (a small request body
/// is kept in a buffer of its own, a short response often comes in one frame), without a
/// copy.
fn joined(chunks: &[Bytes]) -> Bytes {
    match chunks {
        [one] => one.clone(),
        _ => {
            let mut out = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
            for c in chunks {
                out.extend_from_slice(c);
            }
            Bytes::from(out)
        }
    }
}

/// A finished request: its record, its inter-token gaps (µs, for the ITL histogram) and
/// what the request asked for as read from its body, so that nothing downstream parses
/// the body again for it.
pub struct Finished {
    pub record: RequestRecord,
    pub gaps: Vec<u32>,
    /// The dialect's output cap (`RequestInfo::max_tokens`), when the body said.
    pub max_tokens: Option<u64>,
}

impl Pending {
    /// The client's request body, when it was complete and within the inspection limit
    /// (for profile fingerprints). The capture stays in place for [`Pending::finish`].
    pub fn request_body(&mut self) -> Option<Bytes> {
        if self.request_capture.is_none()
            && let Some(mut rx) = self.request.take()
        {
            self.request_capture = rx.try_recv().ok();
        }
        let c = self.request_capture.as_ref()?;
        (c.complete && !c.overflow && !c.chunks.is_empty()).then(|| joined(&c.chunks))
    }

    /// The request as the client sent it, if its body was complete and within the limit.
    fn request_info(&mut self) -> (Option<RequestInfo>, u64) {
        // The tokenizer stage may have taken the capture off its channel already.
        let capture = match (self.request_capture.take(), self.request.take()) {
            (Some(capture), _) => capture,
            (None, Some(mut rx)) => match rx.try_recv() {
                Ok(capture) => capture,
                Err(_) => return (None, 0),
            },
            (None, None) => return (None, 0),
        };
        self.request_failed = capture.failed;
        self.uploaded_at = capture.completed_at;
        let info = (capture.complete && !capture.overflow && !capture.chunks.is_empty())
            .then(|| decode::inspect_request(self.api, &joined(&capture.chunks)))
            .flatten();
        (info, capture.bytes)
    }

    fn outcome(&self, stream_error: bool) -> Outcome {
        let unterminated = self.decoded && !self.decode_broken && !self.timeline.terminal;
        let ending = self.effective_ending();
        // A request whose own body broke and that got no answer (an HTTP/2 stream reset
        // for a length that does not match its body, say) failed by the client's doing.
        if self.request_failed
            && self.proxy_failure.is_none()
            && self.status.is_none()
            && ending == Ending::ClientGone
        {
            return Outcome::ClientError;
        }
        outcome(
            self.proxy_failure,
            self.status,
            ending,
            stream_error,
            unterminated,
        )
    }

    /// How the response ended for its client: one whose terminal event was written to the
    /// client is complete, whatever happened after it (clients stop reading at `[DONE]`,
    /// `message_stop` and the like, and may close before the upstream ends its body).
    fn effective_ending(&self) -> Ending {
        if self.terminal_delivered {
            Ending::Complete
        } else {
            self.ending
        }
    }

    /// When the response ended for its client: for a stream that went on (or failed)
    /// after its terminal event reached the client, at that event.
    fn client_end(&self) -> Instant {
        match self.timeline.terminal_at {
            Some(at) if self.terminal_delivered && self.ending != Ending::Complete => at,
            _ => self.ended_at,
        }
    }

    /// The engine's own timing: from the response (stream event or body) first, else from
    /// its headers.
    fn engine_split(
        &self,
        body: Option<&BodyInfo>,
        ttft_ms: Option<f64>,
        e2e_ms: f64,
    ) -> EngineSplit {
        let (timing, source) = match (
            self.timeline.engine.or(body.and_then(|b| b.engine)),
            self.engine_headers,
        ) {
            (Some(t), _) => (Some(t), EngineTimingSource::Response),
            (None, Some(t)) => (Some(t), EngineTimingSource::Headers),
            (None, None) => (None, EngineTimingSource::Response),
        };
        EngineSplit::new(timing, source, ttft_ms, e2e_ms)
    }

    /// Builds the record; also returns the inter-token gaps (µs) for the ITL histogram.
    pub fn finish(self) -> (RequestRecord, Vec<u32>) {
        let f = self.finish_all();
        (f.record, f.gaps)
    }

    /// [`Pending::finish`], with what else the request body said.
    pub fn finish_all(mut self) -> Finished {
        let (request, bytes_in) = self.request_info();
        let max_tokens = request.as_ref().and_then(|r| r.max_tokens);
        let body =
            (self.kind == StreamKind::Json && self.api != Api::Unknown && !self.body_overflow)
                .then(|| decode::parse_response_body(self.api, &joined(&self.body)))
                .flatten();
        let stream_error = self.timeline.error || body.as_ref().is_some_and(|b| b.error);
        let outcome = self.outcome(stream_error);
        let d = derive(
            self.t_arrival,
            &self.timeline,
            body.as_ref().and_then(|b| b.usage),
            self.counted_input,
            self.counted_output,
            self.decoded,
        );
        let Derived {
            ttft,
            ttfo,
            tpot,
            output_tokens,
            output_tokens_source,
            input_tokens,
            input_tokens_source,
        } = d;
        // The upload is the client's: the SLO judges from the end of the request body
        // (docs/DESIGN.md "Latencies"); a body that never completed is judged from the head.
        let upload = self
            .uploaded_at
            .map(|at| at.saturating_duration_since(self.t_arrival));
        let t_sent = self.t_arrival + upload.unwrap_or_default();
        let ttft_after_upload = self
            .timeline
            .first
            .map(|first| first.saturating_duration_since(t_sent));
        let mut gaps = std::mem::take(&mut self.timeline.gaps_us);
        let itl_ms = ItlSummary::from_gaps_us(&mut gaps);
        let e2e_ms = ms(self.client_end().saturating_duration_since(self.t_arrival));
        let e2e_after_upload_ms = ms(self.client_end().saturating_duration_since(t_sent));
        // The engine's parts explain the judged figures: from the end of the upload.
        let engine = self.engine_split(
            body.as_ref(),
            ttft_after_upload.map(ms),
            e2e_after_upload_ms,
        );
        let stream = self.kind == StreamKind::Sse
            || self.kind == StreamKind::Ndjson
            || request.as_ref().is_some_and(|r| r.stream);

        let record = RequestRecord {
            id: std::mem::take(&mut self.id),
            started_at: WallClock(self.started_at),
            model: request.and_then(|r| r.model),
            api: if self.tunnel {
                "upgrade"
            } else {
                self.api.as_str()
            },
            stream,
            status: self.status,
            outcome,
            ttft_ms: ttft.map(ms),
            ttfo_ms: ttfo.map(ms),
            tpot_ms: tpot.map(ms),
            e2e_ms,
            upload_ms: upload.map(ms),
            ttft_after_upload_ms: ttft_after_upload.map(ms),
            e2e_after_upload_ms,
            itl_ms,
            input_tokens,
            input_tokens_source,
            cached_input_tokens: self
                .timeline
                .cached_input_tokens
                .or(body.as_ref().and_then(|b| b.cached_input_tokens)),
            output_tokens,
            output_tokens_source,
            events: self.timeline.events,
            bytes_out: self.bytes_out,
            terminal_event: self.terminal_delivered,
            slo_class: "".into(),
            slo_met: None,
            slo_miss_reason: None,
            slo_miss_component: None,
            engine,
            clock: if self.kernel_clock {
                super::Clock::Kernel
            } else {
                super::Clock::User
            },
            finished_at: Some(self.client_end()),
            bytes_in: bytes_in.max(self.bytes_in),
            finish_reason: self
                .timeline
                .finish_reason
                .or(body.as_ref().and_then(|b| b.finish_reason)),
            decode_failed: self.decode_broken,
            arrival: self.arrival,
            tenant: self.tenant,
            slo_overrides: self.slo_overrides,
            slo_header_invalid: self.slo_header_invalid,
            slo_source: None,
            trace: self.traced.then_some(super::RequestTrace {
                started: self.started_at,
                parent: self.trace_parent,
            }),
            pairing: std::mem::take(&mut self.pairing),
        };
        Finished {
            record,
            gaps,
            max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_of(events: u64) -> Timeline {
        Timeline {
            events,
            ..Timeline::default()
        }
    }

    fn output(events: u64, counted: Option<TokenCount>) -> (Option<u64>, Option<TokenSource>) {
        let d = derive(
            Instant::now(),
            &stream_of(events),
            None,
            None,
            counted,
            true,
        );
        (d.output_tokens, d.output_tokens_source)
    }

    #[test]
    fn an_estimate_near_the_event_count_gives_way_to_the_events() {
        let estimate = |n| {
            Some(TokenCount {
                n,
                source: TokenSource::Estimate,
            })
        };
        // One token per event: the estimate within a quarter above, or below.
        for n in [31, 32, 33, 40] {
            assert_eq!(
                output(32, estimate(n)),
                (Some(32), Some(TokenSource::Events)),
                "{n}"
            );
        }
        // Several tokens per event: the estimate.
        assert_eq!(
            output(32, estimate(41)),
            (Some(41), Some(TokenSource::Estimate))
        );
        assert_eq!(
            output(10, estimate(30)),
            (Some(30), Some(TokenSource::Estimate))
        );
        // The model's own tokenizer always wins over events.
        let tokenized = Some(TokenCount {
            n: 33,
            source: TokenSource::Tokenizer,
        });
        assert_eq!(
            output(32, tokenized),
            (Some(33), Some(TokenSource::Tokenizer))
        );
        // No events (a body): the estimate stands.
        let d = derive(
            Instant::now(),
            &stream_of(0),
            None,
            None,
            estimate(12),
            false,
        );
        assert_eq!(d.output_tokens_source, Some(TokenSource::Estimate));
    }
}
