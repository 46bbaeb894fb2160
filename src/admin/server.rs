//! Routing and serving of the admin endpoints. HTTP/1.1, in the clear or over TLS
//! (`[admin.tls]`); every response is small and built in full, so there is nothing to
//! stream here. Access settings and TLS are read from the live configuration per request
//! and per connection, so a reload rotates the token and the certificate.

use std::{
    convert::Infallible,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{
    HeaderValue, Method, Request, Response, StatusCode,
    header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE},
};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{metrics::counter::Counter, registry::Registry};
use serde::Serialize;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
};
use tokio_rustls::TlsAcceptor;

use super::{
    auth, dashboard,
    exposition::{self, Format},
};
use crate::{
    calibrate::CalibrationView,
    config::Config,
    measure::RequestRecord,
    stats::{DriftView, Live, Recent, engine::parse_window},
};

/// What the admin endpoints read.
#[derive(Clone)]
pub struct Admin {
    pub registry: Arc<Registry>,
    pub recent: Arc<Recent>,
    /// True while the proxy accepts traffic; false before start and while draining.
    pub ready: Arc<AtomicBool>,
    /// The windowed SLO, goodput, cost and capacity view.
    pub live: Live,
    /// The latest drift evaluation (`None` until the first, or with drift detection off).
    pub drift: DriftView,
    /// The latest self-calibration status (`[calibration]`).
    pub calibration: CalibrationView,
    /// The live configuration: its `admin_access` (token, `/metrics` protection, TLS).
    pub config: Arc<ArcSwap<Config>>,
    /// Requests refused for a missing or wrong bearer token.
    pub unauthorized: Counter,
    /// The shadow and its pairs (`[shadow]`).
    pub shadow: crate::shadow::View,
}

/// Time a client has to complete the TLS handshake on the admin listener.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of `?limit=` for `/api/v1/requests` (the ring size bounds it anyway).
const DEFAULT_LIMIT: usize = 100;

