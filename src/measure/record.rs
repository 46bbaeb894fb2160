//! The finished per-request record: what the admin API serves, what the metrics and the
//! access log are made from, and (later) what profiles are written from. It holds numbers
//! and bounded labels only: never content, header values or client addresses.

use std::time::Instant;

use serde::Serialize;

/// How a request ended, as docs/DESIGN.md defines it. Closed set: safe as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    UpstreamError,
    UpstreamReset,
    ClientAbort,
    Timeout,
    ProxyError,
    /// The request's own fault: a malformed, incomplete or too slow request caught by the
    /// proxy, or an upstream 4xx caused by the request. Excluded from attainment.
    ClientError,
    /// The system refused the work (429, 503, or the proxy's own admission limits): a miss,
    /// reported as the rejection rate.
    Rejected,
}

pub use crate::slo::DEFAULT_CLIENT_ERROR_STATUSES;

/// Who a failed outcome is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    Client,
    Upstream,
    Proxy,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::UpstreamError,
        Outcome::UpstreamReset,
        Outcome::ClientAbort,
        Outcome::Timeout,
        Outcome::ProxyError,
        Outcome::ClientError,
        Outcome::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamReset => "upstream_reset",
            Outcome::ClientAbort => "client_abort",
            Outcome::Timeout => "timeout",
            Outcome::ProxyError => "proxy_error",
            Outcome::ClientError => "client_error",
            Outcome::Rejected => "rejected",
        }
    }

    /// The outcome of an upstream error status (≥ 400) by default: 429 and 503 are the
    /// system refusing the work ([`Outcome::Rejected`]), the 4xx of
    /// [`DEFAULT_CLIENT_ERROR_STATUSES`] the request's own fault ([`Outcome::ClientError`]),
    /// every other one an [`Outcome::UpstreamError`]. `[slo] client_error_statuses` changes
    /// the client list when the request is judged ([`crate::measure::verdict::judge`]).
    pub fn from_status(status: u16) -> Outcome {
        match status {
            429 | 503 => Outcome::Rejected,
            s if DEFAULT_CLIENT_ERROR_STATUSES.contains(&s) => Outcome::ClientError,
            _ => Outcome::UpstreamError,
        }
    }

    pub fn fault(self) -> Fault {
        match self {
            Outcome::Ok => Fault::None,
            Outcome::ClientAbort | Outcome::ClientError => Fault::Client,
            Outcome::UpstreamError
            | Outcome::UpstreamReset
            | Outcome::Timeout
            | Outcome::Rejected => Fault::Upstream,
            Outcome::ProxyError => Fault::Proxy,
        }
    }
}

/// The bounded `status_class` label of a response status: `1xx` .. `5xx`, or `none` when
/// no response head was sent.
pub fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(100..=199) => "1xx",
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        _ => "none",
    }
}

/// What a request's span is made from (`[otlp] traces`): the wall-clock start and the
/// caller's trace context, when it sent a valid `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTrace {
    pub started: std::time::SystemTime,
    pub parent: Option<super::TraceParent>,
}

/// Where a token count came from; the record always says. In order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The upstream's own `usage`.
    Usage,
    /// The model's configured tokenizer over the text (`[tokenizer].models`).
    Tokenizer,
    /// The embedded o200k_base encoding over the text, or a tokenizer count extrapolated
    /// past the text limit.
    Estimate,
    /// The number of content-bearing events (a lower bound when events carry several tokens).
    Events,
}

impl TokenSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::Tokenizer => "tokenizer",
            TokenSource::Estimate => "estimate",
            TokenSource::Events => "events",
        }
    }
}

/// A count made by the proxy (tokenizer or estimate), with its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount {
    pub n: u64,
    pub source: TokenSource,
}

