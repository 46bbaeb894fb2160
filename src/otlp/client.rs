//! The HTTP client the OTLP exporters send through: hyper (already the proxy's engine)
//! with rustls for `https://` collectors, a whole-request deadline, the configured headers,
//! and a bounded read of the (unused) response body. It replaces the exporters' default
//! reqwest client, which would add a second HTTP stack to the build.

use std::{
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, header::USER_AGENT};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use opentelemetry_http::{HttpClient, HttpError};

use crate::config::Otlp;

/// A collector answers with a small (often empty) status message; anything longer than
/// this is not read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

const USER_AGENT_VALUE: &str = concat!("goodput/", env!("CARGO_PKG_VERSION"));

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Connect(#[source] hyper_util::client::legacy::Error),
    #[error("reading the answer: {0}")]
    Body(#[source] HttpError),
}

/// Sends export requests to the collector.
#[derive(Clone)]
pub struct CollectorClient {
    inner: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    /// The last transport failure, for the log: the exporters report it only as a
    /// "network error".
    last_error: Arc<Mutex<Option<String>>>,
}

impl fmt::Debug for CollectorClient {
    // Header values may be credentials: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectorClient")
            .field("headers", &self.headers.len())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CollectorClient {
    pub fn new(cfg: &Otlp) -> CollectorClient {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(cfg.timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(rustls::ClientConfig::clone(&cfg.tls))
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(2);
        CollectorClient {
            inner: builder.build(connector),
            headers: cfg.headers.clone(),
            timeout: cfg.timeout,
            last_error: Arc::default(),
        }
    }

    /// A client of its own (the same connection pool) whose failures are reported apart.
    pub fn for_signal(&self) -> CollectorClient {
        CollectorClient {
            last_error: Arc::default(),
            ..self.clone()
        }
    }

    /// Takes the last transport failure, if any since the last call.
    pub fn take_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|mut e| e.take())
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, SendError> {
        let (mut parts, body) = request.into_parts();
        for (name, value) in &self.headers {
            parts.headers.insert(name.clone(), value.clone());
        }
        parts
            .headers
            .insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        let request = Request::from_parts(parts, Full::new(body));
        let exchange = async {
            let response = self
                .inner
                .request(request)
                .await
                .map_err(SendError::Connect)?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(SendError::Body)?
                .to_bytes();
            Ok(Response::from_parts(parts, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SendError::Timeout(self.timeout))?
    }
}

#[async_trait::async_trait]
impl HttpClient for CollectorClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let result = self.send(request).await;
        if let Err(e) = &result
            && let Ok(mut last) = self.last_error.lock()
        {
            *last = Some(chain(e));
        }
        Ok(result?)
    }
}

/// The error with its sources ("client error (Connect): tcp connect error: Connection
/// refused"): hyper's own message alone does not say what failed.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
