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
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Some(r) = records(admin).await.into_iter().find(|r| r["id"] == id) {
            return Some(r);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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

// ---------------------------------------------------------------------------------------
// 1. Byte-exact forwarding under adversarial upstream writes
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn sse_one_chunk_per_event_passes_exactly() {
    check_sse_passthrough(lf_events(), WritePlan::Whole).await;
}

#[tokio::test]
async fn sse_one_byte_writes_pass_exactly() {
    check_sse_passthrough(lf_events(), WritePlan::Bytes1).await;
}

#[tokio::test]
async fn sse_blank_line_split_across_writes_passes_exactly() {
    let events = lf_events();
    // Between the two `\n` of every event's blank line, and inside a `data:` field name.
    let offsets = event_ends(&events)
        .into_iter()
        .flat_map(|end| [end - 1, end + 3])
        .collect();
    check_sse_passthrough(events, WritePlan::SplitAt(offsets)).await;
}

#[tokio::test]
async fn sse_several_events_per_write_pass_exactly() {
    check_sse_passthrough(lf_events(), WritePlan::Coalesced(3)).await;
    // Everything, role to [DONE], in a single chunk.
    check_sse_passthrough(lf_events(), WritePlan::Coalesced(100)).await;
}

#[tokio::test]
async fn crlf_events_split_inside_crlf_pass_exactly() {
    let events = crlf_events();
    // Each event ends `\r\n\r\n`: cut between `\r` and `\n` of the first CRLF, between the
    // two CRLFs, and between `\r` and `\n` of the second, each on different events.
    let offsets = event_ends(&events)
        .into_iter()
        .enumerate()
        .map(|(i, end)| end - 1 - (i % 3))
        .collect();
    check_sse_passthrough(events, WritePlan::SplitAt(offsets)).await;
}

#[tokio::test]
async fn crlf_events_one_byte_writes_pass_exactly() {
    check_sse_passthrough(crlf_events(), WritePlan::Bytes1).await;
}

#[tokio::test]
async fn cr_events_split_between_their_two_crs_pass_exactly() {
    let events = cr_events();
    // A CR at the end of a chunk may be the first half of a CRLF: the framer must not wait
    // for (or swallow) the next chunk's CR that ends the event.
    let offsets = event_ends(&events).into_iter().map(|end| end - 1).collect();
    check_sse_passthrough(events, WritePlan::SplitAt(offsets)).await;
    check_sse_passthrough(cr_events(), WritePlan::Bytes1).await;
}

#[tokio::test]
async fn non_stream_content_length_json_passes_exactly() {
    let body = br#"{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"h\u00e9llo \"world\"\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}"#;
    // The head, then the body dribbled in three writes with pauses between them.
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let script = Script::new(vec![
        Step::Write(Bytes::from(head)),
        Step::Write(Bytes::copy_from_slice(&body[..1])),
        Step::Sleep(Duration::from_millis(10)),
        Step::Write(Bytes::copy_from_slice(&body[1..100])),
        Step::Sleep(Duration::from_millis(10)),
        Step::Write(Bytes::copy_from_slice(&body[100..])),
    ]);
    let fake = FakeUpstream::start(script).await;
    let proxy = start_proxy(&fake.url()).await;
    let request = chat_body(false, 3, false);

    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "json-hyper",
        request.clone(),
    )
    .await;
    let (status, headers, got) = collect(resp).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(got.as_ref(), body.as_slice());

    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "json-raw")],
        request.as_bytes(),
    );
    let (out, errored) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    assert!(!errored);
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(
        head_value(&head, "content-length"),
        Some(body.len().to_string()),
        "a Content-Length body keeps its length: {head}"
    );
    assert_eq!(rest, body.as_slice());

    for id in ["json-hyper", "json-raw"] {
        let r = record(proxy.admin_addr, id).await.unwrap();
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["stream"], false);
        assert_eq!(r["output_tokens"], 3);
        assert_eq!(r["output_tokens_source"], "usage");
        assert_eq!(r["input_tokens"], 11);
        assert_eq!(r["bytes_out"], body.len());
        assert!(r["ttft_ms"].is_null() && r["tpot_ms"].is_null(), "{r}");
        // The body arrived over >= 20 ms: e2e runs to its last byte, not to the head.
        assert!(num(&r, "e2e_ms").unwrap() >= 19.0, "{r}");
    }
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 2. TTFT ends at the first content-bearing event
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_skips_the_role_only_chunk() {
    let events = openai_chat_events(3, true); // role, tok0, tok1, tok2, usage, [DONE]
    let chunk = |i: usize| Step::Write(http_chunk(&events[i]));
    let ms = |n| Step::Sleep(Duration::from_millis(n));
    let script = Script::new(vec![
        Step::Write(Bytes::from_static(SSE_HEAD)),
        chunk(0),
        ms(150),
        chunk(1),
        ms(40),
        chunk(2),
        ms(40),
        chunk(3),
        chunk(4),
        chunk(5),
        Step::Write(Bytes::from_static(LAST_CHUNK)),
    ]);
    let fake = FakeUpstream::start(script).await;
    let proxy = start_proxy(&fake.url()).await;

    let sent = Instant::now();
    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "role-first",
        chat_body(true, 3, true),
    )
    .await;
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let first_at = sent.elapsed();
    assert!(
        first.starts_with(b"data: ") && first.windows(6).any(|w| w == b"\"role\""),
        "first bytes to arrive are the role chunk"
    );
    assert!(
        first_at < Duration::from_millis(120),
        "the role chunk was held back ({first_at:?}): forwarding must not wait for content"
    );
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!([first, rest].concat(), events.concat());

    let r = record(proxy.admin_addr, "role-first").await.unwrap();
    let ttft = num(&r, "ttft_ms").unwrap();
    assert!(
        (150.0..185.0).contains(&ttft),
        "ttft {ttft} ms: must end at the first content chunk (150 ms), not the role chunk"
    );
    // Content at +150, +190, +230: tpot = 80 ms / (3 - 1).
    let tpot = num(&r, "tpot_ms").unwrap();
    assert!((38.0..48.0).contains(&tpot), "tpot {tpot}: {r}");
    let itl = &r["itl_ms"];
    assert!((38.0..50.0).contains(&itl["p50"].as_f64().unwrap()), "{r}");
    assert!((38.0..60.0).contains(&itl["max"].as_f64().unwrap()), "{r}");
    assert!(num(&r, "e2e_ms").unwrap() >= 229.0, "{r}");
    assert_eq!(r["events"], 3);
    assert_eq!(r["outcome"], "ok");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_comments_and_empty_deltas_are_not_tokens() {
    let content = openai_chat_events(2, false); // role, tok0, tok1, [DONE]
    let empty_delta = br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":null}]}

"#;
    let ms = |n| Step::Sleep(Duration::from_millis(n));
    let write = |b: &[u8]| Step::Write(http_chunk(b));
    let script = Script::new(vec![
        Step::Write(Bytes::from_static(SSE_HEAD)),
        write(b": keep-alive\n\n"),
        ms(40),
        write(b":\r\n\r\n"),
        ms(40),
        write(&content[0]),
        ms(40),
        write(empty_delta),
        ms(40),
        write(&content[1]),
        ms(30),
        write(&content[2]),
        write(&content[3]),
        Step::Write(Bytes::from_static(LAST_CHUNK)),
    ]);
    let fake = FakeUpstream::start(script).await;
    // The events fallback is the subject: no estimate from the embedded tokenizer.
    let mut cfg = test_config(&fake.url());
    cfg.tokenizer.estimate = false;
    let proxy = start_proxy_with(cfg).await;
    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "keepalive",
        chat_body(true, 2, false),
    )
    .await;
    let (status, _, _) = collect(resp).await;
    assert_eq!(status, 200);

    let r = record(proxy.admin_addr, "keepalive").await.unwrap();
    let ttft = num(&r, "ttft_ms").unwrap();
    assert!(
        (160.0..195.0).contains(&ttft),
        "ttft {ttft}: comments, role and empty delta before the first token are not tokens"
    );
    assert_eq!(r["events"], 2, "{r}");
    assert_eq!(r["output_tokens"], 2);
    assert_eq!(r["output_tokens_source"], "events");
    let tpot = num(&r, "tpot_ms").unwrap();
    assert!((28.0..40.0).contains(&tpot), "tpot {tpot}: {r}");
    assert_eq!(r["outcome"], "ok");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 3-5. Token counts and TPOT against the simulator's ground truth
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpot_with_multi_token_events_and_usage_matches_sim_truth() {
    let mut cfg = fast_sim(40.0, 25.0);
    cfg.tokens_per_event = 4;
    let (sim, upstream) = start_sim(cfg).await;
    let proxy = start_proxy(&upstream).await;
    let chat = url(&proxy, "/v1/chat/completions");
    // Warm the pooled upstream connection, as in steady production traffic.
    let (status, _, _) = collect(send_json(&chat, "warm-up", chat_body(true, 1, true)).await).await;
    assert_eq!(status, 200);

    let sent = Instant::now();
    let resp = send_json(&chat, "tpot", chat_body(true, 10, true)).await;
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    let mut client_first = None;
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap_or_default();
        seen.extend_from_slice(&data);
        if client_first.is_none() && seen.windows(20).any(|w| w == br#""delta":{"content":""#) {
            client_first = Some(sent.elapsed());
        }
    }
    let client_first = client_first.unwrap();
    assert!(seen.ends_with(b"data: [DONE]\n\n"));

    let truth = sim
        .truth()
        .into_iter()
        .find(|t| t.request_id.as_deref() == Some("tpot"))
        .unwrap();
    assert!(truth.completed);
    assert_eq!((truth.completion_tokens, truth.events), (10, 3));
    let r = record(proxy.admin_addr, "tpot").await.unwrap();
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["output_tokens"], 10, "from usage, not the 3 events");
    assert_eq!(r["output_tokens_source"], "usage");
    assert_eq!(r["input_tokens"], truth.prompt_tokens);
    assert_eq!(r["input_tokens_source"], "usage");
    assert_eq!(r["events"], 3, "ceil(10 / 4) content events");

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // First to last token, as the sim sent them (~50 ms: two 25 ms gaps; the sim's own
    // scheduling may shift it a little, which is why the proxy is compared with the truth
    // and not with the configuration) and as the proxy saw them (tpot × (output_tokens − 1)).
    // Dividing by the 2 event gaps instead of the 9 token gaps would be off by 4.5×.
    let truth_span = ms(truth.last_token_at.unwrap() - truth.first_token_at.unwrap());
    assert!((40.0..75.0).contains(&truth_span), "sim span {truth_span}");
    let tpot = num(&r, "tpot_ms").unwrap();
    assert!(
        (tpot * 9.0 - truth_span).abs() <= 2.0,
        "tpot {tpot} ms × 9 vs the sim's first-to-last {truth_span} ms"
    );
    assert!((tpot - truth_span / 9.0).abs() <= 2.0 / 9.0);

    // TTFT: the proxy's clock starts before the sim got the request and stops after the
    // sim sent the first token, so it is at least the sim's own TTFT and at most what the
    // client observed; on loopback within 2 ms of the sim's.
    let truth_ttft = ms(truth.first_token_at.unwrap() - truth.received_at);
    assert!((39.0..65.0).contains(&truth_ttft), "sim ttft {truth_ttft}");
    let ttft = num(&r, "ttft_ms").unwrap();
    assert!(
        ttft >= truth_ttft && ttft - truth_ttft <= 2.0,
        "ttft {ttft} ms vs sim truth {truth_ttft} ms"
    );
    assert!(
        ttft <= ms(client_first) + 0.01,
        "ttft {ttft} ms is later than the client saw the token ({client_first:?})"
    );
    // Two ~25 ms gaps between the three events: the smaller is p50, the larger max, and
    // together they span the sim's first to last token.
    let itl = &r["itl_ms"];
    let (p50, max) = (itl["p50"].as_f64().unwrap(), itl["max"].as_f64().unwrap());
    assert!(p50 >= 15.0 && p50 <= max, "{r}");
    assert!(
        (p50 + max - truth_span).abs() <= 2.0,
        "{r} vs span {truth_span}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_usage_output_tokens_are_counted_from_events() {
    let (sim, upstream) = start_sim(fast_sim(5.0, 2.0)).await;
    // The events fallback is the subject: no estimate from the embedded tokenizer.
    let mut cfg = test_config(&upstream);
    cfg.tokenizer.estimate = false;
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, body) =
        collect(send_json(&chat, "events", chat_body(true, 6, false)).await).await;
    assert_eq!(status, 200);
    assert!(
        !body.windows(8).any(|w| w == b"\"usage\""),
        "no usage asked, none sent"
    );

    let truth = sim.truth();
    let truth = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("events"))
        .unwrap();
    assert_eq!(truth.events, 6);
    let r = record(proxy.admin_addr, "events").await.unwrap();
    assert_eq!(r["output_tokens"], 6, "{r}");
    assert_eq!(r["output_tokens_source"], "events");
    assert_eq!(r["events"], 6);
    assert!(r["input_tokens"].is_null(), "{r}");
    assert!(r["input_tokens_source"].is_null(), "{r}");
    assert_eq!(r["outcome"], "ok");
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_usage_multi_token_events_count_events_not_tokens() {
    let mut cfg = fast_sim(5.0, 2.0);
    cfg.tokens_per_event = 3;
    let (sim, upstream) = start_sim(cfg).await;
    // The events fallback is the subject: no estimate from the embedded tokenizer.
    let mut cfg = test_config(&upstream);
    cfg.tokenizer.estimate = false;
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, _) =
        collect(send_json(&chat, "events3", chat_body(true, 7, false)).await).await;
    assert_eq!(status, 200);
    let truth = sim.truth();
    let truth = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("events3"))
        .unwrap();
    assert_eq!((truth.completion_tokens, truth.events), (7, 3));
    let r = record(proxy.admin_addr, "events3").await.unwrap();
    assert_eq!(r["output_tokens"], 3, "the events are all it can know: {r}");
    assert_eq!(r["output_tokens_source"], "events");
    assert_eq!(r["events"], 3);
    proxy.shutdown().await;
}

