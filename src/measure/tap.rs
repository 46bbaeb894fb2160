//! Per-request measurement state. It lives inside the response body wrapper, sees every
//! frame with the instant it was read, and keeps only small numbers plus (for
//! non-streaming JSON) cheap `Bytes` handles; parsing of whole bodies is left to the
//! aggregator. It emits exactly once: at end of stream, on error, or when dropped.

use std::time::{Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::{
    Recorder,
    body::RequestCapture,
    record::{Outcome, Pairing, ShadowCut, Target, TokenCount},
    sink::{Arrival, Held},
};
use crate::decode::{
    Api, EngineTiming, EventInfo, FinishReason, StreamDecoder, StreamKind, TextBuf, Usage,
};
use crate::slo::Targets;

/// The error a response body gives when no bytes arrived from the upstream within the
/// idle timeout (`upstream.idle_timeout`); the measurement books it as [`Ending::IdleTimeout`].
#[derive(Debug, thiserror::Error)]
#[error("upstream body idle for longer than {0:?}")]
pub struct IdleTimeout(pub std::time::Duration);

/// The error a response body gives when the upstream sent fewer bytes than
/// `upstream.min_body_rate` over its window; booked as [`Ending::IdleTimeout`] too: the
/// upstream held the stream without delivering it.
#[derive(Debug, thiserror::Error)]
#[error("upstream body slower than {rate} bytes/s over {window:?} ({got} bytes)")]
pub struct SlowBody {
    pub rate: u64,
    pub window: std::time::Duration,
    pub got: u64,
}

/// How the response ended, as seen by the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The body reached its end normally.
    Complete,
    /// The upstream connection failed mid-body (reset, close without terminator).
    UpstreamFailed,
    /// No body bytes arrived within the idle timeout.
    IdleTimeout,
    /// The client went away (its connection closed or the stream was reset).
    ClientGone,
    /// The proxy's drain deadline passed and the stream was cut.
    ShutdownCut,
}

/// Token events seen on a stream and when.
#[derive(Debug, Default)]
pub struct Timeline {
    pub first: Option<Instant>,
    /// First content-bearing event that is not reasoning-only (TTFO).
    pub first_answer: Option<Instant>,
    pub last: Option<Instant>,
    /// Gaps between consecutive content-bearing events, in microseconds.
    pub gaps_us: Vec<u32>,
    pub events: u64,
    pub usage: Option<Usage>,
    /// Input tokens the upstream served from its prefix cache, where it said.
    pub cached_input_tokens: Option<u64>,
    pub finish_reason: Option<FinishReason>,
    pub terminal: bool,
    /// When the dialect's terminal event was read.
    pub terminal_at: Option<Instant>,
    pub error: bool,
    /// The engine's own timing of the request, where an event carried it.
    pub engine: Option<EngineTiming>,
}

impl Timeline {
    /// Adds one decoded event read at `now` (also used by `goodput replay`'s client).
    pub fn on_event(&mut self, now: Instant, ev: EventInfo) {
        if ev.content {
            match self.last {
                None => self.first = Some(now),
                Some(last) => {
                    let gap = now.saturating_duration_since(last).as_micros();
                    self.gaps_us.push(u32::try_from(gap).unwrap_or(u32::MAX));
                }
            }
            self.last = Some(now);
            self.events += 1;
            if ev.answer && self.first_answer.is_none() {
                self.first_answer = Some(now);
            }
        }
        if let Some(u) = ev.usage {
            let prev = self.usage.unwrap_or_default();
            self.usage = Some(Usage {
                input_tokens: u.input_tokens.or(prev.input_tokens),
                output_tokens: u.output_tokens.or(prev.output_tokens),
            });
        }
        if ev.cached_input_tokens.is_some() {
            self.cached_input_tokens = ev.cached_input_tokens;
        }
        if ev.finish_reason.is_some() {
            self.finish_reason = ev.finish_reason;
        }
        if ev.engine.is_some() {
            self.engine = ev.engine;
        }
        if ev.terminal && self.terminal_at.is_none() {
            self.terminal_at = Some(now);
        }
        self.terminal |= ev.terminal;
        self.error |= ev.error;
    }
}

