//! The per-request path: the measurement layer around a request whose response streams
//! 103 frames (`Measure::call`, the request-body tap, `MeasuredBody` per frame, the tap's
//! finish into the recorder channel), the record built from it (`Pending::finish`), and the
//! histograms the aggregator records each inter-token gap into.
//!
//! Everything is polled by hand with a no-op waker: no runtime, no sockets, so what is
//! timed is goodput's own work per request and per event.

use std::{
    collections::VecDeque,
    convert::Infallible,
    future::Future,
    hint::black_box,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use bytes::Bytes;
use goodput::{
    config::{self, Config, Overrides},
    measure::{MeasureLayer, Outcome, Pending, Recorder, RequestMetrics, Settings},
    metrics::{HistogramOptions, LatencyLabels, NativeBuckets},
    stats::{
        engine::{Engine, Observation},
        engine_config,
    },
};
use hdrhistogram::Histogram;
use http::{Request, Response, header::CONTENT_TYPE};
use http_body::{Body, Frame};
use http_body_util::Full;
use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use tower::{Layer, Service, service_fn};

use crate::cases::Case;
use crate::corpus::{self, OPENAI_TOKENS};

const REQUEST: &str = r#"{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short story about a lighthouse keeper who finds a message in a bottle."}]}"#;

pub fn cases() -> Vec<Case> {
    let overrides = Overrides {
        upstream: Some("http://127.0.0.1:8000".to_owned()),
        ..Overrides::default()
    };
    let cfg = match config::load_str("", "bench", &overrides) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("micro: the default configuration does not load ({e}); record cases skipped");
            return Vec::new();
        }
    };
    let gaps: Vec<u32> = (0..OPENAI_TOKENS as u32 - 1)
        .map(|i| 18_000 + i * 37 % 4_000)
        .collect();
    vec![
        request("request/measured (data path)", &cfg, false),
        request("request/measured + record built", &cfg, true),
        hdr("hist/hdrhistogram record", gaps.clone()),
        prometheus("hist/prometheus itl observe", gaps.clone()),
        engine("hist/engine observe (SLO windows)", &cfg, gaps),
    ]
}

/// A response body handing out prepared frames (refcounted `Bytes`, as hyper's are).
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// Polls a future or body that never waits (everything here is in memory) to its end.
fn ready<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

fn drain<B: Body>(body: B) -> usize {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut frames = 0;
    while let Poll::Ready(Some(Ok(_))) = body.as_mut().poll_frame(&mut cx) {
        frames += 1;
    }
    frames
}

fn request(name: &'static str, cfg: &Config, build_record: bool) -> Case {
    let (recorder, mut rx) = Recorder::new(1024, Counter::default(), Gauge::default());
    let settings = Arc::new(ArcSwap::from_pointee(Settings::from_config(cfg)));
    let layer = MeasureLayer::new(recorder, settings);
    let events = corpus::openai_events();
    let frames = events.len() as u64;
    let bytes = corpus::total_bytes(&events);
    // Stands for the forwarder: streams the request body on, answers with the stream.
    let upstream = service_fn(move |req: Request<_>| {
        drain(req.into_body());
        let mut resp = Response::new(Frames(events.iter().cloned().collect()));
        resp.headers_mut().insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        std::future::ready(Ok::<_, Infallible>(resp))
    });
    let mut svc = layer.layer(upstream);
    Case::new(name, frames, bytes, "request", move || {
        let req = Request::post("/v1/chat/completions")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(REQUEST.as_bytes())));
        let Ok(req) = req else { return };
        if let Some(Ok(resp)) = ready(svc.call(req)) {
            black_box(drain(resp.into_body()));
        }
        if let Ok(pending) = rx.try_recv() {
            finish(pending, build_record);
        }
    })
}

fn finish(pending: Pending, build_record: bool) {
    if build_record {
        black_box(pending.finish());
    } else {
        black_box(pending);
    }
}

fn hdr(name: &'static str, gaps: Vec<u32>) -> Case {
    // The engine's layout: 1 µs ..= 1 h, 2 significant figures.
    let Ok(mut h) = Histogram::<u32>::new_with_bounds(1, 3_600_000_000, 2) else {
        return Case::new(name, 1, 0, "-", || {});
    };
    Case::new(name, gaps.len() as u64, 0, "request's gaps", move || {
        for &g in &gaps {
            h.saturating_record(u64::from(black_box(g)));
        }
    })
}

fn prometheus(name: &'static str, gaps: Vec<u32>) -> Case {
    let mut registry = Registry::default();
    // With native buckets at the default precision, as `serve` builds them.
    let histograms = HistogramOptions {
        native: Some(NativeBuckets {
            schema: 6,
            max_buckets: 512,
        }),
        ..HistogramOptions::default()
    };
    let metrics = RequestMetrics::register(&mut registry, &histograms);
    let key = LatencyLabels {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        api: "chat_completions",
        class: "default".into(),
    };
    // As the aggregator does: one family lookup per request, one observe per gap.
    Case::new(name, gaps.len() as u64, 0, "request's gaps", move || {
        let itl = metrics.itl.get_or_create(&key);
        for &g in &gaps {
            itl.observe(f64::from(black_box(g)) / 1e6);
        }
    })
}

fn engine(name: &'static str, cfg: &Config, gaps: Vec<u32>) -> Case {
    let mut engine = Engine::new(engine_config(cfg));
    let start = Instant::now();
    Case::new(name, gaps.len() as u64, 0, "request", move || {
        let finished = start + Duration::from_millis(2_100);
        engine.observe(&Observation {
            started: start,
            finished,
            class: "default",
            model: "meta-llama/Llama-3.1-8B-Instruct",
            outcome: Outcome::Ok,
            slo_met: Some(true),
            ttft_ms: Some(95.0),
            tpot_ms: Some(20.1),
            e2e_ms: 2_100.0,
            itl_us: black_box(&gaps),
            input_tokens: Some(27),
            output_tokens: Some(100),
            concurrency_at_start: 64,
            long_in_flight_at_start: false,
            miss_cause: None,
            finish_reason: None,
            cached_input_tokens: None,
            engine_parts: Default::default(),
            miss_component: None,
        });
    })
}
