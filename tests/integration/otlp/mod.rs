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
    collections::BTreeMap,
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
    metrics::v1::{ExponentialHistogramDataPoint, HistogramDataPoint, Metric, metric},
    trace::v1::Span,
};
use prost::Message;
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

fn exponential<'a>(
    req: &'a ExportMetricsServiceRequest,
    name: &str,
) -> Vec<&'a ExponentialHistogramDataPoint> {
    match metric(req, name).and_then(|m| m.data.as_ref()) {
        Some(metric::Data::ExponentialHistogram(h)) => h.data_points.iter().collect(),
        Some(other) => panic!("{name} is not an exponential histogram: {other:?}"),
        None => Vec::new(),
    }
}

/// The positive buckets of `points` (all at one scale), summed: index to count.
fn exponential_buckets(points: &[&ExponentialHistogramDataPoint]) -> BTreeMap<i32, u64> {
    let mut out = BTreeMap::new();
    for p in points {
        let Some(b) = &p.positive else { continue };
        for (i, &n) in (b.offset..).zip(&b.bucket_counts) {
            if n > 0 {
                *out.entry(i).or_default() += n;
            }
        }
    }
    out
}

/// What an exponential histogram of `values` (none negative) holds: its scale, the
/// largest at or under `max_scale` whose buckets from the smallest value's to the largest's
/// number at most `max_size`; its zero count (a stream whose tokens all came in one read
/// has a TPOT of 0); and the count in each bucket (bucket `i` holds
/// `(2^(i·2^-scale), 2^((i+1)·2^-scale)]`).
fn expected_exponential(
    values: &[f64],
    max_scale: i32,
    max_size: i32,
) -> (i32, u64, BTreeMap<i32, u64>) {
    let index = |v: f64, scale: i32| (v.log2() * 2f64.powi(scale)).ceil() as i32 - 1;
    let positive: Vec<f64> = values.iter().copied().filter(|&v| v > 0.0).collect();
    let mut scale = max_scale;
    while let (Some(lo), Some(hi)) = (
        positive.iter().map(|&v| index(v, scale)).min(),
        positive.iter().map(|&v| index(v, scale)).max(),
    ) {
        if hi - lo < max_size {
            break;
        }
        scale -= 1;
    }
    let mut counts = BTreeMap::new();
    for &v in &positive {
        *counts.entry(index(v, scale)).or_default() += 1;
    }
    let zeros = (values.len() - positive.len()) as u64;
    (scale, zeros, counts)
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

mod collector_faults;
mod export;
