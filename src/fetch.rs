//! One small GET client for what goodput reads besides the traffic it carries: a replay's
//! GPU exporters and what the target says about itself, and the upstream's identity
//! ([`crate::identity`]) while serving. Each GET has a timeout and a body limit; a
//! failure is a value, never a stopped run.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};

/// Answers larger than this are cut off (an exporter of 8 GPUs serves about 100 KB).
const BODY_LIMIT: usize = 4 << 20;

/// What one GET got.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why a GET got nothing.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("not an http(s) URL")]
    Url,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach it: {0}")]
    Unreachable(String),
    #[error("the answer broke off or is over 4 MiB: {0}")]
    Body(String),
}

/// The GET client; cheap to clone.
#[derive(Clone, Debug)]
pub struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
    /// Sent to the target only (`--api-key-env`), never to the exporters.
    auth: Option<HeaderValue>,
}

impl Fetcher {
    pub fn new(timeout: Duration, auth: Option<HeaderValue>) -> Fetcher {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_max_idle_per_host(1)
            .build(connector);
        Fetcher {
            client,
            timeout,
            auth,
        }
    }

    /// GETs `url` (with the target's credentials when `authorized`).
    pub async fn get(&self, url: &str, authorized: bool) -> Result<Got, FetchError> {
        let uri: http::Uri = url.parse().map_err(|_| FetchError::Url)?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(FetchError::Url);
        }
        let mut req = Request::get(uri);
        if let Some(h) = req.headers_mut() {
            h.insert(
                header::USER_AGENT,
                HeaderValue::from_static(concat!("goodput/", env!("CARGO_PKG_VERSION"))),
            );
            if let (true, Some(a)) = (authorized, &self.auth) {
                h.insert(header::AUTHORIZATION, a.clone());
            }
        }
        let req = req.body(Empty::new()).map_err(|_| FetchError::Url)?;
        let work = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| FetchError::Unreachable(chain(&e)))?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| FetchError::Body(e.to_string()))?
                .to_bytes();
            Ok(Got {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| FetchError::Timeout(self.timeout))?
    }
}

/// An error and its sources, `: `-joined (hyper's own message says little).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        s.push_str(": ");
        s.push_str(&c.to_string());
        next = c.source();
    }
    s
}
