//! The optional drift webhook (`[drift] webhook`): a JSON POST for each evaluation that
//! fired or cleared a dimension. [`Webhook::notify`] never blocks: it queues into a small
//! bounded channel (a full queue drops the notification, logged) and a task delivers,
//! retrying connection failures, 429 and 5xx with exponential backoff.
//!
//! Payload: `{"event": "goodput.drift", "drifted": bool, "transitions": [...],
//! "status": <GET /api/v1/drift>}`. Logs name the webhook's host only: webhook URLs often
//! carry a secret in their path.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::Full;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use serde::Serialize;
use tokio::sync::mpsc;

use super::DriftStatus;

/// Notifications waiting for delivery; beyond it they are dropped.
const QUEUE: usize = 16;
/// Delivery attempts per notification.
const ATTEMPTS: u32 = 5;
/// First retry delay; doubles each attempt (1, 2, 4, 8 s).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Handle on the delivery task. Cheap to clone; the task ends when every handle is gone.
#[derive(Clone, Debug)]
pub struct Webhook {
    tx: mpsc::Sender<Bytes>,
}

#[derive(Serialize)]
struct Payload<'a> {
    event: &'static str,
    drifted: bool,
    transitions: &'a [super::Transition],
    status: &'a DriftStatus,
}

impl Webhook {
    /// Spawns the delivery task (call inside the Tokio runtime).
    pub fn start(url: Uri) -> Webhook {
        Self::start_with(url, FIRST_BACKOFF)
    }

    /// As [`Self::start`] with another first backoff (tests).
    pub fn start_with(url: Uri, first_backoff: Duration) -> Webhook {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver_all(url, rx, first_backoff));
        Webhook { tx }
    }

    /// Queues a notification for `status`; returns false when it was dropped.
    pub fn notify(&self, status: &DriftStatus) -> bool {
        let payload = Payload {
            event: "goodput.drift",
            drifted: status.drifted,
            transitions: &status.transitions,
            status,
        };
        let Ok(body) = serde_json::to_vec(&payload) else {
            return false;
        };
        let queued = self.tx.try_send(Bytes::from(body)).is_ok();
        if !queued {
            tracing::warn!("drift webhook queue full; notification dropped");
        }
        queued
    }
}

type HookClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn client() -> Option<HookClient> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(ATTEMPT_TIMEOUT));
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new());
    Some(builder.build(connector))
}

async fn deliver_all(url: Uri, mut rx: mpsc::Receiver<Bytes>, first_backoff: Duration) {
    let host = url.host().unwrap_or("?").to_owned();
    let Some(client) = client() else {
        tracing::warn!(host, "drift webhook disabled: TLS set-up failed");
        return;
    };
    while let Some(body) = rx.recv().await {
        let mut backoff = first_backoff;
        for attempt in 1..=ATTEMPTS {
            match post(&client, &url, body.clone()).await {
                Ok(status) if status.is_success() => break,
                Ok(status) if status.as_u16() != 429 && status.is_client_error() => {
                    tracing::warn!(
                        host,
                        status = status.as_u16(),
                        "drift webhook refused the notification"
                    );
                    break;
                }
                outcome => {
                    let why = match outcome {
                        Ok(status) => format!("HTTP {}", status.as_u16()),
                        Err(e) => e,
                    };
                    if attempt == ATTEMPTS {
                        tracing::warn!(host, error = %why, attempts = ATTEMPTS, "drift webhook delivery failed");
                    } else {
                        tracing::debug!(host, error = %why, attempt, "drift webhook retry");
                        tokio::time::sleep(backoff).await;
                        backoff *= 2;
                    }
                }
            }
        }
    }
}

async fn post(client: &HookClient, url: &Uri, body: Bytes) -> Result<http::StatusCode, String> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::USER_AGENT,
            concat!("goodput/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(ATTEMPT_TIMEOUT, client.request(req)).await {
        Ok(Ok(resp)) => Ok(resp.status()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}