impl Admin {
    fn route(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        if !auth::allowed(
            &self.config.load().admin_access,
            req.uri().path(),
            req.headers(),
        ) {
            self.unauthorized.inc();
            // The page shell asks for the token itself (it holds no data).
            if req.uri().path() == "/" {
                let mut resp = dashboard::page(StatusCode::UNAUTHORIZED);
                resp.headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
                return resp;
            }
            return unauthorized();
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is supported\n");
        }
        if let Some(resp) = dashboard::static_asset(req.uri().path()) {
            return resp;
        }
        match req.uri().path() {
            "/" => dashboard::page(StatusCode::OK),
            "/metrics" => self.metrics(req),
            "/api/v1/requests" => self.requests(req.uri().query()),
            "/api/v1/summary" => self.summary(req.uri().query()),
            "/api/v1/timeline" => self.timeline(req.uri().query()),
            "/api/v1/capacity" => self.capacity(req.uri().query()),
            "/api/v1/drift" => self.drift(req.uri().query()),
            "/api/v1/calibration" => self.calibration(),
            "/api/v1/shadow" => self.shadow(req.uri().query()),
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => {
                if self.ready.load(Ordering::Relaxed) {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    fn metrics(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
        let encoded =
            match exposition::negotiate(accept) {
                Format::Text => exposition::text(&self.registry)
                    .map(|t| (Bytes::from(t), exposition::OPENMETRICS)),
                Format::Protobuf => exposition::protobuf(&self.registry)
                    .map(|b| (Bytes::from(b), exposition::PROTOBUF)),
            };
        match encoded {
            Ok((body, content_type)) => with_type(Response::new(Full::new(body)), content_type),
            Err(e) => {
                tracing::error!(error = %e, "encoding metrics failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "metrics encoding failed\n",
                )
            }
        }
    }

    fn requests(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let limit = match query_param(query, "limit") {
            None => DEFAULT_LIMIT,
            Some(v) => match v.parse::<usize>() {
                Ok(n) => n,
                Err(_) => return json_error(StatusCode::BAD_REQUEST, "limit must be a number"),
            },
        };
        #[derive(Serialize)]
        struct Body<'a> {
            requests: Vec<&'a RequestRecord>,
        }
        let records = self.recent.latest(limit);
        let body = Body {
            requests: records.iter().map(|r| r.as_ref()).collect(),
        };
        json(StatusCode::OK, &body)
    }
}

/// The summary document with `attribution` beside its keys: the calibration's scraped
/// entries (`source: scrape`, one per engine model) first, then the engine's own
/// per-request timings (`source: requests`, one per class and model).
#[derive(serde::Serialize)]
struct WithAttribution<'a> {
    #[serde(flatten)]
    summary: &'a crate::stats::engine::Summary,
    attribution: Vec<AttributionEntry>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum AttributionEntry {
    Scrape {
        source: &'static str,
        #[serde(flatten)]
        scraped: crate::calibrate::Attribution,
    },
    Requests(crate::stats::engine::RequestAttribution),
}

impl Admin {
    /// `?window=5m` (default: 5m when configured, else the first configured window).
    fn summary(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let engine = self.live.lock();
        let windows: Vec<(String, Duration)> =
            engine.windows().map(|(l, d)| (l.to_owned(), d)).collect();
        let window = match query_param(query, "window") {
            Some(w) => match parse_window(w) {
                Ok(d) => d,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("window: {e}")),
            },
            None => windows
                .iter()
                .find(|(_, d)| *d == Duration::from_secs(300))
                .or(windows.first())
                .map_or(Duration::from_secs(300), |(_, d)| *d),
        };
        match engine.summary(window, Instant::now()) {
            Some(summary) => {
                let per_request = engine.request_attribution(window, Instant::now());
                drop(engine);
                // Where time went over the window, from the calibration scrapes (`[]`
                // without any).
                let attribution = self
                    .calibration
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .attribution_over(window, std::time::Instant::now())
                    .into_iter()
                    .map(|scraped| AttributionEntry::Scrape {
                        source: "scrape",
                        scraped,
                    })
                    .chain(per_request.into_iter().map(AttributionEntry::Requests))
                    .collect();
                json(
                    StatusCode::OK,
                    &WithAttribution {
                        summary: &summary,
                        attribution,
                    },
                )
            }
            None => {
                let known: Vec<&str> = windows.iter().map(|(l, _)| l.as_str()).collect();
                json_error(
                    StatusCode::BAD_REQUEST,
                    &format!("window not configured; configured: {}", known.join(", ")),
                )
            }
        }
    }

    /// The drift statistics against their thresholds. `?optional=true` answers `null`
    /// instead of 404 while there is no evaluation (the dashboard's poll).
    fn drift(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let status = self
            .drift
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match status.as_ref() {
            Some(s) => json(StatusCode::OK, s),
            None if query_param(query, "optional") == Some("true") => {
                json(StatusCode::OK, &serde_json::Value::Null)
            }
            None => json_error(
                StatusCode::NOT_FOUND,
                "drift detection is off ([drift] baseline) or has not evaluated yet",
            ),
        }
    }

    /// The engine's means beside the proxy's, per model and quantity (`[calibration]`).
    fn calibration(&self) -> Response<Full<Bytes>> {
        let status = self
            .calibration
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        json(StatusCode::OK, &*status)
    }

    /// `?window=5m` (default 5m): primary and shadow side by side over the mirrored
    /// requests whose shadow finished in the window, with the verdict per class.
    fn shadow(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let window = match query_param(query, "window").map(parse_window) {
            None => Duration::from_secs(300),
            Some(Ok(w)) => w,
            Some(Err(e)) => return json_error(StatusCode::BAD_REQUEST, &format!("window: {e}")),
        };
        let config = self.config.load();
        json(StatusCode::OK, &self.shadow.report(window, &config.slo))
    }

    /// `?limit=N`: the newest N points (default: every point kept).
    fn timeline(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let limit = match query_param(query, "limit").map(str::parse::<usize>) {
            None => None,
            Some(Ok(n)) => Some(n),
            Some(Err(_)) => return json_error(StatusCode::BAD_REQUEST, "limit must be a number"),
        };
        let timeline = self.live.lock().timeline(Instant::now(), limit);
        json(StatusCode::OK, &timeline)
    }

    /// `?class=NAME` (default: all classes pooled).
    fn capacity(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let class = query_param(query, "class");
        match self.live.lock().capacity(class, Instant::now()) {
            Some(c) => json(StatusCode::OK, &c),
            None => json_error(StatusCode::NOT_FOUND, "no such SLO class"),
        }
    }
}

fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

fn with_type(mut resp: Response<Full<Bytes>>, content_type: &'static str) -> Response<Full<Bytes>> {
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = with_type(
        Response::new(Full::new(Bytes::from_static(body.as_bytes()))),
        "text/plain",
    );
    *resp.status_mut() = status;
    resp
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut resp = with_type(
                Response::new(Full::new(Bytes::from(body))),
                "application/json",
            );
            *resp.status_mut() = status;
            resp
        }
        Err(e) => {
            tracing::error!(error = %e, "serializing an API response failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "serialization failed\n")
        }
    }
}

fn json_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(
        status,
        &serde_json::json!({ "error": { "message": message } }),
    )
}

/// The `WWW-Authenticate` challenge of every 401.
const CHALLENGE: &str = "Bearer realm=\"goodput admin\"";

/// 401 with an error body shaped like the proxy's; nothing about the token is echoed.
fn unauthorized() -> Response<Full<Bytes>> {
    let mut resp = json(
        StatusCode::UNAUTHORIZED,
        &serde_json::json!({
            "error": {
                "message": "the admin endpoints need `Authorization: Bearer <token>` ([admin] token_file)",
                "type": "goodput_admin_error",
                "code": "unauthorized",
            }
        }),
    );
    resp.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
    resp
}

/// Serves the admin endpoints until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    admin: Admin,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let admin = admin.clone();
        // Loaded per connection: a reload's new certificate serves the next connection.
        let tls = admin.config.load().admin_access.tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return connection(stream, admin).await;
            };
            let acceptor = TlsAcceptor::from(tls);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => connection(stream, admin).await,
                Ok(Err(e)) => tracing::debug!(error = %e, "admin TLS handshake failed"),
                Err(_) => tracing::debug!("admin TLS handshake timed out"),
            }
        });
    }
}

async fn connection<S>(stream: S, admin: Admin)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let resp = admin.route(&req);
        async move { Ok::<_, Infallible>(resp) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), svc);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "admin connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::query_param;

    #[test]
    fn query_params() {
        assert_eq!(query_param(Some("a=1&limit=5"), "limit"), Some("5"));
        assert_eq!(query_param(Some("limits=5"), "limit"), None);
        assert_eq!(query_param(None, "limit"), None);
    }
}