#[tokio::test]
async fn non_streaming_usage_comes_from_the_json_body() {
    let (sim, upstream) = start_sim(fast_sim(10.0, 2.0)).await;
    let proxy = start_proxy(&upstream).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, headers, body) =
        collect(send_json(&chat, "non-stream", chat_body(false, 6, false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let parsed: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(parsed["usage"]["completion_tokens"], 6);

    let truth = sim.truth();
    let truth = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("non-stream"))
        .unwrap();
    let r = record(proxy.admin_addr, "non-stream").await.unwrap();
    assert_eq!(r["stream"], false);
    assert_eq!(r["status"], 200);
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["output_tokens"], truth.completion_tokens, "{r}");
    assert_eq!(r["output_tokens_source"], "usage");
    assert_eq!(r["input_tokens"], truth.prompt_tokens);
    assert_eq!(r["input_tokens_source"], "usage");
    assert!(r["ttft_ms"].is_null(), "no TTFT without a stream: {r}");
    assert!(r["tpot_ms"].is_null(), "{r}");
    assert!(r["itl_ms"].is_null(), "{r}");
    assert_eq!(r["events"], 0);
    assert_eq!(r["bytes_out"], body.len());
    // The sim answers after ttft + 5 gaps = 20 ms.
    assert!(num(&r, "e2e_ms").unwrap() >= 19.0, "{r}");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 6. Upstream errors pass through
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn upstream_500_passes_through_exactly() {
    let body = br#"{"error":{"message":"model overloaded","type":"server_error","param":null,"code":null}}"#;
    let fake = FakeUpstream::start(Script::response(
        500,
        &[("content-type", "application/json")],
        body,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, got) = collect(send_json(&chat, "e500", chat_body(true, 5, true)).await).await;
    assert_eq!(status, 500);
    assert_eq!(got.as_ref(), body.as_slice());

    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "e500-raw")],
        chat_body(true, 5, true).as_bytes(),
    );
    let (out, _) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 500 "), "{head}");
    assert_eq!(rest, body.as_slice());

    for id in ["e500", "e500-raw"] {
        let r = record(proxy.admin_addr, id).await.unwrap();
        assert_eq!(r["outcome"], "upstream_error", "{r}");
        assert_eq!(r["status"], 500);
        assert!(r["ttft_ms"].is_null());
        assert_eq!(r["bytes_out"], body.len());
    }
    let text = metrics(proxy.admin_addr).await;
    let series = r#"goodput_requests_total{model="test-model",api="chat_completions",outcome="upstream_error",class="default",slo="missed",status_class="5xx"}"#;
    assert_eq!(metric_value(&text, series), Some(2.0), "{text}");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 7. The request side: body, headers, request id
