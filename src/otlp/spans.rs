//! The trace side of the export: one server span per generation request, built by the
//! aggregator from the finished record (timings, token counts, outcome, SLO class and
//! verdict, model, API — never content or header values), queued on a bounded channel and
//! sent in batches by its own task. A full queue drops the span and counts it; nothing
//! waits.

use std::{borrow::Cow, time::Duration};

use opentelemetry::{
    InstrumentationScope, KeyValue, Value,
    trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::mpsc;

use super::{Health, semconv as sc};
use crate::{
    measure::{Fault, RequestRecord},
    metrics::DropReasonLabel,
};

/// How long a batch waits to fill up before it is sent anyway (the SDK's
/// `OTEL_BSP_SCHEDULE_DELAY` default).
pub const BATCH_DELAY: Duration = Duration::from_secs(5);

/// Longest model name put on a span (names are client-supplied).
const MAX_MODEL_LEN: usize = 256;

/// The aggregator's end of the span queue.
pub struct SpanQueue {
    tx: mpsc::Sender<SpanData>,
    scope: InstrumentationScope,
    dropped: Family<DropReasonLabel, Counter>,
}

impl SpanQueue {
    pub fn new(
        capacity: usize,
        scope: InstrumentationScope,
        dropped: Family<DropReasonLabel, Counter>,
    ) -> (SpanQueue, mpsc::Receiver<SpanData>) {
        let (tx, rx) = mpsc::channel(capacity);
        (SpanQueue { tx, scope, dropped }, rx)
    }

    /// Queues the request's span, unless its caller's trace is not sampled.
    pub fn push(&self, r: &RequestRecord, common: &[KeyValue], verdict: &'static str) {
        let Some(span) = span_of(r, common, verdict, &self.scope) else {
            return;
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(span) {
            self.dropped
                .get_or_create(&DropReasonLabel {
                    reason: "queue_full",
                })
                .inc();
        }
    }
}

/// The span of a finished request; `None` when it was not traced or the caller's
/// `traceparent` says the trace is not sampled (parent-based sampling).
pub fn span_of(
    r: &RequestRecord,
    common: &[KeyValue],
    verdict: &'static str,
    scope: &InstrumentationScope,
) -> Option<SpanData> {
    let trace = r.trace?;
    let (trace_id, parent_span_id, remote) = match trace.parent {
        Some(p) if !p.sampled() => return None,
        Some(p) => (
            TraceId::from_bytes(p.trace_id),
            SpanId::from_bytes(p.parent_id),
            true,
        ),
        None => (new_trace_id(), SpanId::INVALID, false),
    };
    let span_context = SpanContext::new(
        trace_id,
        new_span_id(),
        TraceFlags::SAMPLED,
        false,
        TraceState::NONE,
    );
    let operation = common
        .iter()
        .find(|kv| kv.key.as_str() == sc::OPERATION_NAME)
        .map(|kv| kv.value.as_str().into_owned())
        .unwrap_or_default();
    let model = r.model.as_deref().map(truncate);
    let name = match model {
        Some(m) => format!("{operation} {m}"),
        None => operation,
    };
    let end_time = trace.started + Duration::from_secs_f64(r.e2e_ms.max(0.0) / 1000.0);
    Some(SpanData {
        span_context,
        parent_span_id,
        parent_span_is_remote: remote,
        span_kind: SpanKind::Server,
        name: Cow::Owned(name),
        start_time: trace.started,
        end_time: end_time.max(trace.started),
        attributes: attributes(r, common, verdict),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: status(r),
        instrumentation_scope: scope.clone(),
    })
}

fn attributes(r: &RequestRecord, common: &[KeyValue], verdict: &'static str) -> Vec<KeyValue> {
    let mut a = Vec::with_capacity(common.len() + 24);
    // The span carries the model as sent, not the bounded metric label.
    a.extend(
        common
            .iter()
            .filter(|kv| kv.key.as_str() != sc::REQUEST_MODEL)
            .cloned(),
    );
    if let Some(m) = r.model.as_deref() {
        a.push(KeyValue::new(sc::REQUEST_MODEL, truncate(m).to_owned()));
    }
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    if let Some(n) = r.input_tokens {
        a.push(KeyValue::new(sc::USAGE_INPUT_TOKENS, int(n)));
    }
    if let Some(n) = r.output_tokens {
        a.push(KeyValue::new(sc::USAGE_OUTPUT_TOKENS, int(n)));
    }
    if let Some(n) = r.cached_input_tokens {
        a.push(KeyValue::new(sc::USAGE_CACHE_READ_INPUT_TOKENS, int(n)));
    }
    if let Some(f) = r.finish_reason {
        a.push(KeyValue::new(
            sc::RESPONSE_FINISH_REASONS,
            Value::Array(vec![opentelemetry::StringValue::from(f.as_str())].into()),
        ));
    }
    if r.outcome != crate::measure::Outcome::Ok {
        a.push(KeyValue::new(sc::ERROR_TYPE, r.outcome.as_str()));
    }
    if let Some(s) = r.status {
        a.push(KeyValue::new(sc::HTTP_STATUS, i64::from(s)));
    }
    a.push(KeyValue::new(sc::G_REQUEST_ID, r.id.clone()));
    a.push(KeyValue::new(sc::G_API, r.api));
    a.push(KeyValue::new(sc::G_STREAM, r.stream));
    a.push(KeyValue::new(sc::G_OUTCOME, r.outcome.as_str()));
    a.push(KeyValue::new(sc::G_CLASS, r.slo_class.clone()));
    a.push(KeyValue::new(sc::G_VERDICT, verdict));
    if let Some(reason) = r.slo_miss_reason {
        a.push(KeyValue::new(sc::G_MISS_REASON, reason));
    }
    for (key, v) in [
        (sc::G_TTFT_MS, r.ttft_ms),
        (sc::G_TTFO_MS, r.ttfo_ms),
        (sc::G_TPOT_MS, r.tpot_ms),
        (sc::G_E2E_MS, Some(r.e2e_ms)),
        (sc::G_ITL_P50_MS, r.itl_ms.map(|i| i.p50)),
        (sc::G_ITL_P95_MS, r.itl_ms.map(|i| i.p95)),
        // The conventions' own name, in seconds.
        (
            sc::RESPONSE_TIME_TO_FIRST_CHUNK,
            r.ttft_ms.map(|ms| ms / 1000.0),
        ),
        (sc::G_ENGINE_QUEUE_MS, r.engine.engine_queue_ms),
        (sc::G_ENGINE_PREFILL_MS, r.engine.engine_prefill_ms),
        (sc::G_ENGINE_DECODE_MS, r.engine.engine_decode_ms),
        (sc::G_OUTSIDE_ENGINE_MS, r.engine.outside_engine_ms),
    ] {
        if let Some(v) = v {
            a.push(KeyValue::new(key, v));
        }
    }
    if let Some(s) = r.input_tokens_source {
        a.push(KeyValue::new(sc::G_INPUT_SOURCE, s.as_str()));
    }
    if let Some(s) = r.output_tokens_source {
        a.push(KeyValue::new(sc::G_OUTPUT_SOURCE, s.as_str()));
    }
    a.push(KeyValue::new(sc::G_EVENTS, int(r.events)));
    a.push(KeyValue::new(sc::G_BYTES_OUT, int(r.bytes_out)));
    a
}

/// As HTTP server spans do: the request's own fault (a client error or abort) leaves the
/// status unset; a failure of the system behind the proxy is an error.
fn status(r: &RequestRecord) -> Status {
    match r.outcome.fault() {
        Fault::None | Fault::Client => Status::Unset,
        Fault::Upstream | Fault::Proxy => Status::error(r.outcome.as_str()),
    }
}

fn truncate(model: &str) -> &str {
    let mut end = model.len().min(MAX_MODEL_LEN);
    while !model.is_char_boundary(end) {
        end -= 1;
    }
    &model[..end]
}

fn new_trace_id() -> TraceId {
    loop {
        let id: u128 = rand::random();
        if id != 0 {
            return TraceId::from(id);
        }
    }
}

fn new_span_id() -> SpanId {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return SpanId::from(id);
        }
    }
}

