//! Turning what the data path saw into a [`RequestRecord`], per the normative
//! definitions in DESIGN.md. Runs on the aggregator, off the request's hot path: this is
//! where request and non-streaming response bodies are parsed.

use std::time::Duration;

use bytes::Bytes;

use super::{
    record::{ItlSummary, Outcome, RequestRecord, TokenSource},
    tap::{Ending, Pending},
};
use crate::decode::{self, Api, RequestInfo, StreamKind};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn joined(chunks: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        out.extend_from_slice(c);
    }
    out
}

impl Pending {
    /// The request as the client sent it, if its body was complete and within the limit.
    fn request_info(&mut self) -> (Option<RequestInfo>, u64) {
        let Some(mut rx) = self.request.take() else {
            return (None, 0);
        };
        let Ok(capture) = rx.try_recv() else {
            return (None, 0);
        };
        let info = (capture.complete && !capture.overflow && !capture.chunks.is_empty())
            .then(|| decode::inspect_request(self.api, &joined(&capture.chunks)))
            .flatten();
        (info, capture.bytes)
    }

    fn outcome(&self, stream_error: bool) -> Outcome {
        if let Some(o) = self.proxy_failure {
            return o;
        }
        if self.status.is_some_and(|s| s >= 400) {
            return Outcome::UpstreamError;
        }
        match self.ending {
            Ending::ClientGone => Outcome::ClientAbort,
            Ending::ShutdownCut => Outcome::ProxyError,
            Ending::IdleTimeout => Outcome::Timeout,
            Ending::UpstreamFailed => Outcome::UpstreamReset,
            Ending::Complete if stream_error => Outcome::UpstreamError,
            // A stream that closed cleanly at the HTTP level but never sent its terminal
            // event (`[DONE]`) was cut short upstream.
            Ending::Complete if self.decoded && !self.decode_broken && !self.timeline.terminal => {
                Outcome::UpstreamReset
            }
            Ending::Complete => Outcome::Ok,
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
        let usage = self.timeline.usage.or(body.as_ref().and_then(|b| b.usage));

        let (output_tokens, output_tokens_source) =
            match (usage.and_then(|u| u.output_tokens), self.decoded) {
                (Some(n), _) => (Some(n), Some(TokenSource::Usage)),
                (None, true) => (Some(self.timeline.events), Some(TokenSource::Events)),
                (None, false) => (None, None),
            };
        let input_tokens = usage.and_then(|u| u.input_tokens);

        let tl = &self.timeline;
        let ttft = tl
            .first
            .map(|f| f.saturating_duration_since(self.t_arrival));
        let ttfo = tl
            .first_answer
            .map(|f| f.saturating_duration_since(self.t_arrival));
        let tpot = match (tl.first, tl.last, output_tokens) {
            (Some(first), Some(last), Some(n)) if n >= 2 => Some(
                last.saturating_duration_since(first) / u32::try_from(n - 1).unwrap_or(u32::MAX),
            ),
            _ => None,
        };
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
            e2e_ms: ms(self.ended_at.saturating_duration_since(self.t_arrival)),
            itl_ms,
            input_tokens,
            input_tokens_source: input_tokens.map(|_| TokenSource::Usage),
            output_tokens,
            output_tokens_source,
            events: self.timeline.events,
            bytes_out: self.bytes_out,
            slo_class: String::new(),
            slo_met: None,
            slo_miss_reason: None,
            finished_at: Some(self.ended_at),
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
