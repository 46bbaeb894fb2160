//! The load generator's HTTP client and its client-side measurement.
//!
//! A hyper-util pooled client (HTTP/1.1 keep-alive, pool sized to the load; `https://`
//! through rustls with the public roots). Each response is measured by the proxy's own
//! code: the same [`StreamDecoder`] frames and classifies events, the same
//! [`Timeline`] stamps them, and [`finish::derive`] / [`finish::outcome`] turn them into
//! TTFT, TPOT, token counts and the outcome, into the same [`RequestRecord`] the proxy
//! serves on `/api/v1/requests`. The clock starts right before the request is handed to
//! the client (`t_arrival` on this side of the wire) and each event is stamped when its
//! bytes are read.

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{
    HeaderValue, Request, Uri,
    header::{AUTHORIZATION, CONTENT_TYPE},
};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use tokio::sync::watch;

use super::plan::ReplayApi;
use crate::{
    decode::{self, StreamDecoder, StreamKind},
    measure::{
        Arrival, Ending, Outcome, REQUEST_ID, RequestRecord, Timeline,
        finish::{self, Derived},
        record::ItlSummary,
    },
};

/// Non-streaming response bodies kept for their usage (larger ones are not parsed).
const BODY_LIMIT: usize = 4 << 20;

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// The API root without a trailing slash, e.g. `http://h:8000/v1`.
    root: String,
    auth: Option<HeaderValue>,
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("--target {0:?} is not an http:// or https:// URL")]
    Url(String),
    #[error("--api-key-env {0}: the variable is not set or not valid in a header")]
    ApiKey(String),
}

impl Target {
    /// `url` with no path (or `/`) gets the `/v1` root; `api_key_env` names the variable
    /// holding a bearer token.
    pub fn new(url: &str, api_key_env: Option<&str>) -> Result<Target, TargetError> {
        let uri: Uri = url.parse().map_err(|_| TargetError::Url(url.to_owned()))?;
        let scheme = uri.scheme_str().unwrap_or_default();
        let Some(authority) = uri
            .authority()
            .filter(|_| matches!(scheme, "http" | "https"))
        else {
            return Err(TargetError::Url(url.to_owned()));
        };
        let path = uri.path().trim_end_matches('/');
        let path = if path.is_empty() { "/v1" } else { path };
        let auth = match api_key_env {
            None => None,
            Some(var) => {
                let key = std::env::var(var).map_err(|_| TargetError::ApiKey(var.to_owned()))?;
                let value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| TargetError::ApiKey(var.to_owned()))?;
                Some(value)
            }
        };
        Ok(Target {
            root: format!("{scheme}://{authority}{path}"),
            auth,
        })
    }

    /// The models list: the API root + `/models`.
    pub fn models_url(&self) -> String {
        format!("{}/models", self.root)
    }

    /// Scheme and authority, where engines serve their version endpoints.
    pub fn origin(&self) -> String {
        let after = self.root.find("://").map_or(0, |i| i + 3);
        let end = self.root[after..]
            .find('/')
            .map_or(self.root.len(), |i| after + i);
        self.root[..end].to_owned()
    }

    /// The `Authorization` value sent with every request (`--api-key-env`).
    pub fn auth(&self) -> Option<HeaderValue> {
        self.auth.clone()
    }

    pub fn url(&self, api: ReplayApi) -> String {
        format!("{}{}", self.root, api.path())
    }
}

/// One request's result: the record plus what the report needs besides.
#[derive(Debug, Clone)]
pub struct Measured {
    pub record: RequestRecord,
    /// Every inter-token gap, µs.
    pub gaps_us: Vec<u32>,
    pub sent: Instant,
    pub ended: Instant,
    /// The whole response body (up to 4 MiB), kept for probes only.
    pub answer: Option<Vec<u8>>,
    /// A 5xx whose body named out-of-memory ([`names_out_of_memory`]).
    pub out_of_memory: bool,
}

/// Bytes of a 5xx body searched for out-of-memory wording.
const ERROR_BODY_LIMIT: usize = 8 * 1024;

/// Whether an error body names out-of-memory: PyTorch's `CUDA out of memory` and
/// `OutOfMemoryError`, vLLM's and TGI's `out of memory`, `OOM`, CUDA's
/// `cudaErrorMemoryAllocation`.
pub fn names_out_of_memory(body: &[u8]) -> bool {
    static OOM: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = OOM.get_or_init(|| {
        regex::Regex::new(r"(?i)out[\s_-]*of[\s_-]*memory|\bOOM\b|cudaErrorMemoryAllocation").ok()
    });
    re.as_ref()
        .is_some_and(|re| re.is_match(&String::from_utf8_lossy(body)))
}

/// The pooled client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    inner: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    target: Target,
    idle_timeout: Duration,
    /// `[slo] tenant_header`: each request's tenant is sent in it.
    tenant_header: Option<http::HeaderName>,
}

