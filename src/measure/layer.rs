//! The tower layer that puts a request under measurement. `t_arrival` is when the read
//! that completed the request head arrived: the kernel's receive stamp of its packet
//! where the client connection keeps a read clock ([`ClientReads`]), else the time the
//! service is called, i.e. as soon as hyper has parsed the request head.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Instant,
};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, Request, Response,
    header::{CONTENT_LENGTH, CONTENT_TYPE},
};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::{
    ClientReads, Clock, Delivery, MeasuredBody, Outcome, ReadClock, Recorder, RequestTap, Tap,
    Upgraded,
    mirror::{Mirror, MirrorHead},
    request_id,
    tap::{HeadInfo, ProxyFailure},
};
use crate::config::UsageInjection;
use crate::slo::{HeaderObjectives, Targets, tenant_hash};
use crate::usage_injection::{InjectPlan, UsageFilter, UsageRequest};
use crate::{
    BoxError,
    decode::{Api, EngineTiming, StreamKind},
};

/// The W3C Trace Context header a request's span joins.
const TRACEPARENT: &str = "traceparent";

/// What the layer needs from the configuration; swapped as a whole on reload and loaded
/// once per request.
#[derive(Debug, Clone)]
pub struct Settings {
    pub request_inspect_limit: usize,
    pub response_inspect_limit: usize,
    pub tenant_header: Option<HeaderName>,
    pub tenant_salt: String,
    /// Per-request objective headers are read unless this is `off`.
    pub header_objectives: HeaderObjectives,
    pub long_input_bytes: u64,
    /// Generated text kept per request for token counting; `None` when counting is off.
    pub text_limit: Option<usize>,
    pub usage_injection: UsageInjection,
    /// `usage_injection.models`, shared by every candidate request's plan.
    pub inject_models: Arc<[String]>,
    /// Request spans are exported: read each request's `traceparent`.
    pub traced: bool,
}

impl Settings {
    pub fn from_config(cfg: &crate::config::Config) -> Settings {
        Settings {
            request_inspect_limit: cfg.measure.request_inspect_limit,
            response_inspect_limit: cfg.measure.response_inspect_limit,
            tenant_header: cfg.slo.tenant_header.clone(),
            tenant_salt: cfg.slo.tenant_salt.clone(),
            header_objectives: cfg.slo.header_objectives,
            long_input_bytes: cfg.slo.long_input_bytes,
            text_limit: cfg.tokenizer.enabled().then_some(cfg.tokenizer.text_limit),
            usage_injection: cfg.usage_injection.clone(),
            inject_models: cfg.usage_injection.models.clone().into(),
            traced: cfg.otlp.as_ref().is_some_and(|o| o.traces),
        }
    }

    /// Usage injection may apply: enabled, an OpenAI-style API, a configured path. The
    /// forwarder decides from the body.
    fn inject_plan(&self, api: Api, path: &str) -> Option<InjectPlan> {
        (matches!(api, Api::ChatCompletions | Api::Completions)
            && self.usage_injection.applies_to_path(path))
        .then(|| InjectPlan {
            models: self.inject_models.clone(),
            limit: self.request_inspect_limit,
        })
    }

    /// Reads what the SLO and load views need from the request head.
    fn head_info(&self, headers: &HeaderMap) -> HeadInfo {
        let long_input = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= self.long_input_bytes);
        let tenant = self
            .tenant_header
            .as_ref()
            .and_then(|h| headers.get(h))
            .map(|v| tenant_hash(&self.tenant_salt, v.as_bytes()));
        let (slo_overrides, slo_header_invalid) = if self.header_objectives == HeaderObjectives::Off
        {
            (Targets::default(), 0)
        } else {
            header_targets(headers)
        };
        let trace_parent = if self.traced {
            headers
                .get(TRACEPARENT)
                .and_then(|v| super::TraceParent::parse(v.as_bytes()))
        } else {
            None
        };
        HeadInfo {
            long_input,
            tenant,
            slo_overrides,
            slo_header_invalid,
            traced: self.traced,
            trace_parent,
        }
    }
}

/// Per-request objectives, each from the first of its headers present: llm-d's names, then
/// their deprecated aliases (and `x-slo-e2e-ms`, which has no llm-d name). Also returns how
/// many headers were present with a value that is not a positive number (ignored).
pub fn header_targets(headers: &HeaderMap) -> (Targets, u8) {
    let mut invalid = 0u8;
    let mut ms = |names: &[&str]| {
        let value = names.iter().find_map(|n| headers.get(*n))?;
        let parsed = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0);
        if parsed.is_none() {
            invalid = invalid.saturating_add(1);
        }
        parsed
    };
    let targets = Targets {
        ttft_ms: ms(&["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"]),
        tpot_ms: ms(&["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"]),
        e2e_ms: ms(&["x-slo-e2e-ms"]),
    };
    (targets, invalid)
}

#[derive(Clone, Debug)]
pub struct MeasureLayer {
    recorder: Recorder,
    settings: Arc<ArcSwap<Settings>>,
    mirror: Option<Arc<dyn Mirror>>,
}