/// Sends queued spans in batches of up to `batch_size`, a partial batch after
/// [`BATCH_DELAY`], until the queue is closed and drained.
pub async fn run(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: SpanExporter,
    batch_size: usize,
    timeout: Duration,
    mut health: Health,
    dropped: Family<DropReasonLabel, Counter>,
) {
    loop {
        let mut batch = Vec::with_capacity(batch_size);
        if rx.recv_many(&mut batch, batch_size).await == 0 {
            break;
        }
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < batch_size {
            let want = batch_size - batch.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, want)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = batch.len() as u64;
        let result = tokio::time::timeout(timeout, exporter.export(batch))
            .await
            .map_err(|_| opentelemetry_sdk::error::OTelSdkError::Timeout(timeout))
            .and_then(|r| r);
        if result.is_err() {
            dropped
                .get_or_create(&DropReasonLabel {
                    reason: "export_failed",
                })
                .inc_by(n);
        }
        health.report(result);
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::measure::{Outcome, RequestTrace, TraceParent};

    fn scope() -> InstrumentationScope {
        InstrumentationScope::builder("test").build()
    }

    fn traced(parent: Option<TraceParent>) -> RequestRecord {
        let mut r = crate::measure::record::example::record();
        r.trace = Some(RequestTrace {
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
            parent,
        });
        r
    }

    #[test]
    fn untraced_and_unsampled_requests_have_no_span() {
        let mut r = traced(None);
        r.trace = None;
        assert!(span_of(&r, &[], "met", &scope()).is_none());
        let unsampled = TraceParent {
            trace_id: [1; 16],
            parent_id: [2; 8],
            flags: 0,
        };
        assert!(span_of(&traced(Some(unsampled)), &[], "met", &scope()).is_none());
    }

    #[test]
    fn a_sampled_caller_is_the_parent() {
        let p = TraceParent {
            trace_id: [1; 16],
            parent_id: [2; 8],
            flags: 1,
        };
        let s = span_of(&traced(Some(p)), &[], "met", &scope()).unwrap();
        assert_eq!(s.span_context.trace_id(), TraceId::from_bytes([1; 16]));
        assert_eq!(s.parent_span_id, SpanId::from_bytes([2; 8]));
        assert!(s.parent_span_is_remote);
        assert_ne!(s.span_context.span_id(), SpanId::INVALID);
        let root = span_of(&traced(None), &[], "met", &scope()).unwrap();
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        assert_ne!(root.span_context.trace_id(), TraceId::INVALID);
    }

    #[test]
    fn timing_status_and_bounded_names() {
        let mut r = traced(None);
        r.e2e_ms = 1500.0;
        r.model = Some("m".repeat(1000));
        r.outcome = Outcome::Timeout;
        let common = [KeyValue::new(sc::OPERATION_NAME, "chat")];
        let s = span_of(&r, &common, "missed", &scope()).unwrap();
        assert_eq!(
            s.end_time.duration_since(s.start_time).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(s.name.len(), "chat ".len() + MAX_MODEL_LEN);
        assert_eq!(s.status, Status::error("timeout"));
        assert!(
            s.attributes
                .iter()
                .any(|kv| kv.key.as_str() == sc::ERROR_TYPE && kv.value.as_str() == "timeout")
        );
        r.outcome = Outcome::ClientAbort;
        assert_eq!(
            span_of(&r, &common, "excluded", &scope()).unwrap().status,
            Status::Unset
        );
    }
}