/// Everything the data path learnt about one request, handed to the aggregator.
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    pub t_arrival: Instant,
    pub started_at: SystemTime,
    pub api: Api,
    pub request: Option<oneshot::Receiver<RequestCapture>>,
    pub status: Option<u16>,
    pub kind: StreamKind,
    /// Set when the proxy itself answered (502/504) instead of the upstream.
    pub proxy_failure: Option<Outcome>,
    pub tunnel: bool,
    pub decoded: bool,
    pub decode_broken: bool,
    pub timeline: Timeline,
    pub body: Vec<Bytes>,
    pub body_overflow: bool,
    /// Body bytes written to the client.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// The dialect's terminal event was written to the client (not only read upstream).
    pub terminal_delivered: bool,
    pub ended_at: Instant,
    pub ending: Ending,
    pub arrival: Arrival,
    /// This request's body is long (by Content-Length), for the interference view.
    pub long_input: bool,
    /// Salted hash of the tenant header value.
    pub tenant: Option<u64>,
    /// Per-request SLO targets from `x-slo-*` headers (when enabled).
    pub slo_overrides: Targets,
    pub slo_header_invalid: u8,
    /// Whether the request's span is exported, and the caller's `traceparent`.
    pub traced: bool,
    pub trace_parent: Option<super::TraceParent>,
    /// The generated text, kept for counting because no usage was expected or came.
    pub output_text: Option<TextBuf>,
    /// The request body capture, once the tokenizer stage has taken it off its channel.
    pub request_capture: Option<RequestCapture>,
    /// The client's request body failed (read from the capture when the record is built).
    pub request_failed: bool,
    /// Primary or shadow, and the pair it belongs to.
    pub pairing: Pairing,
    /// When the request body was complete (read from the capture likewise).
    pub uploaded_at: Option<Instant>,
    /// Counts made by the tokenizer stage, used where the upstream reported none.
    pub counted_input: Option<TokenCount>,
    pub counted_output: Option<TokenCount>,
    /// The answer's bytes, up to `answer_room` of them, for comparing it with a mirrored
    /// copy's answer (decoded at record time, never on the data path): one buffer of
    /// their own ([`Tap::keep_answer`]), set when the measurement ends.
    pub answer: Vec<Bytes>,
    pub answer_room: u64,
    /// The engine's own timing of the request from its response headers (TGI).
    pub engine_headers: Option<EngineTiming>,
    /// Every time that went into the record (arrival, upstream reads) is a kernel receive
    /// stamp; false once one came from the process clock.
    pub kernel_clock: bool,
    /// A shadow copy's place, given up once its record is written (or it is dropped).
    pub held: Option<Held>,
}

/// What the layer learnt from the request head for the SLO and load views.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadInfo {
    pub long_input: bool,
    pub tenant: Option<u64>,
    pub slo_overrides: Targets,
    /// Objective headers present with a value that is not a positive number.
    pub slo_header_invalid: u8,
    /// Request spans are exported (`[otlp] traces`).
    pub traced: bool,
    /// A valid incoming `traceparent`, read only when `traced`.
    pub trace_parent: Option<super::TraceParent>,
}

/// Marks a response the proxy produced itself, with the outcome it stands for.
#[derive(Debug, Clone, Copy)]
pub struct ProxyFailure(pub Outcome);

/// The live measurement of one request.
#[derive(Debug)]
pub struct Tap {
    recorder: Recorder,
    pending: Option<Pending>,
    decoder: Option<StreamDecoder>,
    capture_limit: usize,
    captured: usize,
    /// Collect the generated text (up to this many bytes) of streams that will not carry
    /// usage; `None` when counting is off or usage is known to be coming.
    text_limit: Option<usize>,
    /// What reached the client, when the response body tracks it ([`Tap::delivered`]);
    /// otherwise everything read counts as written.
    delivered: Option<Delivered>,
    /// The answer's bytes so far, while they are kept ([`Tap::keep_answer`]).
    kept: BytesMut,
}

/// What of the response reached the client, as the response body saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub bytes: u64,
    /// Token events in those bytes.
    pub events: u64,
    pub terminal: bool,
}

impl Tap {
    pub fn new(
        recorder: Recorder,
        id: String,
        t_arrival: Instant,
        api: Api,
        request: oneshot::Receiver<RequestCapture>,
        capture_limit: usize,
        head: HeadInfo,
    ) -> Tap {
        let arrival = recorder.started(api.is_generation(), head.long_input);
        let pending = Pending {
            id,
            t_arrival,
            started_at: SystemTime::now(),
            api,
            request: Some(request),
            status: None,
            kind: StreamKind::Other,
            proxy_failure: None,
            tunnel: false,
            decoded: false,
            decode_broken: false,
            timeline: Timeline::default(),
            body: Vec::new(),
            body_overflow: false,
            bytes_out: 0,
            bytes_in: 0,
            terminal_delivered: false,
            ended_at: t_arrival,
            ending: Ending::ClientGone,
            arrival,
            long_input: head.long_input,
            tenant: head.tenant,
            slo_overrides: head.slo_overrides,
            slo_header_invalid: head.slo_header_invalid,
            traced: head.traced,
            trace_parent: head.trace_parent,
            output_text: None,
            request_capture: None,
            request_failed: false,
            uploaded_at: None,
            counted_input: None,
            counted_output: None,
            engine_headers: None,
            answer: Vec::new(),
            answer_room: 0,
            kernel_clock: true,
            pairing: Pairing::default(),
            held: None,
        };
        Tap {
            recorder,
            pending: Some(pending),
            decoder: None,
            capture_limit,
            captured: 0,
            text_limit: None,
            delivered: None,
            kept: BytesMut::new(),
        }
    }

