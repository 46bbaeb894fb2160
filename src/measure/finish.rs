//! Turning what the data path saw into a [`RequestRecord`], per the normative
//! definitions in DESIGN.md. Runs on the aggregator, off the request's hot path: this is
//! where request and non-streaming response bodies are parsed.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    record::{ItlSummary, Outcome, RequestRecord, TokenCount, TokenSource},
    tap::{Ending, Pending, Timeline},
};
use crate::decode::{self, Api, RequestInfo, StreamKind, Usage};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The numbers DESIGN.md defines for one response, derived from what was seen of it by
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
    // for: the events say more.
    let events = tl.events;
    let counted = counted_output.filter(|c| c.n > 0 || events == 0);
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

/// How a request ended (DESIGN.md's outcomes). `proxy_failure` is set when the measuring
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

fn joined(chunks: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        out.extend_from_slice(c);
    }
    out
}

impl Pending {
    /// The client's request body, when it was complete and within the inspection limit
    /// (for profile fingerprints). The capture stays in place for [`Pending::finish`].
    pub fn request_body(&mut self) -> Option<Vec<u8>> {
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
        let info = (capture.complete && !capture.overflow && !capture.chunks.is_empty())
            .then(|| decode::inspect_request(self.api, &joined(&capture.chunks)))
            .flatten();
        (info, capture.bytes)
    }

    fn outcome(&self, stream_error: bool) -> Outcome {
        let unterminated = self.decoded && !self.decode_broken && !self.timeline.terminal;
        outcome(
            self.proxy_failure,
            self.status,
            self.effective_ending(),
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

    /// Builds the record; also returns the inter-token gaps (µs) for the ITL histogram.
    pub fn finish(mut self) -> (RequestRecord, Vec<u32>) {
        let (request, bytes_in) = self.request_info();
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
        let mut gaps = std::mem::take(&mut self.timeline.gaps_us);
        let itl_ms = ItlSummary::from_gaps_us(&mut gaps);
        let stream = self.kind == StreamKind::Sse
            || self.kind == StreamKind::Ndjson
            || request.as_ref().is_some_and(|r| r.stream);

        let record = RequestRecord {
            id: std::mem::take(&mut self.id),
            started_at: humantime::format_rfc3339_millis(self.started_at).to_string(),
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
            e2e_ms: ms(self.client_end().saturating_duration_since(self.t_arrival)),
            itl_ms,
            input_tokens,
            input_tokens_source,
            output_tokens,
            output_tokens_source,
            events: self.timeline.events,
            bytes_out: self.bytes_out,
            terminal_event: self.terminal_delivered,
            slo_class: String::new(),
            slo_met: None,
            slo_miss_reason: None,
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
        };
        (record, gaps)
    }
}
