//! Every fault path of the data path, over real loopback sockets: upstream resets and
//! truncated streams reach the client as aborts (after every byte the upstream did send), a
//! client that goes away cancels the upstream request, a dead or silent upstream becomes a
//! 502 / 504, idle and header-read timeouts fire (and never cut a healthy stream), shutdown
//! drains and then cuts, measurement never holds traffic back, and the binary's exit codes.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::common::{fake::*, harness::*, temp::TempDir};
use bytes::Bytes;
use goodput::{config::Config, measure::Outcome, run::Running};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const CHAT: &str = "/v1/chat/completions";

/// How a raw client read ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Orderly close (FIN).
    Eof,
    /// The connection was reset.
    Reset,
    /// Still open when the test stopped waiting.
    TimedOut,
}

/// Reads until the peer closes or `timeout` passes.
async fn read_to_end(s: &mut TcpStream, timeout: Duration) -> (Vec<u8>, End) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return End::Eof,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => return End::Reset,
            }
        }
    };
    let end = tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(End::TimedOut);
    (out, end)
}

/// Decodes the whole chunks (and the data of a cut last one) of a chunked body. Returns the
/// data and whether the terminating `0\r\n\r\n` chunk was there.
fn dechunk(mut body: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return (data, false);
        };
        let Some(size) = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
        else {
            return (data, false);
        };
        body = &body[eol + 2..];
        if size == 0 {
            return (data, body.starts_with(b"\r\n"));
        }
        let take = size.min(body.len());
        data.extend_from_slice(&body[..take]);
        if body.len() < size + 2 {
            return (data, false);
        }
        body = &body[size + 2..];
    }
}

/// Splits a raw response into its head and body, if the head is complete.
fn head_and_body(raw: &[u8]) -> Option<(String, &[u8])> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((
        String::from_utf8_lossy(&raw[..end]).into_owned(),
        &raw[end..],
    ))
}

/// Polls every frame of a body; returns the data and how the body ended.
async fn read_body(mut body: Incoming) -> (Vec<u8>, Result<(), hyper::Error>) {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    out.extend_from_slice(d);
                }
            }
            Err(e) => return (out, Err(e)),
        }
    }
    (out, Ok(()))
}

/// Reads data frames until at least `n` SSE events (`\n\n`) arrived; returns the data.
async fn read_events(body: &mut Incoming, n: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while out.windows(2).filter(|w| w == b"\n\n").count() < n {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    out.extend_from_slice(d);
                }
            }
            Some(Err(e)) => return Err(format!("body error after {} bytes: {e}", out.len())),
            None => return Err(format!("body ended after {} bytes", out.len())),
        }
    }
    Ok(out)
}

/// Sends a raw streaming chat request and reads from the socket until it holds `n` events.
async fn raw_stream_events(addr: SocketAddr, n: usize) -> Result<(TcpStream, Vec<u8>), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.write_all(&raw_post(CHAT, &chat_body(true, 100, false)))
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some((_, body)) = head_and_body(&raw)
            && dechunk(body).0.windows(2).filter(|w| w == b"\n\n").count() >= n
        {
            return Ok((s, raw));
        }
        match tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
            Ok(Ok(0)) => return Err("closed early".into()),
            Ok(Ok(k)) => raw.extend_from_slice(&buf[..k]),
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        }
    }
}

fn chat_url(p: &Running) -> String {
    format!("http://{}{CHAT}", p.proxy_addr)
}

/// Waits for exactly one record and returns it.
async fn one_record(admin: SocketAddr) -> Value {
    let recs = wait_records(admin, 1, Duration::from_secs(3)).await;
    assert_eq!(recs.len(), 1, "expected one record: {recs:?}");
    recs.into_iter().next().unwrap_or_default()
}

fn concat(events: &[Vec<u8>]) -> Vec<u8> {
    events.concat()
}

/// A script whose upstream writes the head and `n` events, waits so the proxy surely
/// read them (a reset discards unread bytes in the kernel), then ends with `last`.
fn prefix_then(events: &[Vec<u8>], n: usize, last: Step) -> Script {
    let mut s = Script::sse_then_close(events, n);
    s.steps.pop();
    s.then(Step::Sleep(Duration::from_millis(50))).then(last)
}

/// [`SSE_HEAD`] and the first `n` events, then `last` at once.
fn prefix_then_at_once(events: &[Vec<u8>], n: usize, last: Step) -> Script {
    let mut s = Script::sse_then_close(events, n);
    s.steps.pop();
    s.then(last)
}

fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>()
}

// ---------------------------------------------------------------------------------------
// 1, 2: upstream reset or truncation mid-stream reaches the client as an abort.

#[expect(clippy::unwrap_used, reason = "test body shared by two tests")]
async fn truncated_upstream_is_an_abort_for_raw_http1(last: Step) {
    let events = openai_chat_events(5, false);
    let up = FakeUpstream::start(prefix_then(&events, 4, last.clone())).await;
    let proxy = start_proxy(&up.url()).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    s.write_all(&raw_post(CHAT, &chat_body(true, 5, false)))
        .await
        .unwrap();
    let (raw, end) = read_to_end(&mut s, Duration::from_secs(3)).await;
    assert_ne!(
        end,
        End::TimedOut,
        "{last:?}: the client connection must end"
    );
    let (head, body) = head_and_body(&raw).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let (data, terminated) = dechunk(body);
    assert!(
        !terminated,
        "{last:?}: no terminating chunk after an upstream failure"
    );
    assert!(!body.ends_with(b"0\r\n\r\n"));
    assert_eq!(
        String::from_utf8_lossy(&data),
        String::from_utf8_lossy(&concat(&events[..4])),
        "{last:?}: every byte the upstream sent is delivered"
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "upstream_reset", "{last:?}: {r}");
    assert_eq!(r["status"], 200);
    assert_eq!(
        r["events"], 3,
        "role chunk + 3 content events were delivered: {r}"
    );
    assert_eq!(r["bytes_out"], concat(&events[..4]).len());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_reset_mid_stream_is_an_abort_for_http1() {
    truncated_upstream_is_an_abort_for_raw_http1(Step::Reset).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_close_without_terminator_is_an_abort_for_http1() {
    truncated_upstream_is_an_abort_for_raw_http1(Step::Close).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_reset_is_a_body_error_for_a_hyper_client() {
    let events = openai_chat_events(5, false);
    for last in [Step::Reset, Step::Close] {
        let up = FakeUpstream::start(prefix_then(&events, 3, last.clone())).await;
        let proxy = start_proxy(&up.url()).await;
        let resp = post(&client(), &chat_url(&proxy), chat_body(true, 5, false)).await;
        assert_eq!(resp.status(), 200);
        let (data, end) = read_body(resp.into_body()).await;
        assert!(end.is_err(), "{last:?}: a cut stream must not end cleanly");
        assert_eq!(data, concat(&events[..3]), "{last:?}");
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["outcome"], "upstream_reset", "{last:?}: {r}");
        assert_eq!(r["events"], 2);
        proxy.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_reset_is_a_stream_reset_for_an_http2_client() {
    let events = openai_chat_events(5, false);
    let up = FakeUpstream::start(prefix_then(&events, 4, Step::Reset)).await;
    let proxy = start_proxy(&up.url()).await;
    let client = h2_client();
    let resp = post(&client, &chat_url(&proxy), chat_body(true, 5, false)).await;
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let (data, end) = read_body(resp.into_body()).await;
    let err = end.expect_err("an h2 stream cut upstream must be reset, not ended");
    let shown = format!("{err:?}");
    assert!(
        shown.contains("Reset(") && shown.contains("Remote"),
        "expected RST_STREAM: {shown}"
    );
    assert_eq!(data, concat(&events[..4]));
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "upstream_reset", "{r}");
    assert_eq!(r["events"], 3);
    proxy.shutdown().await;
}

#[expect(clippy::expect_used, reason = "test body shared by three tests")]
/// Runs `rounds` streams whose upstream writes every event and then, without a pause, ends
/// the connection with `last`; each must reach the client whole before the abort, and the
/// record must count exactly what the client got.
async fn every_event_before_the_end_arrives(last: Step, http2: bool, rounds: usize) {
    let events = openai_chat_events(8, false);
    let sent = concat(&events[..9]);
    let up = FakeUpstream::start(prefix_then_at_once(&events, 9, last.clone())).await;
    let proxy = start_proxy(&up.url()).await;
    let h2 = h2_client();
    for round in 0..rounds {
        let what = format!("{last:?}, http2 {http2}, round {round}");
        let (data, aborted) = if http2 {
            let resp = post(&h2, &chat_url(&proxy), chat_body(true, 8, false)).await;
            assert_eq!(resp.status(), 200, "{what}");
            let (data, end) = read_body(resp.into_body()).await;
            (data, end.is_err())
        } else {
            let request = raw_post(CHAT, &chat_body(true, 8, false));
            let mut s = TcpStream::connect(proxy.proxy_addr).await.expect("connect");
            s.write_all(&request).await.expect("write");
            let (raw, end) = read_to_end(&mut s, Duration::from_secs(5)).await;
            assert_ne!(end, End::TimedOut, "{what}");
            let (head, body) = head_and_body(&raw).expect("a response head");
            assert!(head.starts_with("HTTP/1.1 200"), "{what}: {head}");
            let (data, terminated) = dechunk(body);
            (data, !terminated)
        };
        assert!(aborted, "{what}: a cut stream must not end cleanly");
        assert_eq!(
            String::from_utf8_lossy(&data),
            String::from_utf8_lossy(&sent),
            "{what}: every byte the upstream sent is delivered"
        );
        let recs = wait_records(proxy.admin_addr, round + 1, Duration::from_secs(5)).await;
        let r = recs.last().expect("a record");
        assert_eq!(r["outcome"], "upstream_reset", "{what}: {r}");
        assert_eq!(r["bytes_out"], sent.len(), "{what}: {r}");
        assert_eq!(r["events"], 8, "{what}: {r}");
    }
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_event_before_an_upstream_close_reaches_an_http1_client() {
    every_event_before_the_end_arrives(Step::Close, false, 20).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_event_before_an_upstream_reset_reaches_an_http1_client() {
    every_event_before_the_end_arrives(Step::Reset, false, 20).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_event_before_an_upstream_failure_reaches_an_http2_client() {
    every_event_before_the_end_arrives(Step::Close, true, 20).await;
    every_event_before_the_end_arrives(Step::Reset, true, 20).await;
}

/// Sends one streaming chat request over a raw connection and reads the whole reply.
#[expect(clippy::expect_used, reason = "test helper")]
async fn raw_reply(p: &Running) -> (String, Vec<u8>) {
    let request = raw_post(CHAT, &chat_body(true, 8, false));
    let mut s = TcpStream::connect(p.proxy_addr).await.expect("connect");
    s.write_all(&request).await.expect("write");
    let (raw, end) = read_to_end(&mut s, Duration::from_secs(5)).await;
    assert_ne!(end, End::TimedOut);
    let (head, body) = head_and_body(&raw).expect("a response head");
    (head, body.to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_response_is_a_502_when_nothing_was_sent_yet() {
    let mut chunk_size = SSE_HEAD.to_vec();
    chunk_size.extend_from_slice(b"zz\r\ndata: x\n\n\r\n");
    let both_lengths = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    for (what, bytes) in [
        ("malformed chunk size", chunk_size),
        ("content-length and chunked", both_lengths.to_vec()),
    ] {
        let script = Script::new(vec![Step::Write(Bytes::from(bytes)), Step::Close]);
        let up = FakeUpstream::start(script).await;
        let proxy = start_proxy(&up.url()).await;
        let (head, body) = raw_reply(&proxy).await;
        assert!(head.starts_with("HTTP/1.1 502"), "{what}: {head}");
        let text = if head.to_ascii_lowercase().contains("chunked") {
            dechunk(&body).0
        } else {
            body
        };
        let json: Value = serde_json::from_slice(&text).expect("a JSON error body");
        assert_eq!(json["error"]["type"], "goodput_proxy_error", "{what}");
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["status"], 502, "{what}: {r}");
        assert_eq!(r["outcome"], "upstream_error", "{what}: {r}");
        proxy.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_chunk_after_events_is_an_abort_after_them() {
    let events = openai_chat_events(3, false);
    let mut script = prefix_then_at_once(&events, 3, Step::Write(Bytes::from_static(b"zz\r\n")));
    script = script.then(Step::Close);
    let up = FakeUpstream::start(script).await;
    let proxy = start_proxy(&up.url()).await;
    let (head, body) = raw_reply(&proxy).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (data, terminated) = dechunk(&body);
    assert!(!terminated, "an abort, not a clean end");
    assert_eq!(data, concat(&events[..3]));
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["outcome"], "upstream_reset", "{r}");
    assert_eq!(r["bytes_out"], data.len(), "{r}");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 3: a client that goes away cancels the upstream request.

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_mid_stream_closes_the_upstream_connection() {
    let events = openai_chat_events(60, false);
    let up = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::from_millis(30),
    ))
    .await;
    let proxy = start_proxy(&up.url()).await;
    let (s, _) = raw_stream_events(proxy.proxy_addr, 3).await.unwrap();
    let dropped = Instant::now();
    drop(s);
    let closed = up.wait_client_close(Duration::from_secs(2)).await;
    assert!(closed.is_some(), "the upstream never saw the proxy hang up");
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "took {:?}",
        dropped.elapsed()
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    assert_eq!(r["status"], 200);
    let n = r["events"].as_u64().unwrap();
    assert!((2..60).contains(&n), "{r}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_of_a_hyper_client_closes_the_upstream_connection() {
    let events = openai_chat_events(60, false);
    let up = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::from_millis(30),
    ))
    .await;
    let proxy = start_proxy(&up.url()).await;
    let client = client();
    let mut resp = post(&client, &chat_url(&proxy), chat_body(true, 60, false)).await;
    read_events(resp.body_mut(), 3).await.unwrap();
    let dropped = Instant::now();
    drop(resp);
    drop(client);
    assert!(up.wait_client_close(Duration::from_secs(2)).await.is_some());
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "took {:?}",
        dropped.elapsed()
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_before_the_response_head_closes_the_upstream_connection() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    s.write_all(&raw_post(CHAT, &chat_body(true, 5, false)))
        .await
        .unwrap();
    assert_eq!(up.wait_requests(1, Duration::from_secs(2)).await.len(), 1);
    let dropped = Instant::now();
    drop(s);
    assert!(
        up.wait_client_close(Duration::from_secs(2)).await.is_some(),
        "the upstream request was not cancelled"
    );
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "took {:?}",
        dropped.elapsed()
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    assert_eq!(r["status"], Value::Null, "no head was ever sent: {r}");
    assert_eq!(r["ttft_ms"], Value::Null);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_before_the_first_token_of_an_http2_client_cancels_upstream() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let proxy = start_proxy(&up.url()).await;
    let client = h2_client();
    let url = chat_url(&proxy);
    let pending = tokio::spawn(async move { post(&client, &url, chat_body(true, 5, false)).await });
    assert_eq!(up.wait_requests(1, Duration::from_secs(2)).await.len(), 1);
    let dropped = Instant::now();
    // Aborting the task drops the request future and the only client: RST_STREAM, then the
    // connection goes.
    pending.abort();
    assert!(up.wait_client_close(Duration::from_secs(2)).await.is_some());
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "took {:?}",
        dropped.elapsed()
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_reaches_the_simulator_as_client_gone() {
    let (sim, upstream) = start_sim(fast_sim(0.0, 20.0)).await;
    let proxy = start_proxy(&upstream).await;
    let client = client();
    let mut resp = post(&client, &chat_url(&proxy), chat_body(true, 100, false)).await;
    read_events(resp.body_mut(), 3).await.unwrap();
    drop(resp);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(1);
    while sim.truth().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let truth = sim.truth();
    assert_eq!(
        truth.len(),
        1,
        "the simulator's request did not end within 1 s"
    );
    assert!(
        truth[0].client_gone && !truth[0].completed,
        "{:?}",
        truth[0]
    );
    assert!(truth[0].events < 100);
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 4, 5: no response head: 502 for a dead upstream, 504 for a silent one.

#[tokio::test(flavor = "multi_thread")]
async fn dead_upstream_is_a_502_with_a_json_error() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let proxy = start_proxy(&format!("http://{addr}")).await;
    let (status, body) =
        post_collect(&client(), &chat_url(&proxy), chat_body(true, 5, false)).await;
    assert_eq!(status, 502);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_unreachable", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "upstream_error", "{r}");
    assert_eq!(r["status"], 502);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_dying_before_the_head_is_a_502() {
    for last in [Step::Reset, Step::Close] {
        let up = FakeUpstream::start(Script::new(vec![last.clone()])).await;
        let proxy = start_proxy(&up.url()).await;
        let (status, body) =
            post_collect(&client(), &chat_url(&proxy), chat_body(true, 5, false)).await;
        assert_eq!(status, 502, "{last:?}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "upstream_failed", "{last:?}: {v}");
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["outcome"], "upstream_error", "{last:?}: {r}");
        assert_eq!(r["status"], 502);
        proxy.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_upstream_is_a_504_after_the_header_timeout() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.response_header_timeout = Duration::from_millis(200);
    let proxy = start_proxy_with(cfg).await;
    let sent = Instant::now();
    let resp = post(&client(), &chat_url(&proxy), chat_body(true, 5, false)).await;
    let took = sent.elapsed();
    assert_eq!(resp.status(), 504);
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(800),
        "the 504 came after {took:?}"
    );
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_header_timeout", "{v}");
    assert!(
        up.wait_client_close(Duration::from_secs(1)).await.is_some(),
        "the proxy must close the upstream connection it gave up on"
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "timeout", "{r}");
    assert_eq!(r["status"], 504);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 6: the idle timeout cuts a stalled stream, never a long healthy one.

#[tokio::test(flavor = "multi_thread")]
async fn stalled_stream_is_cut_by_the_idle_timeout() {
    let up = FakeUpstream::start(Script::stall_after_head()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.idle_timeout = Duration::from_millis(200);
    let proxy = start_proxy_with(cfg).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let sent = Instant::now();
    s.write_all(&raw_post(CHAT, &chat_body(true, 5, false)))
        .await
        .unwrap();
    let (raw, end) = read_to_end(&mut s, Duration::from_secs(3)).await;
    let took = sent.elapsed();
    assert_ne!(end, End::TimedOut);
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(1),
        "cut after {took:?}"
    );
    let (head, body) = head_and_body(&raw).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (data, terminated) = dechunk(body);
    assert_eq!(data, SSE_COMMENT);
    assert!(!terminated, "an idle-timed-out stream must be an abort");
    assert!(up.wait_client_close(Duration::from_secs(1)).await.is_some());
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "timeout", "{r}");
    assert_eq!(r["status"], 200);
    assert_eq!(r["events"], 0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn long_healthy_stream_outlives_every_timeout() {
    let events = openai_chat_events(10, true);
    let up = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::from_millis(100),
    ))
    .await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.idle_timeout = Duration::from_millis(250);
    cfg.upstream.response_header_timeout = Duration::from_millis(300);
    let proxy = start_proxy_with(cfg).await;
    let sent = Instant::now();
    let (status, body) =
        post_collect(&client(), &chat_url(&proxy), chat_body(true, 10, true)).await;
    let took = sent.elapsed();
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(1000),
        "the stream took only {took:?}"
    );
    assert_eq!(body.as_ref(), concat(&events).as_slice());
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["events"], 10);
    assert_eq!(r["output_tokens"], 10);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 7: hyper's header-read timeout is really wired.

/// Sends `bytes` to a proxy with a 300 ms header-read timeout and says how the proxy
/// ended the connection and after how long.
#[expect(clippy::unwrap_used, reason = "test body shared by three tests")]
async fn stalled_client_is_closed(bytes: &[u8]) -> (Vec<u8>, End, Duration) {
    let mut cfg = test_config("http://127.0.0.1:1");
    cfg.server.header_read_timeout = Duration::from_millis(300);
    let proxy = start_proxy_with(cfg).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let start = Instant::now();
    s.write_all(bytes).await.unwrap();
    let (raw, end) = read_to_end(&mut s, Duration::from_secs(2)).await;
    let took = start.elapsed();
    proxy.shutdown().await;
    (raw, end, took)
}

fn assert_closed_in_time(what: &str, raw: &[u8], end: &End, took: Duration) {
    assert_ne!(
        *end,
        End::TimedOut,
        "{what}: connection still open after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(250),
        "{what}: closed too early ({took:?})"
    );
    assert!(
        took < Duration::from_secs(1),
        "{what}: closed after {took:?}"
    );
    let text = String::from_utf8_lossy(raw);
    assert!(
        raw.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{what}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_request_head_is_closed_after_the_header_read_timeout() {
    let (raw, end, took) =
        stalled_client_is_closed(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-")
            .await;
    assert_closed_in_time("partial head", &raw, &end, took);
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_connection_is_closed_after_the_header_read_timeout() {
    let (raw, end, took) = stalled_client_is_closed(b"").await;
    assert_closed_in_time("no bytes at all", &raw, &end, took);
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_h2_preface_is_closed_after_the_header_read_timeout() {
    let (raw, end, took) = stalled_client_is_closed(b"PRI * HTTP/2.0\r\n").await;
    assert_closed_in_time("partial h2 preface", &raw, &end, took);
}

// ---------------------------------------------------------------------------------------
// 8: graceful drain, and the drain deadline.

/// Polls until connecting to `addr` is refused; false if it never is within `timeout`.
async fn refused_within(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(addr).await.is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_drains_in_flight_streams() {
    drains_a_stream(client(), http::Version::HTTP_11).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_drains_http2_streams_and_closes_their_connections() {
    // Over HTTP/2 (h2c) the connection goes through hyper-util's `auto` server, which must
    // hear the drain signal too, let the stream finish, then close: were it not told, the
    // client's idle connection would hold the drain up until its deadline.
    let h2c: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    drains_a_stream(h2c, http::Version::HTTP_2).await;
}

/// A stream in flight when shutdown begins: the proxy stops accepting and says so on
/// `/readyz`, the stream runs to its end, and the proxy stops right after (its client's
/// connection, now idle, closed by the proxy), the stream recorded as complete.
async fn drains_a_stream(client: HttpClient, version: http::Version) {
    // 30 events 60 ms apart: the checks made while draining have most of 1.8 s, however
    // busy the machine.
    let (sim, upstream) = start_sim(fast_sim(0.0, 60.0)).await;
    let proxy = start_proxy(&upstream).await;
    let recent = proxy.recent.clone();
    let (proxy_addr, admin) = (proxy.proxy_addr, proxy.admin_addr);
    assert_eq!(admin_get(admin, "/readyz").await.0, 200);
    let mut resp = post(&client, &chat_url(&proxy), chat_body(true, 30, true)).await;
    assert_eq!(resp.version(), version);
    let first = read_events(resp.body_mut(), 2).await;
    assert!(first.is_ok(), "{first:?}");
    let mut got = first.unwrap_or_default();

    proxy.begin_shutdown();
    assert!(
        refused_within(proxy_addr, Duration::from_secs(1)).await,
        "still accepting"
    );
    let (ready, _) = admin_get(admin, "/readyz").await;
    assert_eq!(ready, 503, "/readyz must say 503 while draining");
    assert!(
        sim.truth().is_empty(),
        "the stream should still be in flight"
    );

    let (rest, end) = read_body(resp.into_body()).await;
    assert!(end.is_ok(), "a drained stream ends cleanly: {end:?}");
    got.extend_from_slice(&rest);
    assert!(
        got.ends_with(b"data: [DONE]\n\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let stopped = Instant::now();
    let shut = tokio::time::timeout(Duration::from_secs(3), proxy.shutdown()).await;
    assert!(shut.is_ok(), "shutdown did not end within 3 s");
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "shutdown took {:?}",
        stopped.elapsed()
    );

    let recs = recent.latest(10);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].outcome, Outcome::Ok, "{:?}", recs[0]);
    assert_eq!(recs[0].output_tokens, Some(30));
    assert_eq!(recs[0].events, 30);
    assert!(sim.truth().first().is_some_and(|t| t.completed));
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_deadline_cuts_what_is_left() {
    let (_sim, upstream) = start_sim(fast_sim(0.0, 10.0)).await;
    let mut cfg: Config = test_config(&upstream);
    cfg.server.drain_timeout = Duration::from_millis(300);
    let proxy = start_proxy_with(cfg).await;
    let recent = proxy.recent.clone();
    let client = client();
    let mut resp = post(&client, &chat_url(&proxy), chat_body(true, 500, false)).await;
    read_events(resp.body_mut(), 2).await.unwrap();

    let began = Instant::now();
    proxy.begin_shutdown();
    let shutting = tokio::spawn(async move {
        proxy.shutdown().await;
        began.elapsed()
    });
    let (data, end) = read_body(resp.into_body()).await;
    let cut_after = began.elapsed();
    assert!(
        end.is_err(),
        "a cut stream must be an abort, not a clean end"
    );
    assert!(!data.ends_with(b"data: [DONE]\n\n"));
    assert!(
        cut_after >= Duration::from_millis(250) && cut_after < Duration::from_millis(1500),
        "cut after {cut_after:?}"
    );
    let stopped_after = tokio::time::timeout(Duration::from_secs(4), shutting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        stopped_after < Duration::from_millis(300) + Duration::from_secs(2),
        "shutdown took {stopped_after:?}"
    );
    let recs = recent.latest(10);
    assert_eq!(recs.len(), 1, "the cut stream is recorded");
    assert_eq!(recs[0].outcome, Outcome::ProxyError, "{:?}", recs[0]);
    assert!(recs[0].events > 0 && recs[0].events < 500);
}

// ---------------------------------------------------------------------------------------
// 9: measurement never blocks traffic.

#[tokio::test(flavor = "multi_thread")]
async fn a_full_measurement_queue_never_holds_traffic_back() {
    const N: usize = 200;
    let (_sim, upstream) = start_sim(fast_sim(1.0, 1.0)).await;
    let mut cfg = test_config(&upstream);
    cfg.measure.channel_capacity = 1;
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = chat_url(&proxy);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..N {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move { post_collect(&client, &url, chat_body(true, 5, true)).await });
    }
    let mut complete = 0;
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.unwrap();
        assert_eq!(status, 200);
        let text = String::from_utf8_lossy(&body);
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(text.matches("\"completion_tokens\":5").count(), 1, "{text}");
        complete += 1;
    }
    assert_eq!(complete, N);

    let deadline = Instant::now() + Duration::from_secs(3);
    let (recorded, dropped) = loop {
        let recorded = records(proxy.admin_addr).await.len();
        let text = metrics(proxy.admin_addr).await;
        let dropped = metric_value(&text, "goodput_measurement_dropped_total").unwrap_or(-1.0);
        if recorded as f64 + dropped >= N as f64 || Instant::now() >= deadline {
            assert_eq!(
                metric_value(&text, "goodput_in_flight_requests"),
                Some(0.0),
                "{text}"
            );
            break (recorded, dropped);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(dropped >= 0.0, "goodput_measurement_dropped_total missing");
    assert_eq!(
        recorded + dropped as usize,
        N,
        "recorded {recorded}, dropped {dropped}"
    );
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 10: the binary: exit code 64 with every problem listed, 0 on SIGTERM.

/// `text` as the file `name` in a directory of its own, returned with the file's path: the
/// directory goes when the test drops it.
#[expect(
    clippy::unwrap_used,
    reason = "a test that cannot write its config cannot run"
)]
fn temp_config(name: &str, text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new("config");
    let path = dir.write(name, text).unwrap();
    (dir, path)
}

const BAD_CONFIG: &str = r#"
[server]
listen = "not-an-address"
header_read_timeout = "0s"

[admin]
listen = "also-not-an-address"

[upstream]
url = "ftp://example"

[measure]
channel_capacity = 0

[log]
format = "xml"
"#;

const BAD_KEYS: [&str; 6] = [
    "server.listen",
    "admin.listen",
    "server.header_read_timeout",
    "upstream.url",
    "measure.channel_capacity",
    "log.format",
];

#[test]
fn bad_config_exits_64_and_lists_every_problem() {
    let (_dir, bad) = temp_config("bad.toml", BAD_CONFIG);
    let bin = env!("CARGO_BIN_EXE_goodput");
    let runs = [
        vec![
            "serve".to_owned(),
            "--config".to_owned(),
            bad.display().to_string(),
        ],
        vec!["check-config".to_owned(), bad.display().to_string()],
        vec![
            "serve".to_owned(),
            "--check-config".to_owned(),
            bad.display().to_string(),
        ],
    ];
    for args in runs {
        let out = Command::new(bin).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        for key in BAD_KEYS {
            assert!(
                stderr.contains(key),
                "{args:?}: `{key}` not listed in:\n{stderr}"
            );
        }
        assert!(stderr.contains("6 problem(s)"), "{args:?}: {stderr}");
    }
    let missing = Command::new(bin)
        .args(["serve", "--config", "/nonexistent/goodput.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
}

#[test]
fn good_config_checks_clean() {
    let (_dir, good) = temp_config("good.toml", "[upstream]\nurl = \"http://127.0.0.1:8000\"\n");
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["check-config", &good.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_stops_serve_with_exit_code_0() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["serve", "--upstream", "http://127.0.0.1:1"])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = Instant::now();
    let mut serving = false;
    while !serving && started.elapsed() < Duration::from_secs(10) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            serving = line.contains("goodput serving");
        }
    }
    if !serving {
        let _ = child.kill();
        panic!("goodput serve never said it was serving");
    }
    // The signal handlers are installed before the start-up line.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if signalled.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(status) = status else {
        let _ = child.kill();
        panic!("goodput serve did not exit within 5 s of SIGTERM");
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(
        rest.iter().any(|l| l.contains("goodput stopped")),
        "{rest:?}"
    );
}