    /// Token counting is on: keep up to `limit` bytes of generated text where the dialect
    /// reports usage only on request (OpenAI chat and completions).
    pub fn count_text(&mut self, limit: usize) {
        self.text_limit = Some(limit);
    }

    /// A copy of this request's body was taken for the shadow.
    pub fn mark_mirrored(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.pairing.mirrored = true;
        }
    }

    /// Keep the answer's bytes, up to `limit`, for its comparison with the copies'
    /// answers: nothing is decoded here. Past the limit none are kept (a cut answer is not
    /// compared). They are copied as they pass into one buffer of their own rather than
    /// held as handles to the frames: a frame is a slice of its reader's buffer (hyper's
    /// client for the copies, the relay for the primary), and a handle kept alive until
    /// the record makes the reader take a fresh buffer, and fault in fresh pages, for
    /// every read; the copy of an event's few hundred bytes costs far less.
    pub fn keep_answer(&mut self, limit: u64) {
        if let Some(p) = self.pending.as_mut() {
            p.answer_room = limit;
        }
    }

    /// This measurement is the shadow's answer to the primary request `pair_id`.
    pub fn shadow_of(&mut self, pair_id: String) {
        self.copy_of(Target::Shadow, pair_id);
    }

    /// This measurement is `target`'s answer to a copy of the primary request `pair_id`.
    pub fn copy_of(&mut self, target: Target, pair_id: String) {
        if let Some(p) = self.pending.as_mut() {
            p.pairing.target = target;
            p.pairing.pair_id = Some(pair_id);
        }
    }

    /// The copy asked for a reproducible answer (`temperature` 0 or a `seed`).
    pub fn deterministic(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.pairing.deterministic = true;
        }
    }

    /// The measurement holds `held` until its record is written. Dropped unfinished, it is
    /// then discarded rather than recorded: nobody was waiting for it, so it was abandoned
    /// (and `held` counts it lost).
    pub fn hold(&mut self, held: Held) {
        if let Some(p) = self.pending.as_mut() {
            p.held = Some(held);
        }
    }

    /// The shadow stopped reading this answer before its end, for `cut`.
    pub fn shadow_cut(&mut self, cut: ShadowCut) {
        if let Some(p) = self.pending.as_mut() {
            p.pairing.cut = Some(cut);
        }
    }

    /// A time of this request came from the process clock, not a kernel receive stamp.
    pub fn user_clock(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.kernel_clock = false;
        }
    }

    /// The upstream was asked for usage (by the client or by injection): no text needed.
    pub fn expect_usage(&mut self) {
        self.text_limit = None;
    }

    /// The response head is known: choose how its body will be decoded.
    pub fn on_head(
        &mut self,
        status: u16,
        content_type: Option<&str>,
        proxy_failure: Option<ProxyFailure>,
    ) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        p.status = Some(status);
        p.kind = StreamKind::from_content_type(content_type);
        p.proxy_failure = proxy_failure.map(|f| f.0);
        self.decoder = StreamDecoder::new(p.api, p.kind);
        p.decoded = self.decoder.is_some();
        // The other dialects always report usage at the end of the stream: collecting
        // their text would only help streams cut short, not worth its cost.
        if let (Some(limit), Some(decoder)) = (self.text_limit, self.decoder.as_mut())
            && matches!(p.api, Api::ChatCompletions | Api::Completions)
        {
            decoder.collect_text(limit);
        }
    }

    /// The engine's own timing of the request, from the response head (TGI's headers).
    pub fn on_engine_headers(&mut self, timing: Option<EngineTiming>) {
        if let Some(p) = self.pending.as_mut() {
            p.engine_headers = timing;
        }
    }

    /// The response was switched to a tunnel (HTTP Upgrade): record e2e and bytes only.
    pub fn on_tunnel(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.tunnel = true;
        }
    }

    /// One body frame, with the instant it was read from the upstream.
    pub fn on_data(&mut self, now: Instant, data: &Bytes) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        p.bytes_out += data.len() as u64;
        if p.answer_room > 0 {
            if data.len() as u64 <= p.answer_room {
                p.answer_room -= data.len() as u64;
                self.kept.extend_from_slice(data);
            } else {
                p.answer_room = 0;
                self.kept = BytesMut::new();
            }
        }
        if let Some(decoder) = self.decoder.as_mut() {
            let timeline = &mut p.timeline;
            decoder.feed(data, |ev| timeline.on_event(now, ev));
        } else if p.kind == StreamKind::Json && p.api != Api::Unknown && !p.body_overflow {
            self.captured += data.len();
            if self.captured <= self.capture_limit {
                p.body.push(data.clone());
            } else {
                p.body_overflow = true;
                p.body = Vec::new();
            }
        }
    }

    /// Adds tunnelled byte counts (HTTP Upgrade) before the tap ends.
    pub fn add_tunnel_bytes(&mut self, to_client: u64, from_client: u64) {
        if let Some(p) = self.pending.as_mut() {
            p.bytes_out += to_client;
            p.bytes_in += from_client;
        }
    }

    /// Token events read so far.
    pub fn events(&self) -> u64 {
        self.pending.as_ref().map_or(0, |p| p.timeline.events)
    }

    /// Whether the dialect's terminal event has been read.
    pub fn terminal_seen(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.timeline.terminal)
    }

    /// What reached the client so far; the record takes the last word given before it ends.
    pub fn delivered(&mut self, delivered: Delivered) {
        self.delivered = Some(delivered);
    }

    /// Ends the measurement and hands it to the aggregator. Later calls do nothing.
    pub fn finish(&mut self, now: Instant, ending: Ending) {
        let Some(mut p) = self.pending.take() else {
            return;
        };
        match self.delivered {
            Some(d) => {
                p.bytes_out = d.bytes;
                p.terminal_delivered = d.terminal;
                // Events read but never written (the client left first) are not counted;
                // a complete body's last event may be completed only by its end, below.
                if ending != Ending::Complete {
                    p.timeline.events = p.timeline.events.min(d.events);
                }
            }
            None => p.terminal_delivered = p.timeline.terminal,
        }
        if let Some(decoder) = self.decoder.as_mut() {
            if ending == Ending::Complete {
                let timeline = &mut p.timeline;
                decoder.finish(|ev| timeline.on_event(now, ev));
            }
            p.decode_broken = decoder.is_broken();
            p.output_text = decoder.take_text();
        }
        if !self.kept.is_empty() {
            p.answer = vec![std::mem::take(&mut self.kept).freeze()];
        }
        p.ended_at = now;
        p.ending = ending;
        self.recorder.ended(p.api.is_generation(), p.long_input);
        self.recorder.submit(p);
    }

    /// Ends the measurement without a record (a shadow copy that was never answered);
    /// hands back its held place, for the caller to account for.
    pub fn discard(&mut self) -> Option<Held> {
        let mut p = self.pending.take()?;
        self.recorder.ended(p.api.is_generation(), p.long_input);
        p.held.take()
    }

    /// Whether a response head was seen.
    pub fn has_head(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.status.is_some())
    }

    /// How a stream that stopped without reaching its end is attributed.
    pub fn dropped_ending(&self) -> Ending {
        if self.recorder.is_cutting() {
            Ending::ShutdownCut
        } else {
            Ending::ClientGone
        }
    }

    /// Moves the measurement into a new tap (to follow a tunnel), leaving this one inert.
    pub fn detach(&mut self) -> Tap {
        Tap {
            recorder: self.recorder.clone(),
            pending: self.pending.take(),
            decoder: self.decoder.take(),
            capture_limit: self.capture_limit,
            captured: self.captured,
            text_limit: self.text_limit,
            delivered: self.delivered.take(),
            kept: std::mem::take(&mut self.kept),
        }
    }

    pub fn is_finished(&self) -> bool {
        self.pending.is_none()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        // A held measurement dropped unfinished was abandoned (a copy whose task ended
        // with the shadow's runtime): its place counts the loss.
        if self.pending.as_ref().is_some_and(|p| p.held.is_some()) {
            drop(self.discard());
            return;
        }
        // Dropped before the response head or before its end: the client went away (or the
        // proxy cut the stream at shutdown). Recorded all the same.
        let ending = self.dropped_ending();
        self.finish(Instant::now(), ending);
    }
}