/// Per-request summary of the inter-token gaps, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ItlSummary {
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl ItlSummary {
    /// Nearest-rank percentiles over gaps given in microseconds; sorts in place.
    pub fn from_gaps_us(gaps: &mut [u32]) -> Option<ItlSummary> {
        if gaps.is_empty() {
            return None;
        }
        gaps.sort_unstable();
        let rank = |q: f64| f64::from(gaps[crate::quantile::rank(gaps.len(), q) - 1]) / 1000.0;
        Some(ItlSummary {
            p50: rank(0.50),
            p95: rank(0.95),
            max: rank(1.0),
        })
    }
}

/// Which system answered a record's request: the one the client talks to, or a
/// candidate that was sent a mirrored copy (`[shadow]`, docs/SHADOW.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Every request the proxy forwards, mirrored or not.
    #[default]
    Primary,
    /// The candidate's answer to a mirrored copy; never sent to any client.
    Shadow,
    /// A replica of the primary's answer to the same copy (`shadow.secondary_url`): the
    /// primary's own noise. Never sent to any client.
    Secondary,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Primary => "primary",
            Target::Shadow => "shadow",
            Target::Secondary => "secondary",
        }
    }

    /// An answer to a mirrored copy (candidate or secondary), never the client's.
    pub fn is_copy(self) -> bool {
        self != Target::Primary
    }
}

/// Why a shadow answer was not read to its end although the candidate was still sending
/// it: the shadow, as the client of the copy, stopped reading. Closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShadowCut {
    /// The answer outgrew `shadow.max_answer_bytes`.
    TooLarge,
}

impl ShadowCut {
    pub fn as_str(self) -> &'static str {
        match self {
            ShadowCut::TooLarge => "too_large",
        }
    }
}

/// Whose targets a request was judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloSource {
    Class,
    Header,
}

/// Where an engine's own per-request timing came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineTimingSource {
    /// The response itself: vLLM's `metrics` object (final usage chunk or body), SGLang's
    /// `meta_info`.
    Response,
    /// The response headers (TGI's `x-queue-time`, `x-inference-time`).
    Headers,
}

/// A request's time split by the engine's own clock (docs/DESIGN.md, "Where the time
/// went"). Every part is `null` where the engine did not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineSplit {
    /// Waiting in the engine's queue before being scheduled.
    pub engine_queue_ms: Option<f64>,
    /// Scheduled to first token.
    pub engine_prefill_ms: Option<f64>,
    /// First token to last.
    pub engine_decode_ms: Option<f64>,
    /// Prefill and decode together (all an engine like TGI reports).
    pub engine_inference_ms: Option<f64>,
    /// The part of the recorded TTFT spent outside the engine's queue and prefill:
    /// network, API server, tokenization, gateways. For a response without TTFT (not
    /// streamed), the part of e2e outside the engine's queue and inference. Can be
    /// slightly negative where the engine's clock runs ahead of the proxy's.
    pub outside_engine_ms: Option<f64>,
    pub engine_timing_source: Option<EngineTimingSource>,
}

/// A part of a request's time, as [`EngineSplit`] divides it: what a miss is attributed
/// to (`slo_miss_component`). Closed set: safe as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    Queue,
    Prefill,
    Decode,
    /// Prefill and decode together, where the engine does not split them.
    Inference,
    OutsideEngine,
}

impl Component {
    pub const ALL: [Component; 5] = [
        Component::Queue,
        Component::Prefill,
        Component::Decode,
        Component::Inference,
        Component::OutsideEngine,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Component::Queue => "queue",
            Component::Prefill => "prefill",
            Component::Decode => "decode",
            Component::Inference => "inference",
            Component::OutsideEngine => "outside_engine",
        }
    }
}

/// How a record pairs with its mirror (serialized flat: `target`, `pair_id`, and on a
/// cut shadow answer `shadow_cut`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Pairing {
    pub target: Target,
    /// On a shadow record, the id of the primary request it mirrors; `null` on primary
    /// records (a mirrored primary is found by its own `id`).
    pub pair_id: Option<String>,
    /// On a shadow record whose answer the shadow stopped reading, why. Absent (not
    /// `null`) everywhere else, so that primary records keep the exact shape they had.
    #[serde(rename = "shadow_cut", skip_serializing_if = "Option::is_none")]
    pub cut: Option<ShadowCut>,
    /// A primary request a copy was taken of (it may still have been dropped).
    #[serde(skip)]
    pub mirrored: bool,
    /// On a copy: the request asked for a reproducible answer (`temperature` 0 or a
    /// `seed`), so its answers are compared word for word.
    #[serde(skip)]
    pub deterministic: bool,
}

