//! OpenTelemetry export over real sockets: the simulator as upstream, a real HTTP client,
//! and an in-test OTLP/HTTP receiver (a hyper server decoding the protobuf it gets with the
//! OpenTelemetry proto types) that checks the metrics and spans match the requests sent
//! through the proxy. Bad paths: a collector that hangs, refuses connections or answers
//! 503 never slows or breaks proxying, and its failures are counted; `[otlp]` cannot
//! change on reload.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers: a failed set-up or check must stop the test"
)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::{harness::*, temp::TempDir};
use bytes::Bytes;
use goodput::{
    config::{self, Config, Overrides},
    run::{self, ConfigSource, ReloadError, Running},
};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{HistogramDataPoint, Metric, metric},
    trace::v1::Span,
};
use prost::Message;
use serde_json::Value;
use tokio::{net::TcpListener, sync::mpsc};

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Accept,
    Status(u16),
    /// Reads the request, never answers.
    Hang,
}

/// One export request as the receiver decoded it.
enum Got {
    Metrics(ExportMetricsServiceRequest),
    Traces(ExportTraceServiceRequest),
}

/// What the receiver saw of each request besides the payload.
#[derive(Default)]
struct Seen {
    content_types: Vec<String>,
    api_keys: Vec<String>,
    bodies: Vec<Bytes>,
}