// ---------------------------------------------------------------------------------------

fn ok_json_script() -> Script {
    Script::response(
        200,
        &[("content-type", "application/json")],
        br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#,
    )
}

#[tokio::test]
async fn request_body_arrives_upstream_byte_identical() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    // Odd whitespace, escapes, raw UTF-8 and a large prompt (several frames).
    let prompt = "ünïcödé \\u00e9 \\\"q\\\" ".repeat(20_000);
    let body = format!(
        "  {{\"model\" : \"test-model\",\n\t\"messages\":[{{\"role\":\"user\",\"content\":\"{prompt}\"}}],\"stream\":false}}\r\n"
    );
    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "req-body",
        body.clone(),
    )
    .await;
    let (status, _, _) = collect(resp).await;
    assert_eq!(status, 200);
    let received = fake.wait_requests(1, T).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body.len(), body.len());
    assert!(received[0].body == body.as_bytes(), "request body changed");
    assert_eq!(received[0].method, "POST");
    assert_eq!(received[0].target, "/v1/chat/completions");
    assert_eq!(
        received[0].header("content-length"),
        Some(body.len().to_string().as_str()),
        "a Content-Length request keeps its length"
    );
    let r = record(proxy.admin_addr, "req-body").await.unwrap();
    assert_eq!(r["model"], "test-model", "inspected while forwarded: {r}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn chunked_request_body_arrives_upstream_byte_identical() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let body = chat_body(false, 1, false);
    let bytes = body.as_bytes();
    let mut raw = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: test\r\n\
        content-type: application/json\r\ntransfer-encoding: chunked\r\n\
        x-request-id: chunked-req\r\nconnection: close\r\n\r\n"
        .to_vec();
    for piece in [&bytes[..1], &bytes[1..20], &bytes[20..]] {
        raw.extend_from_slice(&http_chunk(piece));
    }
    raw.extend_from_slice(LAST_CHUNK);
    let (out, _) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, _) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");

    let received = fake.wait_requests(1, T).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body_text(), body);
    assert_eq!(received[0].target, "/v1/chat/completions?x=1");
    let r = record(proxy.admin_addr, "chunked-req").await.unwrap();
    assert_eq!(r["model"], "test-model", "{r}");
    assert_eq!(r["stream"], false);
    proxy.shutdown().await;
}