impl EngineSplit {
    /// The split of a response whose engine said `timing`, given the proxy's TTFT and e2e.
    pub fn new(
        timing: Option<crate::decode::EngineTiming>,
        source: EngineTimingSource,
        ttft_ms: Option<f64>,
        e2e_ms: f64,
    ) -> EngineSplit {
        let Some(t) = timing else {
            return EngineSplit::default();
        };
        let ms = |us: Option<u64>| us.map(|us| us as f64 / 1000.0);
        let (queue, prefill, decode, inference) = (
            ms(t.queue_us),
            ms(t.prefill_us),
            ms(t.decode_us),
            ms(t.inference_us),
        );
        let outside_engine_ms = match (ttft_ms, queue, prefill, inference) {
            (Some(ttft), Some(q), Some(p), _) => Some(ttft - q - p),
            (None, Some(q), _, Some(i)) => Some(e2e_ms - q - i),
            _ => None,
        };
        EngineSplit {
            engine_queue_ms: queue,
            engine_prefill_ms: prefill,
            engine_decode_ms: decode,
            engine_inference_ms: inference,
            outside_engine_ms,
            engine_timing_source: Some(source),
        }
    }

    /// Whether the engine said anything about this request.
    pub fn is_known(&self) -> bool {
        self.engine_timing_source.is_some()
    }

    /// Each known part, in [`Component::ALL`]'s order.
    pub fn parts(&self) -> [(Component, Option<f64>); 5] {
        [
            (Component::Queue, self.engine_queue_ms),
            (Component::Prefill, self.engine_prefill_ms),
            (Component::Decode, self.engine_decode_ms),
            (Component::Inference, self.engine_inference_ms),
            (Component::OutsideEngine, self.outside_engine_ms),
        ]
    }

    /// The part that took the most time among `candidates` (a miss's component).
    pub fn largest(&self, candidates: &[Component]) -> Option<Component> {
        self.parts()
            .into_iter()
            .filter(|(c, _)| candidates.contains(c))
            .filter_map(|(c, v)| v.map(|v| (c, v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(c, _)| c)
    }
}

/// A wall-clock instant, serialized as RFC 3339 with milliseconds
/// (`2026-01-02T03:04:05.678Z`): formatted when a record is read, not when it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallClock(pub std::time::SystemTime);

impl std::fmt::Display for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        humantime::format_rfc3339_millis(self.0).fmt(f)
    }
}