impl Client {
    /// A client keeping up to `pool` idle connections (the load's concurrency).
    pub fn new(target: Target, pool: usize, idle_timeout: Duration) -> Client {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let connector = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let inner = HyperClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(pool.max(1))
            .build(connector);
        Client {
            inner,
            target,
            idle_timeout,
            tenant_header: None,
        }
    }

    /// Sends each request's tenant (the profile's tenant hash) in `header`.
    pub fn with_tenant_header(mut self, header: Option<http::HeaderName>) -> Client {
        self.tenant_header = header;
        self
    }

    /// Sends one request and measures its response; `stop` turning true abandons it
    /// (recorded as `client_abort`, which attainment excludes).
    pub async fn send(&self, out: Outgoing, mut stop: watch::Receiver<bool>) -> Measured {
        let bytes_in = out.body.len() as u64;
        let mut req = Request::post(self.target.url(out.api))
            .header(CONTENT_TYPE, "application/json")
            .header(REQUEST_ID, out.id.as_str());
        if let Some(auth) = &self.target.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        if let (Some(name), Some(tenant)) = (&self.tenant_header, &out.tenant) {
            req = req.header(name, tenant.as_ref());
        }
        let mut m = Seen::new();
        m.keep_answer = out.probe.is_some();
        let started_at = SystemTime::now();
        let sent = Instant::now();
        match req.body(Full::new(out.body.clone())) {
            Err(_) => m.failure = Some(Outcome::ProxyError),
            Ok(req) => {
                let stopped = stop.clone();
                tokio::select! {
                    r = tokio::time::timeout(self.idle_timeout, self.inner.request(req)) => match r {
                        Ok(Ok(resp)) => m.read(out.api, resp, self.idle_timeout, &mut stop).await,
                        Ok(Err(_)) => m.failure = Some(Outcome::UpstreamError),
                        Err(_) => m.failure = Some(Outcome::Timeout),
                    },
                    () = stopping(stopped) => m.ending = Ending::ClientGone,
                }
            }
        }
        let ended = Instant::now();
        let answer = m.keep_answer.then(|| std::mem::take(&mut m.answer));
        let out_of_memory =
            m.status.is_some_and(|s| s >= 500) && names_out_of_memory(&m.error_body);
        let (record, gaps_us) = m.record(out, started_at, sent, ended, bytes_in);
        Measured {
            record,
            gaps_us,
            sent,
            ended,
            answer,
            out_of_memory,
        }
    }
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub api: ReplayApi,
    pub model: Option<String>,
    pub body: Bytes,
    /// Sent as `x-request-id`.
    pub id: String,
    /// Requests in flight including this one.
    pub concurrency: u32,
    /// The index of the quality probe this request is (its answer is kept).
    pub probe: Option<usize>,
    /// An injected or burst request.
    pub inject: Option<super::inject::Kind>,
    /// The tenant header's value (the profile's tenant hash).
    pub tenant: Option<std::sync::Arc<str>>,
}