#[tokio::test]
async fn hop_by_hop_request_headers_are_not_forwarded() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let body = chat_body(false, 1, false);
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\n\
         host: client-facing.example\r\n\
         content-type: application/json\r\n\
         content-length: {}\r\n\
         connection: close, x-custom-hop\r\n\
         x-custom-hop: secret-hop\r\n\
         keep-alive: timeout=5\r\n\
         te: gzip\r\n\
         proxy-authorization: Basic c2VjcmV0\r\n\
         authorization: Bearer end-to-end\r\n\
         x-end-to-end: kept\r\n\
         x-request-id: hop\r\n\
         \r\n{body}",
        body.len()
    );
    let (out, _) = raw_exchange(proxy.proxy_addr, raw.as_bytes(), T).await;
    let (head, _) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");

    let received = fake.wait_requests(1, T).await;
    let req = &received[0];
    for gone in ["x-custom-hop", "keep-alive", "te", "proxy-authorization"] {
        assert_eq!(
            req.header(gone),
            None,
            "{gone} was forwarded: {:?}",
            req.headers
        );
    }
    for value in req.header_all("connection") {
        assert!(!value.contains("x-custom-hop"), "{value}");
    }
    assert_eq!(req.header("authorization"), Some("Bearer end-to-end"));
    assert_eq!(req.header("x-end-to-end"), Some("kept"));
    assert_eq!(req.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(req.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        req.header("x-forwarded-host"),
        Some("client-facing.example")
    );
    assert_eq!(req.header_all("host"), [fake.addr().to_string().as_str()]);
    assert_eq!(req.header("x-request-id"), Some("hop"));
    assert!(req.body == body.as_bytes());
    proxy.shutdown().await;
}