impl Serialize for WallClock {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One finished request. The serialized field set is a contract with users' tooling.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    pub id: String,
    /// RFC 3339, from the wall clock at `t_arrival`.
    pub started_at: WallClock,
    pub model: Option<String>,
    pub api: &'static str,
    pub stream: bool,
    /// The status the client received (`null` if no response head was sent).
    pub status: Option<u16>,
    pub outcome: Outcome,
    pub ttft_ms: Option<f64>,
    /// Time to the first *answer* token (reasoning skipped), where the dialect tells.
    pub ttfo_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// From `t_arrival` to the end of the request body (the client's upload); `null`
    /// when the body never completed.
    pub upload_ms: Option<f64>,
    /// TTFT from the end of the request body: what the SLO judges, so that a slow upload
    /// is never counted against the upstream (docs/DESIGN.md "Latencies").
    pub ttft_after_upload_ms: Option<f64>,
    /// e2e from the end of the request body: what the SLO judges, likewise.
    pub e2e_after_upload_ms: f64,
    pub itl_ms: Option<ItlSummary>,
    pub input_tokens: Option<u64>,
    pub input_tokens_source: Option<TokenSource>,
    /// Input tokens the upstream served from its prefix cache (OpenAI
    /// `usage.prompt_tokens_details.cached_tokens`, Responses
    /// `usage.input_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`);
    /// `null` where it did not say.
    pub cached_input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub output_tokens_source: Option<TokenSource>,
    pub events: u64,
    /// Body bytes written to the client (after an upstream failure: everything the
    /// upstream sent; after a client abort: what the connection had flushed).
    pub bytes_out: u64,
    /// Whether the dialect's terminal event (`[DONE]`, `message_stop`, ...) was written to
    /// the client: a stream that delivered it is complete, even if the client then left.
    pub terminal_event: bool,
    /// The SLO class the request was held to (`default` when no class matched).
    pub slo_class: std::sync::Arc<str>,
    /// Whether it met its class's targets; `null` for client aborts (not counted).
    pub slo_met: Option<bool>,
    /// Why it missed: `ttft`, `tpot`, `e2e` or `error`.
    pub slo_miss_reason: Option<&'static str>,
    /// Where the time of a latency miss went, by the engine's own timings: the part that
    /// took the most time among those the broken target covers. `null` without engine
    /// timings and for error misses.
    pub slo_miss_component: Option<Component>,
    /// Where the request's time went by the engine's own clock.
    #[serde(flatten)]
    pub engine: EngineSplit,
    /// `kernel` when the arrival and every upstream read were timed by the kernel's
    /// receive stamps of their packets, `user` when any came from the process clock.
    pub clock: super::Clock,
    /// When the record was finished (monotonic), for windowed views; not serialized.
    #[serde(skip)]
    pub finished_at: Option<Instant>,
    /// Request body bytes received from the client; not part of the JSON contract.
    #[serde(skip)]
    pub bytes_in: u64,
    /// Normalized finish reason when the upstream reported one (`stop`, `length`,
    /// `tool_calls`, `content_filter`, `other`).
    pub finish_reason: Option<crate::decode::FinishReason>,
    /// Set when the response could not be decoded; the bytes still flowed.
    #[serde(skip)]
    pub decode_failed: bool,
    /// The load it arrived into.
    #[serde(skip)]
    pub arrival: super::Arrival,
    /// Salted hash of the tenant header value.
    #[serde(skip)]
    pub tenant: Option<u64>,
    /// Per-request targets from objective headers (`[slo] header_objectives`).
    #[serde(skip)]
    pub slo_overrides: crate::slo::Targets,
    /// Objective headers present with a value that is not a positive number (ignored).
    #[serde(skip)]
    pub slo_header_invalid: u8,
    /// Whose targets the verdict applied: `class`, or `header` when a per-request objective
    /// header set or changed one; `null` without a verdict class.
    pub slo_source: Option<SloSource>,
    /// Set when request spans are exported (`[otlp] traces`).
    #[serde(skip)]
    pub trace: Option<RequestTrace>,
    /// `target` (`primary` or `shadow`) and, for a shadow, `pair_id`.
    #[serde(flatten)]
    pub pairing: Pairing,
}

