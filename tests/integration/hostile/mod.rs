//! Hostile clients and exhausted resources, over real loopback sockets: every bound the
//! proxy enforces (client connections, HTTP/2 streams, upstream connections and the wait
//! for one, request head size, request body deadline, the open-files limit) holds and
//! answers as documented, and what the client caused is recorded as `client_error`, not
//! blamed on the upstream. Each fault test checks what the client received, what the
//! record says, and that they agree.
//!
//! Hostile upstreams too, on both HTTP/1.1 clients (the relay and hyper's): malformed,
//! misframed, informational and unasked-for answers, and connections spoiled while they
//! idle in the pool ([`upstream_answers`]); and the pool's invariant, that no client ever
//! gets another request's bytes, as a property over generated plans ([`pool_invariant`]).
//!
//! Nothing here waits on luck: readiness is signalled (requests seen upstream, gauges on
//! `/metrics`), timers that must fire are short and nothing races them, and every wait
//! is bounded.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers: a failed set-up or exchange must stop the test"
)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use crate::common::{fake::*, harness::*};
use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinSet,
};

const CHAT: &str = "/v1/chat/completions";
const WAIT: Duration = Duration::from_secs(10);

fn ok_json() -> Script {
    Script::response(200, &[("content-type", "application/json")], b"{}")
}

/// The JSON error code of a proxy-made response body.
fn error_code(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// The only record, once it is there.
async fn one_record(admin: SocketAddr) -> Value {
    let records = wait_records(admin, 1, WAIT).await;
    assert_eq!(records.len(), 1, "{records:?}");
    records[0].clone()
}

/// The value of `name{labels}` on `/metrics` (0 when absent).
async fn metric(admin: SocketAddr, series: &str) -> f64 {
    metric_value(&metrics(admin).await, series).unwrap_or(0.0)
}

/// Waits (bounded) until `series` reaches `at_least`, and returns its last value.
async fn wait_metric(admin: SocketAddr, series: &str, at_least: f64) -> f64 {
    poll_loop!(deadline = tokio::time::Instant::now() + WAIT, {
        let v = metric(admin, series).await;
        if v >= at_least || tokio::time::Instant::now() >= deadline {
            return v;
        }
    });
}

/// A raw HTTP/1.1 exchange: status code and body of the response (0 and empty if none).
async fn raw_status(addr: SocketAddr, request: &[u8]) -> (u16, Vec<u8>) {
    let (raw, _) = raw_exchange(addr, request, WAIT).await;
    status_and_body(&raw)
}

/// The status code and body of a raw HTTP/1.1 response (0 and empty if there is none).
fn status_and_body(raw: &[u8]) -> (u16, Vec<u8>) {
    if raw.is_empty() {
        return (0, Vec::new());
    }
    let (head, body) = split_head(raw);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_vec())
}

/// Checks that the client saw a proxy-made `status` with `code` and that the record
/// says the same, with `outcome`.
async fn assert_answered(
    admin: SocketAddr,
    (status, body): (u16, Vec<u8>),
    want: (u16, &str, &str),
) {
    let (want_status, want_code, want_outcome) = want;
    assert_eq!(status, want_status, "{}", String::from_utf8_lossy(&body));
    assert_eq!(error_code(&body), want_code);
    let r = one_record(admin).await;
    assert_eq!(r["outcome"], want_outcome, "{r}");
    assert_eq!(r["status"], u64::from(want_status), "{r}");
}

/// An HTTP/2 (prior knowledge) connection to the proxy.
async fn h2_connect(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

fn h2_post(addr: SocketAddr, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{CHAT}"))
        .version(Version::HTTP_2)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

mod authority;
mod client_connections;
mod control_floods;
mod half_close;
mod http2_settings;
mod pool_invariant;
mod request_bodies;
mod request_heads;
mod server_parity;
mod slow_uploads;
mod upstream_answers;
mod upstream_bounds;
mod upstream_connections;