struct Receiver {
    addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<Got>,
    seen: Arc<Mutex<Seen>>,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                let seen = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let tx = tx.clone();
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(receive(req, mode, &tx, &seen).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver { addr, rx, seen }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for export requests until `done` says the collected ones are enough.
    async fn until<T>(&mut self, what: &str, mut done: impl FnMut(&Got) -> Option<T>) -> T {
        let deadline = Duration::from_secs(20);
        tokio::time::timeout(deadline, async {
            loop {
                let got = self.rx.recv().await.unwrap();
                if let Some(t) = done(&got) {
                    return t;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {what} within {deadline:?}"))
    }
}

async fn receive(
    req: Request<Incoming>,
    mode: Mode,
    tx: &mpsc::UnboundedSender<Got>,
    seen: &Mutex<Seen>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (content_type, api_key) = (header("content-type"), header("x-api-key"));
    let body = req.into_body().collect().await.unwrap().to_bytes();
    {
        let mut s = seen.lock().unwrap();
        s.content_types.push(content_type);
        s.api_keys.push(api_key);
        s.bodies.push(body.clone());
    }
    match mode {
        Mode::Hang => std::future::pending::<()>().await,
        Mode::Status(code) => {
            return Response::builder()
                .status(code)
                .body(Full::new(Bytes::new()))
                .unwrap();
        }
        Mode::Accept => {}
    }
    let got = match path.as_str() {
        "/v1/metrics" => Got::Metrics(ExportMetricsServiceRequest::decode(body).unwrap()),
        "/v1/traces" => Got::Traces(ExportTraceServiceRequest::decode(body).unwrap()),
        other => panic!("export to an unexpected path {other}"),
    };
    let _ = tx.send(got);
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn otlp_config(upstream: &str, otlp: &str) -> Config {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(upstream.into()),
        admin: Some("127.0.0.1:0".into()),
    };
    let mut cfg = config::load_str(otlp, "test", &overrides).unwrap();
    cfg.log.access_log = false;
    cfg
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn s<'a>(attrs: &'a [KeyValue], key: &str) -> &'a str {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(v)) => v,
        other => panic!("{key}: {other:?}"),
    }
}

fn int(attrs: &[KeyValue], key: &str) -> i64 {
    match attr(attrs, key) {
        Some(any_value::Value::IntValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn double(attrs: &[KeyValue], key: &str) -> f64 {
    match attr(attrs, key) {
        Some(any_value::Value::DoubleValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn spans_of(req: &ExportTraceServiceRequest) -> Vec<Span> {
    req.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| s.spans.clone())
        .collect()
}

fn metric<'a>(req: &'a ExportMetricsServiceRequest, name: &str) -> Option<&'a Metric> {
    req.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .find(|m| m.name == name)
}

fn histogram<'a>(req: &'a ExportMetricsServiceRequest, name: &str) -> Vec<&'a HistogramDataPoint> {
    match metric(req, name).and_then(|m| m.data.as_ref()) {
        Some(metric::Data::Histogram(h)) => h.data_points.iter().collect(),
        Some(other) => panic!("{name} is not a histogram: {other:?}"),
        None => Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn post_with(
    client: &HttpClient,
    url: &str,
    body: String,
    traceparent: Option<&str>,
) -> (u16, Bytes) {
    let mut req = Request::post(url).header("content-type", "application/json");
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn metrics_and_spans_match_the_requests_sent() {
    let mut receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
    let cfg = otlp_config(
        &upstream,
        &format!(
            "[otlp]\nendpoint = \"{}\"\ntraces = true\ninterval = \"200ms\"\ntimeout = \"2s\"\n\
             batch_size = 1\nservice_name = \"proxy-under-test\"\n\
             headers = {{ \"x-api-key\" = \"collector-key\" }}\n",
            receiver.endpoint()
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let sampled = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let unsampled = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    for tp in [Some(sampled.as_str()), None, Some(unsampled.as_str())] {
        let (status, _) = post_with(&client, &url, chat_body(true, 8, true), tp).await;
        assert_eq!(status, 200);
    }
    let (status, _) = post_with(&client, &url, chat_body(false, 5, false), None).await;
    assert_eq!(status, 200);
    let records: Vec<Value> = wait_records(proxy.admin_addr, 4, Duration::from_secs(10)).await;

    // Spans: one per request except the one whose caller's trace is not sampled.
    let mut spans = Vec::new();
    receiver
        .until("three spans", |got| {
            if let Got::Traces(t) = got {
                let resource = t.resource_spans[0].resource.as_ref().unwrap();
                assert_eq!(s(&resource.attributes, "service.name"), "proxy-under-test");
                spans.extend(spans_of(t));
            }
            (spans.len() >= 3).then_some(())
        })
        .await;
    assert_eq!(spans.len(), 3);
    for span in &spans {
        let a = &span.attributes;
        let id = s(a, "goodput.request.id");
        let rec = records
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("a span for an unknown request {id}"));
        assert_eq!(span.name, "chat test-model");
        assert_eq!(span.kind, 2, "SPAN_KIND_SERVER");
        assert_eq!(s(a, "gen_ai.operation.name"), "chat");
        assert_eq!(s(a, "gen_ai.provider.name"), "openai");
        assert_eq!(s(a, "gen_ai.request.model"), "test-model");
        assert_eq!(s(a, "server.address"), "127.0.0.1");
        assert_eq!(s(a, "goodput.api"), "chat_completions");
        assert_eq!(s(a, "goodput.outcome"), "ok");
        assert_eq!(
            s(a, "goodput.slo.class"),
            rec["slo_class"].as_str().unwrap()
        );
        assert_eq!(s(a, "goodput.slo.verdict"), "met");
        assert_eq!(int(a, "http.response.status_code"), 200);
        assert_eq!(
            int(a, "gen_ai.usage.output_tokens"),
            rec["output_tokens"].as_i64().unwrap()
        );
        assert_eq!(
            int(a, "gen_ai.usage.input_tokens"),
            rec["input_tokens"].as_i64().unwrap()
        );
        assert!((double(a, "goodput.e2e_ms") - rec["e2e_ms"].as_f64().unwrap()).abs() < 1e-9);
        let e2e_ns = span.end_time_unix_nano - span.start_time_unix_nano;
        assert!(
            (e2e_ns as f64 / 1e6 - rec["e2e_ms"].as_f64().unwrap()).abs() < 0.01,
            "span duration {e2e_ns} ns vs e2e {}",
            rec["e2e_ms"]
        );
        if rec["stream"] == true {
            let ttft = double(a, "goodput.ttft_ms");
            assert!((ttft - rec["ttft_ms"].as_f64().unwrap()).abs() < 1e-9);
            assert!(ttft >= 5.0, "the simulator's TTFT is 5 ms: {ttft}");
            assert!((double(a, "goodput.tpot_ms") - rec["tpot_ms"].as_f64().unwrap()).abs() < 1e-9);
        } else {
            assert!(attr(a, "goodput.ttft_ms").is_none());
        }
        assert!(attr(a, "error.type").is_none());
        // Joined the caller's trace when it sent one; a root span of its own otherwise.
        if hex(&span.trace_id) == TRACE_ID {
            assert_eq!(hex(&span.parent_span_id), PARENT_ID);
        } else {
            assert!(span.parent_span_id.is_empty());
            assert_eq!(span.trace_id.len(), 16);
        }
        assert_eq!(span.span_id.len(), 8);
    }
    assert_eq!(
        spans
            .iter()
            .filter(|s| hex(&s.trace_id) == TRACE_ID)
            .count(),
        1,
        "only the sampled traceparent's request is in the caller's trace"
    );

    // Metrics: cumulative, so wait for an export that has seen all four requests.
    let total = |m: &ExportMetricsServiceRequest| {
        histogram(m, "gen_ai.server.request.duration")
            .iter()
            .map(|p| p.count)
            .sum::<u64>()
    };
    let m = receiver
        .until("metrics of four requests", |got| match got {
            Got::Metrics(m) if total(m) == 4 => Some(m.clone()),
            _ => None,
        })
        .await;
    let duration = histogram(&m, "gen_ai.server.request.duration");
    assert_eq!(
        duration[0].explicit_bounds,
        [
            0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92
        ]
    );
    let a = &duration[0].attributes;
    assert_eq!(s(a, "gen_ai.operation.name"), "chat");
    assert_eq!(s(a, "gen_ai.provider.name"), "openai");
    assert_eq!(s(a, "gen_ai.request.model"), "test-model");
    assert_eq!(s(a, "server.address"), "127.0.0.1");
    let port: i64 = upstream.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(int(a, "server.port"), port);
    let e2e_sum: f64 = records.iter().map(|r| r["e2e_ms"].as_f64().unwrap()).sum();
    let sum: f64 = duration.iter().map(|p| p.sum.unwrap()).sum();
    assert!(
        (sum * 1000.0 - e2e_sum).abs() < 1e-6,
        "{sum} s vs {e2e_sum} ms"
    );
    let client_duration: u64 = histogram(&m, "gen_ai.client.operation.duration")
        .iter()
        .map(|p| p.count)
        .sum();
    assert_eq!(client_duration, 4);
    // TTFT and TPOT: the three streamed requests.
    let ttft = histogram(&m, "gen_ai.server.time_to_first_token");
    assert_eq!(ttft.iter().map(|p| p.count).sum::<u64>(), 3);
    assert_eq!(ttft[0].explicit_bounds.len(), 16);
    assert_eq!(
        metric(&m, "gen_ai.server.time_to_first_token")
            .unwrap()
            .unit,
        "s"
    );
    let tpot = histogram(&m, "gen_ai.server.time_per_output_token");
    assert_eq!(tpot.iter().map(|p| p.count).sum::<u64>(), 3);
    // Token usage: input and output, their sums the records' totals.
    let usage = histogram(&m, "gen_ai.client.token.usage");
    assert_eq!(
        metric(&m, "gen_ai.client.token.usage").unwrap().unit,
        "{token}"
    );
    for (kind, field) in [("input", "input_tokens"), ("output", "output_tokens")] {
        let points: Vec<_> = usage
            .iter()
            .filter(|p| s(&p.attributes, "gen_ai.token.type") == kind)
            .collect();
        let expected: f64 = records.iter().map(|r| r[field].as_f64().unwrap()).sum();
        assert_eq!(points.iter().map(|p| p.count).sum::<u64>(), 4, "{kind}");
        assert_eq!(points.iter().map(|p| p.sum.unwrap()).sum::<f64>(), expected);
    }
    // goodput's own: requests by verdict, effective tokens, attainment.
    let requests = match metric(&m, "goodput.requests").and_then(|m| m.data.as_ref()) {
        Some(metric::Data::Sum(sum)) => sum.clone(),
        other => panic!("goodput.requests: {other:?}"),
    };
    assert!(requests.is_monotonic);
    let met: f64 = requests
        .data_points
        .iter()
        .filter(|p| s(&p.attributes, "goodput.slo.verdict") == "met")
        .map(|p| match p.value {
            Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(n)) => {
                n as f64
            }
            Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(
                n,
            )) => n,
            None => 0.0,
        })
        .sum();
    assert_eq!(met, 4.0);
    assert!(metric(&m, "goodput.output_tokens").is_some());

    // Nothing of the content, nor the client's credentials, went to the collector.
    {
        let seen = receiver.seen.lock().unwrap();
        assert!(
            seen.content_types
                .iter()
                .all(|c| c == "application/x-protobuf")
        );
        assert!(seen.api_keys.iter().all(|k| k == "collector-key"));
        for body in &seen.bodies {
            for secret in [&b"SECRET-PROMPT-TEXT"[..], b"SECRET-API-KEY", b"hello"] {
                assert!(
                    !body.windows(secret.len()).any(|w| w == secret),
                    "an export carried {}",
                    String::from_utf8_lossy(secret)
                );
            }
        }
    }
    let text = metrics(proxy.admin_addr).await;
    assert!(
        metric_value(&text, "goodput_otlp_exports_total{signal=\"traces\"}").unwrap() >= 1.0,
        "{text}"
    );
    assert!(metric_value(&text, "goodput_otlp_exports_total{signal=\"metrics\"}").unwrap() >= 1.0);
    proxy.shutdown().await;
}

/// The last requests before shutdown are exported at shutdown, not lost.
#[tokio::test]
async fn shutdown_exports_what_is_left() {
    let mut receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(1.0, 1.0)).await;
    // Long interval and large batches: only the shutdown flush can deliver them.
    let cfg = otlp_config(
        &upstream,
        &format!(
            "[otlp]\nendpoint = \"{}\"\ntraces = true\ninterval = \"1h\"\nbatch_size = 100\n",
            receiver.endpoint()
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    for _ in 0..3 {
        let (status, _) = post_collect(&client, &url, chat_body(true, 4, true)).await;
        assert_eq!(status, 200);
    }
    wait_records(proxy.admin_addr, 3, Duration::from_secs(10)).await;
    proxy.shutdown().await;
    let (mut spans, mut metric_requests) = (0, 0);
    receiver
        .until("the shutdown exports", |got| {
            match got {
                Got::Traces(t) => spans += spans_of(t).len(),
                Got::Metrics(m) => {
                    metric_requests = histogram(m, "gen_ai.server.request.duration")
                        .iter()
                        .map(|p| p.count)
                        .sum()
                }
            }
            (spans == 3 && metric_requests == 3).then_some(())
        })
        .await;
}

/// Requests through a proxy whose collector misbehaves: every one completes, and the
/// failures are counted.
async fn proxy_survives(endpoint: &str) -> (Running, String) {
    let (_sim, upstream) = start_sim(fast_sim(1.0, 0.5)).await;
    let cfg = otlp_config(
        &upstream,
        &format!(
            "[otlp]\nendpoint = \"{endpoint}\"\ntraces = true\ninterval = \"100ms\"\n\
             timeout = \"300ms\"\nqueue_size = 2\nbatch_size = 1\n"
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let sending = async {
        for _ in 0..30 {
            let (status, body) = post_collect(&client, &url, chat_body(true, 4, true)).await;
            assert_eq!(status, 200);
            assert!(body.ends_with(b"data: [DONE]\n\n"));
        }
    };
    // Generous: the requests themselves take ~10 ms each; an export that blocked proxying
    // would hold each one for the 300 ms export timeout or forever.
    tokio::time::timeout(Duration::from_secs(8), sending)
        .await
        .expect("proxying slowed down behind a failing collector");
    let records = wait_records(proxy.admin_addr, 30, Duration::from_secs(10)).await;
    assert!(records.iter().all(|r| r["outcome"] == "ok"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = metrics(proxy.admin_addr).await;
        let failures = |signal: &str| {
            metric_value(
                &text,
                &format!("goodput_otlp_export_failures_total{{signal=\"{signal}\"}}"),
            )
            .unwrap_or(0.0)
        };
        if failures("metrics") >= 1.0 && failures("traces") >= 1.0 {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "failures not counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (proxy, text)
}

#[tokio::test]
async fn a_collector_that_hangs_never_slows_proxying() {
    let receiver = Receiver::start(Mode::Hang).await;
    let (proxy, text) = proxy_survives(&receiver.endpoint()).await;
    // One span is held by each hanging export (300 ms) and two fit the queue: 30 requests
    // within the 8 s bound above cannot all have found room.
    let dropped = metric_value(
        &text,
        "goodput_otlp_spans_dropped_total{reason=\"queue_full\"}",
    )
    .unwrap_or(0.0);
    assert!(dropped >= 1.0, "{text}");
    assert_eq!(
        metric_value(&text, "goodput_otlp_exports_total{signal=\"traces\"}").unwrap_or(0.0),
        0.0
    );
    // Shutdown is not held up by the hanging collector beyond the export timeout.
    tokio::time::timeout(Duration::from_secs(10), proxy.shutdown())
        .await
        .expect("shutdown waited on a hanging collector");
}

#[tokio::test]
async fn a_collector_that_refuses_never_breaks_proxying() {
    // A port nothing listens on: connections are refused.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let (proxy, text) = proxy_survives(&format!("http://{addr}")).await;
    assert!(
        metric_value(
            &text,
            "goodput_otlp_spans_dropped_total{reason=\"export_failed\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_collector_that_answers_503_is_a_failure() {
    let receiver = Receiver::start(Mode::Status(503)).await;
    let (proxy, _) = proxy_survives(&receiver.endpoint()).await;
    assert!(!receiver.seen.lock().unwrap().bodies.is_empty());
    proxy.shutdown().await;
}

/// `[otlp]` is built at start: a reload that changes it is refused by name and the
/// running configuration stays; one that leaves it alone applies.
#[tokio::test]
async fn otlp_changes_need_a_restart() {
    let receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(1.0, 1.0)).await;
    let dir = TempDir::new("otlp-reload");
    let path = dir.path().join("goodput.toml");
    let section = |endpoint: &str| {
        format!(
            "[upstream]\nurl = \"{upstream}\"\n[otlp]\nendpoint = \"{endpoint}\"\ntraces = true\n"
        )
    };
    std::fs::write(&path, section(&receiver.endpoint())).unwrap();
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    let cfg = config::load(Some(&path), &overrides).unwrap();
    let proxy = run::start_from(
        cfg,
        Some(ConfigSource {
            path: path.clone(),
            overrides,
        }),
    )
    .await
    .unwrap();
    let reloader = proxy.reloader.clone().unwrap();
    std::fs::write(&path, section("http://127.0.0.1:9")).unwrap();
    match reloader.reload() {
        Err(ReloadError::RestartRequired(keys)) => assert_eq!(keys, ["otlp"]),
        other => panic!("expected a refusal, got {other:?}"),
    }
    std::fs::write(
        &path,
        format!(
            "{}[slo.default]\nttft_ms = 500\n",
            section(&receiver.endpoint())
        ),
    )
    .unwrap();
    reloader.reload().unwrap();
    proxy.shutdown().await;
}