impl RequestRecord {
    /// Time per output chunk after the first, in ms: (last chunk − first chunk) / (chunks −
    /// 1), from TPOT's own span of time (t_last − t_first = TPOT × (output tokens − 1)).
    pub fn per_output_chunk_ms(&self) -> Option<f64> {
        let (tpot, tokens) = (self.tpot_ms?, self.output_tokens?);
        (self.events >= 2 && tokens >= 2)
            .then(|| tpot * (tokens - 1) as f64 / (self.events - 1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn started_at_reads_as_rfc3339_with_milliseconds() {
        let json = serde_json::to_value(super::example::record()).unwrap_or_default();
        assert_eq!(json["started_at"], "2026-01-02T03:04:05.678Z");
    }

    #[test]
    fn itl_percentiles_are_nearest_rank() {
        let mut gaps: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        let s = ItlSummary::from_gaps_us(&mut gaps).unwrap();
        assert_eq!((s.p50, s.p95, s.max), (50.0, 95.0, 100.0));
        let mut one = vec![1500];
        let s = ItlSummary::from_gaps_us(&mut one).unwrap();
        assert_eq!((s.p50, s.p95, s.max), (1.5, 1.5, 1.5));
        assert!(ItlSummary::from_gaps_us(&mut []).is_none());
    }

    #[test]
    fn token_sources_are_snake_case() {
        use TokenSource::*;
        for s in [Usage, Tokenizer, Estimate, Events] {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
    }

    #[test]
    fn error_statuses_map_to_outcomes() {
        use Outcome::*;
        let got: Vec<Outcome> = [400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 504]
            .into_iter()
            .map(Outcome::from_status)
            .collect();
        assert_eq!(
            got,
            [
                ClientError,
                ClientError,
                ClientError,
                ClientError,
                UpstreamError,
                ClientError,
                ClientError,
                Rejected,
                UpstreamError,
                UpstreamError,
                Rejected,
                UpstreamError
            ]
        );
    }

    #[test]
    fn status_classes_are_bounded() {
        let got: Vec<&str> = [
            None,
            Some(101),
            Some(200),
            Some(304),
            Some(429),
            Some(503),
            Some(999),
        ]
        .into_iter()
        .map(status_class)
        .collect();
        assert_eq!(got, ["none", "1xx", "2xx", "3xx", "4xx", "5xx", "none"]);
    }

    #[test]
    fn outcome_labels_are_snake_case() {
        for o in Outcome::ALL {
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(json, format!("\"{}\"", o.as_str()));
        }
    }

    #[test]
    fn only_a_cut_shadow_record_has_shadow_cut() {
        let primary = serde_json::to_value(example::record()).unwrap();
        assert!(primary.get("shadow_cut").is_none(), "{primary}");
        assert_eq!(primary["target"], "primary");
        let mut r = example::record();
        r.pairing.target = Target::Shadow;
        r.pairing.pair_id = Some("p".into());
        assert!(
            serde_json::to_value(&r)
                .unwrap()
                .get("shadow_cut")
                .is_none()
        );
        r.pairing.cut = Some(ShadowCut::TooLarge);
        let cut = serde_json::to_value(&r).unwrap();
        assert_eq!(cut["shadow_cut"], ShadowCut::TooLarge.as_str());
        assert_eq!(cut["target"], "shadow");
    }
}

/// A typical finished record, for tests across the crate.
#[cfg(test)]
pub(crate) mod example {
    use super::{Outcome, RequestRecord, TokenSource, WallClock};

    /// A record as the aggregator would hand it over.
    pub(crate) fn record() -> RequestRecord {
        RequestRecord {
            id: "req-CANARY-ID".into(),
            started_at: WallClock(
                std::time::SystemTime::UNIX_EPOCH
                    + std::time::Duration::from_millis(1_767_323_045_678),
            ),
            model: Some("llama".into()),
            api: "chat_completions",
            stream: true,
            status: Some(200),
            outcome: Outcome::Ok,
            ttft_ms: Some(12.345),
            ttfo_ms: None,
            tpot_ms: Some(3.21),
            e2e_ms: 100.06,
            upload_ms: Some(0.0),
            ttft_after_upload_ms: Some(12.345),
            e2e_after_upload_ms: 100.06,
            itl_ms: None,
            input_tokens: Some(40),
            input_tokens_source: Some(TokenSource::Usage),
            cached_input_tokens: None,
            output_tokens: Some(9),
            output_tokens_source: Some(TokenSource::Events),
            events: 9,
            bytes_out: 1000,
            terminal_event: false,
            slo_class: "interactive".into(),
            slo_met: Some(true),
            slo_miss_reason: None,
            slo_miss_component: None,
            engine: Default::default(),
            clock: super::super::Clock::User,
            finished_at: None,
            bytes_in: 10,
            finish_reason: None,
            decode_failed: false,
            arrival: Default::default(),
            tenant: Some(5),
            slo_overrides: Default::default(),
            slo_header_invalid: 0,
            slo_source: None,
            trace: None,
            pairing: Default::default(),
        }
    }
}