async fn stopping(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What the client saw of one response.
struct Seen {
    failure: Option<Outcome>,
    status: Option<u16>,
    kind: Option<StreamKind>,
    ending: Ending,
    timeline: Timeline,
    decoded: bool,
    broken: bool,
    body: Vec<u8>,
    overflow: bool,
    bytes_out: u64,
    keep_answer: bool,
    answer: Vec<u8>,
    /// The start of a 5xx body, whatever its type.
    error_body: Vec<u8>,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            failure: None,
            status: None,
            kind: None,
            ending: Ending::Complete,
            timeline: Timeline::default(),
            decoded: false,
            broken: false,
            body: Vec::new(),
            overflow: false,
            bytes_out: 0,
            keep_answer: false,
            answer: Vec::new(),
            error_body: Vec::new(),
        }
    }

    async fn read(
        &mut self,
        api: ReplayApi,
        resp: http::Response<hyper::body::Incoming>,
        idle: Duration,
        stop: &mut watch::Receiver<bool>,
    ) {
        self.status = Some(resp.status().as_u16());
        let ct = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let kind = StreamKind::from_content_type(ct);
        self.kind = Some(kind);
        let mut decoder = StreamDecoder::new(api.decode_api(), kind);
        self.decoded = decoder.is_some();
        let mut body = resp.into_body();
        self.ending = loop {
            let frame = tokio::select! {
                f = tokio::time::timeout(idle, body.frame()) => f,
                () = stopping(stop.clone()) => break Ending::ClientGone,
            };
            let data = match frame {
                Err(_) => break Ending::IdleTimeout,
                Ok(None) => break Ending::Complete,
                Ok(Some(Err(_))) => break Ending::UpstreamFailed,
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            };
            let now = Instant::now();
            self.bytes_out += data.len() as u64;
            if self.keep_answer && self.answer.len() + data.len() <= BODY_LIMIT {
                self.answer.extend_from_slice(&data);
            }
            if self.status.is_some_and(|s| s >= 500) && self.error_body.len() < ERROR_BODY_LIMIT {
                let room = ERROR_BODY_LIMIT - self.error_body.len();
                self.error_body
                    .extend_from_slice(&data[..data.len().min(room)]);
            }
            if let Some(d) = decoder.as_mut() {
                let tl = &mut self.timeline;
                d.feed(&data, |ev| tl.on_event(now, ev));
            } else if kind == StreamKind::Json && !self.overflow {
                self.overflow = self.body.len() + data.len() > BODY_LIMIT;
                if !self.overflow {
                    self.body.extend_from_slice(&data);
                }
            }
        };
        if let Some(d) = decoder.as_mut() {
            if self.ending == Ending::Complete {
                let (tl, now) = (&mut self.timeline, Instant::now());
                d.finish(|ev| tl.on_event(now, ev));
            }
            self.broken = d.is_broken();
        }
    }

    fn record(
        mut self,
        out: Outgoing,
        started_at: SystemTime,
        sent: Instant,
        ended: Instant,
        bytes_in: u64,
    ) -> (RequestRecord, Vec<u32>) {
        let api = out.api.decode_api();
        let body = (self.kind == Some(StreamKind::Json) && !self.overflow)
            .then(|| decode::parse_response_body(api, &self.body))
            .flatten();
        let stream_error = self.timeline.error || body.is_some_and(|b| b.error);
        let unterminated = self.decoded && !self.broken && !self.timeline.terminal;
        let outcome = finish::outcome(
            self.failure,
            self.status,
            self.ending,
            stream_error,
            unterminated,
        );
        let usage = body.and_then(|b| b.usage);
        let d: Derived = finish::derive(sent, &self.timeline, usage, None, None, self.decoded);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let gaps = std::mem::take(&mut self.timeline.gaps_us);
        let mut sorted = gaps.clone();
        let record = RequestRecord {
            id: out.id,
            started_at: crate::measure::WallClock(started_at),
            model: out.model,
            api: api.as_str(),
            stream: matches!(self.kind, Some(StreamKind::Sse | StreamKind::Ndjson)),
            status: self.status,
            outcome,
            ttft_ms: d.ttft.map(ms),
            ttfo_ms: d.ttfo.map(ms),
            tpot_ms: d.tpot.map(ms),
            e2e_ms: ms(ended.saturating_duration_since(sent)),
            // The replayer sends each body whole at once: nothing to set apart.
            upload_ms: None,
            ttft_after_upload_ms: d.ttft.map(ms),
            e2e_after_upload_ms: ms(ended.saturating_duration_since(sent)),
            itl_ms: ItlSummary::from_gaps_us(&mut sorted),
            input_tokens: d.input_tokens,
            input_tokens_source: d.input_tokens_source,
            cached_input_tokens: self
                .timeline
                .cached_input_tokens
                .or(body.and_then(|b| b.cached_input_tokens)),
            output_tokens: d.output_tokens,
            output_tokens_source: d.output_tokens_source,
            events: self.timeline.events,
            bytes_out: self.bytes_out,
            terminal_event: self.timeline.terminal,
            slo_class: "".into(),
            slo_met: None,
            slo_miss_reason: None,
            slo_miss_component: None,
            engine: Default::default(),
            clock: crate::measure::Clock::User,
            finished_at: Some(ended),
            bytes_in,
            finish_reason: self
                .timeline
                .finish_reason
                .or(body.and_then(|b| b.finish_reason)),
            decode_failed: self.broken,
            arrival: Arrival {
                concurrency: out.concurrency,
                // Set by the load generator, which knows what else is in flight.
                long_in_flight: false,
            },
            tenant: None,
            slo_overrides: Default::default(),
            slo_header_invalid: 0,
            slo_source: None,
            trace: None,
            pairing: Default::default(),
        };
        (record, gaps)
    }
}

#[cfg(test)]
mod tests {
    use super::names_out_of_memory;

    #[test]
    fn out_of_memory_is_named_in_the_engines_words() {
        for body in [
            r#"{"object":"error","message":"CUDA out of memory. Tried to allocate 2.00 GiB","type":"InternalServerError","code":500}"#,
            "torch.OutOfMemoryError: CUDA error",
            r#"{"error":"Request failed during generation: Server error: out-of-memory"}"#,
            "OOM when allocating tensor",
            "cudaErrorMemoryAllocation",
        ] {
            assert!(names_out_of_memory(body.as_bytes()), "{body}");
        }
        for body in [
            "Internal Server Error",
            "no room left in the zoom",
            "memory ok",
        ] {
            assert!(!names_out_of_memory(body.as_bytes()), "{body}");
        }
    }
}