impl MeasureLayer {
    pub fn new(recorder: Recorder, settings: Arc<ArcSwap<Settings>>) -> MeasureLayer {
        MeasureLayer {
            recorder,
            settings,
            mirror: None,
        }
    }

    /// Offers every request to `mirror`, which may take a copy of its body.
    pub fn with_mirror(mut self, mirror: Arc<dyn Mirror>) -> MeasureLayer {
        self.mirror = Some(mirror);
        self
    }
}

impl<S> Layer<S> for MeasureLayer {
    type Service = Measure<S>;

    fn layer(&self, inner: S) -> Measure<S> {
        Measure {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Measure<S> {
    inner: S,
    layer: MeasureLayer,
}

impl<S, B, RB> Service<Request<B>> for Measure<S>
where
    S: Service<Request<RequestTap<B>>, Response = Response<RB>>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<MeasuredBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let now = Instant::now();
        let (mut parts, body) = req.into_parts();
        // The read that completed the head, as the kernel stamped its packet, if it did.
        let reads = parts
            .extensions
            .get::<ClientReads>()
            .map(|r| Arc::clone(&r.0));
        let (t_arrival, clock) = reads
            .as_deref()
            .and_then(ReadClock::latest_read)
            .filter(|(at, _)| *at <= now)
            .unwrap_or((now, Clock::User));
        let settings = self.layer.settings.load();
        let id = request_id::ensure(&mut parts.headers);
        let api = Api::from_path(parts.uri.path());
        let head = settings.head_info(&parts.headers);
        if let Some(plan) = settings.inject_plan(api, parts.uri.path()) {
            parts.extensions.insert(plan);
        }
        let ticket = self.layer.mirror.as_ref().and_then(|m| {
            m.ticket(&MirrorHead {
                parts: &parts,
                id: &id,
                api,
                tenant: head.tenant,
                t_arrival,
            })
        });
        let mirrored = ticket.is_some();
        let answer_limit = ticket.as_ref().map_or(0, |t| t.answer_limit());
        let (body, request) = RequestTap::new(body, settings.request_inspect_limit, reads);
        let body = body.mirror_to(ticket);
        let mut tap = Tap::new(
            self.layer.recorder.clone(),
            id,
            t_arrival,
            api,
            request,
            settings.response_inspect_limit,
            head,
        );
        if let Some(limit) = settings.text_limit {
            tap.count_text(limit);
        }
        if clock == Clock::User {
            tap.user_clock();
        }
        if mirrored {
            tap.mark_mirrored();
            tap.keep_answer(answer_limit);
        }
        let delivery = parts.extensions.get::<Arc<Delivery>>().cloned();
        let http2 = parts.version == http::Version::HTTP_2;
        ResponseFuture {
            inner: self.inner.call(Request::from_parts(parts, body)),
            tap: Some(tap),
            delivery,
            http2,
        }
    }
}

pin_project! {
    /// Waits for the response head, then hands the tap to the response body. If this
    /// future is dropped first (the client went away), the tap records the abort.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        tap: Option<Tap>,
        // The client connection's flushes, for the response body.
        delivery: Option<Arc<Delivery>>,
        http2: bool,
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    type Output = Result<Response<MeasuredBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let Some(mut tap) = this.tap.take() else {
            // Polled after completion: tower futures are not fused, neither is this one.
            return Poll::Pending;
        };
        match result {
            Ok(mut resp) => {
                let usage = resp.extensions_mut().remove::<UsageRequest>();
                let reads = resp.extensions_mut().remove::<Arc<ReadClock>>();
                let content_type = resp
                    .headers()
                    .get(CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok());
                let failure = resp.extensions().get::<ProxyFailure>().copied();
                if usage.is_some() {
                    tap.expect_usage();
                }
                // Only a successful event stream carries the usage chunk injection added.
                let strip = usage == Some(UsageRequest::Injected)
                    && resp.status().is_success()
                    && StreamKind::from_content_type(content_type) == StreamKind::Sse;
                tap.on_head(resp.status().as_u16(), content_type, failure);
                tap.on_engine_headers(EngineTiming::from_headers(resp.headers()));
                if let Some(tunnel) = resp.extensions_mut().remove::<Upgraded>() {
                    // The body of a 101 is empty; the exchange lives on in the tunnel, so the
                    // measurement follows it there.
                    tap.on_tunnel();
                    let detached = tap.detach();
                    tokio::spawn(tunnel.measure(detached));
                }
                if strip {
                    // The body will be shorter than the upstream said.
                    resp.headers_mut().remove(CONTENT_LENGTH);
                    let filter = UsageFilter::new();
                    return Poll::Ready(Ok(resp.map(|b| {
                        MeasuredBody::stripping(b, tap, filter)
                            .with_reads(reads)
                            .with_delivery(this.delivery.take(), *this.http2)
                    })));
                }
                Poll::Ready(Ok(resp.map(|b| {
                    MeasuredBody::new(b, tap)
                        .with_reads(reads)
                        .with_delivery(this.delivery.take(), *this.http2)
                })))
            }
            Err(e) => {
                tap.on_head(500, None, Some(ProxyFailure(Outcome::ProxyError)));
                tap.finish(Instant::now(), super::Ending::Complete);
                Poll::Ready(Err(e))
            }
        }
    }
}
