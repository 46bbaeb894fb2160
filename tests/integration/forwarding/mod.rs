//! Byte-exact forwarding and measurement correctness over real loopback sockets.
//!
//! Two kinds of upstream: the misbehaving fake (`common::fake`), whose every byte and write
//! boundary the test chooses, for "what the client gets is exactly what the upstream sent"
//! and for timelines the test controls; and the simulator (`goodput::sim`), whose ground
//! truth (`Sim::truth`) says when each token really left, for "what goodput measured is what
//! happened". Records are matched to requests by the `x-request-id` each test sets.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use crate::common::fake::{
    FakeUpstream, LAST_CHUNK, SSE_HEAD, Script, Step, WritePlan, decode_chunked, http_chunk,
    openai_chat_events,
};
use crate::common::harness::*;
use bytes::Bytes;
use goodput::run::Running;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;

/// Upper bound for anything that should take milliseconds on loopback.
const T: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn url(proxy: &Running, path: &str) -> String {
    format!("http://{}{path}", proxy.proxy_addr)
}

/// POSTs `body` through a fresh hyper client with exactly these extra headers.
#[expect(
    clippy::unwrap_used,
    reason = "test helper: a request that cannot be sent must stop the test"
)]
async fn send(url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Response<Incoming> {
    let mut req = Request::post(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body.into())).unwrap();
    client().request(req).await.unwrap()
}

/// A JSON POST carrying `x-request-id: id`.
async fn send_json(url: &str, id: &str, body: impl Into<Bytes>) -> Response<Incoming> {
    send(
        url,
        &[("content-type", "application/json"), ("x-request-id", id)],
        body,
    )
    .await
}

/// Status, headers and the whole body.
#[expect(
    clippy::unwrap_used,
    reason = "test helper: a body that cannot be read must stop the test"
)]
async fn collect(resp: Response<Incoming>) -> (u16, HeaderMap, Bytes) {
    let status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    (
        status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

/// A raw HTTP/1.1 POST with `Connection: close` and the given extra header lines.
fn raw_post_with(path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// The header value of `name` in a raw response head (first match, any case).
fn head_value(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// Every header name in a raw response head, lowercased.
fn head_names(head: &str) -> Vec<String> {
    head.lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(n, _)| n.trim().to_ascii_lowercase())
        .collect()
}

/// The record with this id, waiting for it to be finished; `None` after [`T`].
async fn record(admin: SocketAddr, id: &str) -> Option<Value> {
    poll_loop!(deadline = tokio::time::Instant::now() + T, {
        if let Some(r) = records(admin).await.into_iter().find(|r| r["id"] == id) {
            return Some(r);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
    });
}

/// A numeric record field.
fn num(r: &Value, field: &str) -> Option<f64> {
    r[field].as_f64()
}

/// GETs an admin path; returns status, content type and body.
#[expect(
    clippy::unwrap_used,
    reason = "test helper: an admin endpoint that cannot be read must stop the test"
)]
async fn admin_get_typed(admin: SocketAddr, path: &str) -> (u16, String, String) {
    let resp = client()
        .get(format!("http://{admin}{path}").parse().unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// `openai_chat_events(5, true)` with an SSE comment (keep-alive) right after the role chunk.
fn lf_events() -> Vec<Vec<u8>> {
    let mut events = openai_chat_events(5, true);
    events.insert(1, b": keep-alive\n\n".to_vec());
    events
}

/// [`lf_events`] framed with CRLF line ends.
fn crlf_events() -> Vec<Vec<u8>> {
    lf_events()
        .into_iter()
        .map(|e| {
            let text = String::from_utf8_lossy(&e).replace('\n', "\r\n");
            text.into_bytes()
        })
        .collect()
}

/// [`lf_events`] framed with bare CR line ends (legal SSE, rarely seen).
fn cr_events() -> Vec<Vec<u8>> {
    lf_events()
        .into_iter()
        .map(|e| {
            e.into_iter()
                .map(|b| if b == b'\n' { b'\r' } else { b })
                .collect()
        })
        .collect()
}

/// The offset just past each event in the concatenated stream.
fn event_ends(events: &[Vec<u8>]) -> Vec<usize> {
    events
        .iter()
        .scan(0, |end, e| {
            *end += e.len();
            Some(*end)
        })
        .collect()
}

/// A streamed chat request through the proxy in front of a fake answering with `events`
/// cut by `plan`, once with hyper and once with a raw socket: both must receive exactly the
/// events' bytes, and both records must show the stream decoded whatever the cut.
#[expect(
    clippy::unwrap_used,
    reason = "test helper: a missing record or undecodable body must stop the test"
)]
async fn check_sse_passthrough(events: Vec<Vec<u8>>, plan: WritePlan) {
    let expected: Vec<u8> = events.concat();
    let fake = FakeUpstream::start(Script::sse_chunked(&events, plan, Duration::ZERO)).await;
    let proxy = start_proxy(&fake.url()).await;
    let request = chat_body(true, 5, true);

    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "via-hyper",
        request.clone(),
    )
    .await;
    let (status, headers, body) = collect(resp).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(body.as_ref(), expected.as_slice());

    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "via-raw")],
        request.as_bytes(),
    );
    let (out, errored) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    assert!(!errored, "the proxy reset a healthy stream");
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(
        head_value(&head, "transfer-encoding").as_deref(),
        Some("chunked")
    );
    let (data, used) = decode_chunked(rest).unwrap();
    assert_eq!(used, rest.len(), "bytes after the last chunk");
    assert_eq!(
        String::from_utf8_lossy(&data),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(data, expected);

    for id in ["via-hyper", "via-raw"] {
        let r = record(proxy.admin_addr, id).await.unwrap();
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["status"], 200);
        assert_eq!(r["stream"], true);
        assert_eq!(r["model"], "test-model");
        assert_eq!(r["api"], "chat_completions");
        assert_eq!(r["events"], 5, "content events, whatever the chunking: {r}");
        assert_eq!(r["output_tokens"], 5);
        assert_eq!(r["output_tokens_source"], "usage");
        assert_eq!(r["input_tokens"], 7);
        assert_eq!(r["input_tokens_source"], "usage");
        assert_eq!(r["bytes_out"], expected.len());
        assert!(r["ttft_ms"].is_number(), "{r}");
    }
    assert_eq!(fake.requests().await.len(), 2);
    proxy.shutdown().await;
}

fn ok_json_script() -> Script {
    Script::response(
        200,
        &[("content-type", "application/json")],
        br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#,
    )
}

mod bad_endings;
mod byte_exact;
mod h2_lanes;
mod inspection_limit;
mod records_api;
mod relay_parity;
mod request_side;
mod token_counts;
mod ttft;
mod unknown_paths;
mod upstream_connections;
mod upstream_errors;
