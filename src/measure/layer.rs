//! The tower layer that puts a request under measurement. `t_arrival` is taken when the
//! service is called, i.e. as soon as hyper has parsed the request head.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Instant,
};

use bytes::Bytes;
use http::{Request, Response, header::CONTENT_TYPE};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::{MeasuredBody, Outcome, Recorder, RequestTap, Tap, request_id, tap::ProxyFailure};
use crate::{BoxError, decode::Api, proxy::Tunnel};

#[derive(Clone, Debug)]
pub struct MeasureLayer {
    recorder: Recorder,
    request_limit: usize,
    response_limit: usize,
}

impl MeasureLayer {
    pub fn new(recorder: Recorder, request_limit: usize, response_limit: usize) -> MeasureLayer {
        MeasureLayer { recorder, request_limit, response_limit }
    }
}

impl<S> Layer<S> for MeasureLayer {
    type Service = Measure<S>;

    fn layer(&self, inner: S) -> Measure<S> {
        Measure { inner, layer: self.clone() }
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
        let t_arrival = Instant::now();
        let (mut parts, body) = req.into_parts();
        let id = request_id::ensure(&mut parts.headers);
        let api = Api::from_path(parts.uri.path());
        let (body, request) = RequestTap::new(body, self.layer.request_limit);
        let tap =
            Tap::new(self.layer.recorder.clone(), id, t_arrival, api, request, self.layer.response_limit);
        ResponseFuture { inner: self.inner.call(Request::from_parts(parts, body)), tap: Some(tap) }
    }
}

pin_project! {
    /// Waits for the response head, then hands the tap to the response body. If this
    /// future is dropped first (the client went away), the tap records the abort.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        tap: Option<Tap>,
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
                let content_type = resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
                let failure = resp.extensions().get::<ProxyFailure>().copied();
                tap.on_head(resp.status().as_u16(), content_type, failure);
                if let Some(tunnel) = resp.extensions_mut().remove::<Tunnel>() {
                    // The body of a 101 is empty; the exchange lives on in the tunnel, so the
                    // measurement follows it there.
                    tap.on_tunnel();
                    let detached = tap.detach();
                    tokio::spawn(tunnel.measure(detached));
                }
                Poll::Ready(Ok(resp.map(|b| MeasuredBody::new(b, tap))))
            }
            Err(e) => {
                tap.on_head(500, None, Some(ProxyFailure(Outcome::ProxyError)));
                tap.finish(Instant::now(), super::Ending::Complete);
                Poll::Ready(Err(e))
            }
        }
    }
}