#[tokio::test]
async fn hop_by_hop_response_headers_are_not_passed_to_the_client() {
    let body = br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    let fake = FakeUpstream::start(Script::response(
        200,
        &[
            ("content-type", "application/json"),
            ("connection", "x-resp-hop"),
            ("x-resp-hop", "secret"),
            ("keep-alive", "timeout=5, max=100"),
            ("proxy-authenticate", "Basic realm=\"x\""),
            ("x-kept", "yes"),
        ],
        body,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "resp-hop")],
        chat_body(false, 1, false).as_bytes(),
    );
    let (out, _) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let names = head_names(&head);
    for gone in ["x-resp-hop", "keep-alive", "proxy-authenticate"] {
        assert!(!names.iter().any(|n| n == gone), "{gone} passed: {head}");
    }
    if let Some(connection) = head_value(&head, "connection") {
        assert!(!connection.contains("x-resp-hop"), "{head}");
    }
    assert_eq!(head_value(&head, "x-kept").as_deref(), Some("yes"));
    assert_eq!(rest, body.as_slice());

    // The same through hyper.
    let resp = send_json(&url(&proxy, "/v1/chat/completions"), "resp-hop-2", "{}").await;
    let (_, headers, _) = collect(resp).await;
    assert!(headers.get("x-resp-hop").is_none() && headers.get("keep-alive").is_none());
    assert_eq!(headers["x-kept"], "yes");
    proxy.shutdown().await;
}

#[tokio::test]
async fn incoming_request_id_is_forwarded_and_is_the_record_id() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, _) =
        collect(send_json(&chat, "client-id-42", chat_body(false, 1, false)).await).await;
    assert_eq!(status, 200);
    let received = fake.wait_requests(1, T).await;
    assert_eq!(received[0].header_all("x-request-id"), ["client-id-42"]);
    let r = record(proxy.admin_addr, "client-id-42").await;
    assert!(r.is_some(), "no record with the client's id");
    proxy.shutdown().await;
}

#[tokio::test]
async fn missing_request_id_is_generated_forwarded_and_recorded() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    for _ in 0..2 {
        let resp = send(
            &chat,
            &[("content-type", "application/json")],
            chat_body(false, 1, false),
        )
        .await;
        assert_eq!(collect(resp).await.0, 200);
    }
    let received = fake.wait_requests(2, T).await;
    let sent: Vec<String> = received
        .iter()
        .map(|r| {
            let ids = r.header_all("x-request-id");
            assert_eq!(ids.len(), 1, "{:?}", r.headers);
            ids[0].to_owned()
        })
        .collect();
    assert!(!sent[0].is_empty());
    assert_ne!(sent[0], sent[1], "generated ids must differ");
    let recs = wait_records(proxy.admin_addr, 2, T).await;
    let recorded: BTreeSet<&str> = recs.iter().filter_map(|r| r["id"].as_str()).collect();
    let forwarded: BTreeSet<&str> = sent.iter().map(String::as_str).collect();
    assert_eq!(recorded, forwarded);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 8. Bodies over the inspection limit
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn request_over_the_inspection_limit_passes_untouched_and_is_not_inspected() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let mut cfg = test_config(&fake.url());
    cfg.measure.request_inspect_limit = 256;
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");

    let big = format!(
        r#"{{"model":"test-model","stream":false,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(64 * 1024)
    );
    let (status, _, _) = collect(send_json(&chat, "big", big.clone()).await).await;
    assert_eq!(status, 200);
    // Control: the same proxy inspects a body under the limit.
    let small = chat_body(false, 1, false);
    assert!(small.len() < 256);
    let (status, _, _) = collect(send_json(&chat, "small", small).await).await;
    assert_eq!(status, 200);

    let received = fake.wait_requests(2, T).await;
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].body.len(), big.len());
    assert!(
        received[0].body == big.as_bytes(),
        "big body changed on its way"
    );
    let r = record(proxy.admin_addr, "big").await.unwrap();
    assert!(r["model"].is_null(), "over the limit, not inspected: {r}");
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["status"], 200);
    let r = record(proxy.admin_addr, "small").await.unwrap();
    assert_eq!(r["model"], "test-model", "{r}");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 9. Unknown paths and content types
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn unknown_path_passes_bytes_and_records_e2e_and_bytes_only() {
    let body = b"line one\nline two: data: [DONE]\n\n\x00\xff binary tail".repeat(50);
    let fake = FakeUpstream::start(Script::response(
        200,
        &[("content-type", "text/plain")],
        &body,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let raw = raw_post_with("/v2/whatever", &[("x-request-id", "unknown")], b"hello");
    let (out, errored) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    assert!(!errored);
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(
        head_value(&head, "content-type").as_deref(),
        Some("text/plain")
    );
    assert!(rest == body.as_slice(), "unknown-path body changed");
    let received = fake.wait_requests(1, T).await;
    assert_eq!(received[0].target, "/v2/whatever");
    assert_eq!(received[0].body, b"hello");

    let r = record(proxy.admin_addr, "unknown").await.unwrap();
    assert_eq!(r["api"], "unknown", "{r}");
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["status"], 200);
    assert_eq!(r["bytes_out"], body.len());
    assert!(r["ttft_ms"].is_null() && r["tpot_ms"].is_null(), "{r}");
    assert!(
        r["output_tokens"].is_null() && r["input_tokens"].is_null(),
        "{r}"
    );
    assert_eq!(r["events"], 0);
    assert!(num(&r, "e2e_ms").unwrap() > 0.0);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 10. Metrics and the records API, read as a user would
// ---------------------------------------------------------------------------------------

/// The contract field set of a record (issue 2, "Admin server"), then the fields later
/// capabilities added (TTFO from the dialects; the SLO verdict; the finish reason; whether
/// the terminal event was delivered).
const RECORD_FIELDS: [&str; 25] = [
    "id",
    "clock",
    "started_at",
    "model",
    "api",
    "stream",
    "status",
    "outcome",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "itl_ms",
    "input_tokens",
    "input_tokens_source",
    "cached_input_tokens",
    "output_tokens",
    "output_tokens_source",
    "events",
    "bytes_out",
    "terminal_event",
    "ttfo_ms",
    "slo_class",
    "slo_met",
    "slo_miss_reason",
    "finish_reason",
];

#[tokio::test]
async fn metrics_and_records_api_agree_with_the_traffic() {
    let (sim, upstream) = start_sim(fast_sim(5.0, 2.0)).await;
    let proxy = start_proxy(&upstream).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let before = SystemTime::now();
    for i in 0..3 {
        let id = format!("m{i}");
        let (status, _, _) = collect(send_json(&chat, &id, chat_body(true, 4, true)).await).await;
        assert_eq!(status, 200);
    }
    let recs = wait_records(proxy.admin_addr, 3, T).await;
    assert_eq!(recs.len(), 3);

    let (status, content_type, text) = admin_get_typed(proxy.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
    let value = |series: &str| metric_value(&text, series);
    let labels = r#"{model="test-model",api="chat_completions",class="default"}"#;
    assert_eq!(
        value(
            r#"goodput_requests_total{model="test-model",api="chat_completions",outcome="ok",class="default",slo="met",status_class="2xx"}"#
        ),
        Some(3.0),
        "{text}"
    );
    for family in [
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "gen_ai_server_request_duration_seconds",
    ] {
        assert_eq!(
            value(&format!("{family}_count{labels}")),
            Some(3.0),
            "{family}"
        );
    }
    // 4 single-token events per stream: 3 gaps each.
    assert_eq!(
        value(&format!(
            "goodput_inter_token_latency_seconds_count{labels}"
        )),
        Some(9.0)
    );
    let ttft_sum = value(&format!(
        "gen_ai_server_time_to_first_token_seconds_sum{labels}"
    ))
    .unwrap();
    let recorded_ttft: f64 = recs.iter().filter_map(|r| num(r, "ttft_ms")).sum();
    assert!(
        (ttft_sum * 1000.0 - recorded_ttft).abs() < 0.1,
        "{ttft_sum} vs {recorded_ttft}"
    );
    assert!(
        ttft_sum >= 3.0 * 0.005,
        "three TTFTs of at least 5 ms: {ttft_sum}"
    );

    let tokens = |kind: &str, what: &str| {
        value(&format!(
            r#"gen_ai_client_token_usage_{what}{{model="test-model",api="chat_completions",class="default",gen_ai_token_type="{kind}"}}"#
        ))
    };
    let prompt_total: u64 = sim.truth().iter().map(|t| t.prompt_tokens).sum();
    assert_eq!(tokens("input", "count"), Some(3.0), "{text}");
    assert_eq!(tokens("input", "sum"), Some(prompt_total as f64));
    assert_eq!(tokens("output", "count"), Some(3.0));
    assert_eq!(tokens("output", "sum"), Some(12.0));
    assert!(text.contains("# TYPE goodput_in_flight_requests gauge"));
    assert_eq!(value("goodput_in_flight_requests"), Some(0.0));
    assert_eq!(value("goodput_measurement_dropped_total"), Some(0.0));

    let (status, content_type, body) =
        admin_get_typed(proxy.admin_addr, "/api/v1/requests?limit=1").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let v: Value = serde_json::from_str(&body).unwrap();
    let list = v["requests"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    let r = &list[0];
    assert_eq!(r["id"], "m2", "newest last");
    let keys: BTreeSet<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, RECORD_FIELDS.into_iter().collect::<BTreeSet<_>>());
    assert!(
        ["kernel", "user"].contains(&r["clock"].as_str().unwrap()),
        "{r}"
    );
    let itl_keys: BTreeSet<&str> = r["itl_ms"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(itl_keys, BTreeSet::from(["p50", "p95", "max"]));
    let started = humantime::parse_rfc3339(r["started_at"].as_str().unwrap()).unwrap();
    let skew = Duration::from_secs(1);
    assert!(
        started + skew >= before && started <= SystemTime::now(),
        "started_at {} is not this request's arrival",
        r["started_at"]
    );
    assert_eq!(r["output_tokens"], 4);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 11. Outcomes of streams that end wrongly
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn clean_http_end_without_done_is_an_upstream_reset() {
    let mut events = openai_chat_events(3, true);
    events.pop(); // no `data: [DONE]`
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, body) =
        collect(send_json(&chat, "no-done", chat_body(true, 3, true)).await).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_ref(), events.concat().as_slice());
    let r = record(proxy.admin_addr, "no-done").await.unwrap();
    assert_eq!(r["outcome"], "upstream_reset", "{r}");
    assert_eq!(r["events"], 3);
    proxy.shutdown().await;
}

#[tokio::test]
async fn error_event_mid_stream_is_an_upstream_error() {
    let mut events = openai_chat_events(2, false); // role, tok0, tok1, [DONE]
    events.insert(
        2,
        br#"data: {"error":{"message":"engine died","type":"server_error","code":500}}

"#
        .to_vec(),
    );
    events.remove(3); // tok1 never comes
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, body) =
        collect(send_json(&chat, "err-event", chat_body(true, 2, false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_ref(), events.concat().as_slice());
    let r = record(proxy.admin_addr, "err-event").await.unwrap();
    assert_eq!(r["outcome"], "upstream_error", "{r}");
    assert_eq!(r["status"], 200);
    assert_eq!(r["events"], 1);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 12. Upstream connections: kept alive and reused, never a closed or stale one
// ---------------------------------------------------------------------------------------

/// The fake's scripts for a chunked stream, a JSON body, a 204 and a stream again.
fn mixed_bodies(events: &[Vec<u8>]) -> Vec<Script> {
    let json = Script::response(
        200,
        &[("content-type", "application/json")],
        b"{\"ok\":true}",
    );
    let stream = Script::sse_chunked(events, WritePlan::Whole, Duration::ZERO);
    let empty = Script::response(204, &[], b"");
    vec![stream.clone(), json, empty, stream]
}

#[tokio::test]
async fn one_upstream_connection_carries_sequential_requests_of_every_body_kind() {
    let events = openai_chat_events(3, false);
    let fake = FakeUpstream::start_sequence(mixed_bodies(&events)).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let mut statuses = Vec::new();
    for i in 0..4 {
        let id = format!("reuse-{i}");
        let (status, _, body) =
            collect(send_json(&chat, &id, chat_body(true, 3, false)).await).await;
        if i == 0 || i == 3 {
            assert_eq!(body.as_ref(), events.concat().as_slice(), "request {i}");
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 204, 200]);
    assert_eq!(
        fake.connections(),
        1,
        "every request should reuse the first connection"
    );
    let received = fake.requests().await;
    assert_eq!(received.len(), 4);
    for r in &received {
        assert_eq!(r.target, "/v1/chat/completions", "origin-form target");
        assert_eq!(r.header("host"), Some(fake.addr().to_string().as_str()));
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn streams_on_a_reused_upstream_connection_are_timed_by_their_own_reads() {
    // Frames are stamped with the time of the upstream read that brought them, kept per
    // connection: the second stream must not inherit the first one's times.
    let events = openai_chat_events(3, false);
    let gap = Duration::from_millis(50);
    let stream = Script::sse_chunked(&events, WritePlan::Whole, gap);
    let fake = FakeUpstream::start_sequence(vec![stream.clone(), stream]).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    for i in 0..2 {
        let id = format!("reads-{i}");
        let (status, _, body) =
            collect(send_json(&chat, &id, chat_body(true, 3, false)).await).await;
        assert_eq!(status, 200);
        assert_eq!(body.as_ref(), events.concat().as_slice(), "request {i}");
    }
    assert_eq!(
        fake.connections(),
        1,
        "the second stream reuses the connection"
    );
    for i in 0..2 {
        let r = record(proxy.admin_addr, &format!("reads-{i}"))
            .await
            .unwrap();
        // The role chunk after one gap, the first content chunk after two.
        let ttft = num(&r, "ttft_ms").unwrap();
        assert!(
            (99.0..160.0).contains(&ttft),
            "request {i}: ttft {ttft}: {r}"
        );
        let itl = r["itl_ms"]["p50"].as_f64().unwrap();
        assert!(
            (45.0..80.0).contains(&itl),
            "request {i}: inter-event {itl}: {r}"
        );
        assert!(num(&r, "e2e_ms").unwrap() >= ttft + 2.0 * 49.0, "{r}");
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn closed_or_closing_upstream_connections_are_not_reused() {
    // The upstream closes after its first answer, and says so in the second.
    let body = b"{\"ok\":true}";
    let closes = Script::response(200, &[], body).then(Step::Close);
    let says_close = Script::response(200, &[("connection", "close")], body);
    let fine = Script::response(200, &[], body);
    let fake = FakeUpstream::start_sequence(vec![closes, says_close, fine]).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    for i in 0..4 {
        if i == 1 {
            // Time for the FIN to arrive; the request must not be sent into it.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let id = format!("closed-{i}");
        let (status, _, got) =
            collect(send_json(&chat, &id, chat_body(false, 3, false)).await).await;
        assert_eq!(
            (status, got.as_ref()),
            (200, body.as_slice()),
            "request {i}"
        );
    }
    // One connection closed by the upstream, one by `connection: close`, the third reused.
    assert_eq!(fake.connections(), 3);
    proxy.shutdown().await;
}

#[tokio::test]
async fn idle_upstream_connections_expire_after_the_pool_idle_timeout() {
    let fake = FakeUpstream::start(Script::response(200, &[], b"{}")).await;
    let mut cfg = test_config(&fake.url());
    cfg.upstream.pool_idle_timeout = Duration::from_millis(150);
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");
    for (i, pause) in [0, 20, 400].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let id = format!("expire-{i}");
        let (status, _, _) = collect(send_json(&chat, &id, chat_body(false, 3, false)).await).await;
        assert_eq!(status, 200);
    }
    // The second request reused the first connection; the third came after it expired.
    assert_eq!(fake.connections(), 2);
    proxy.shutdown().await;
}
