//! The relay (`upstream.http1_relay`, goodput's own HTTP/1.1 client) against hyper's
//! client: the same upstream answers, good and broken, give the client the same status
//! and body bytes and give the same records, field for field (times and ids aside).

use super::*;
use crate::common::fake::Step;

/// Record fields that differ between any two requests: ids, clocks and durations.
fn comparable(r: &Value) -> Vec<(String, Value)> {
    let Some(fields) = r.as_object() else {
        return Vec::new();
    };
    fields
        .iter()
        .filter(|(k, _)| {
            !(k.ends_with("_ms")
                || k.ends_with("_at")
                || k.ends_with("_id")
                || k.ends_with("_s")
                || matches!(
                    k.as_str(),
                    "id" | "ts"
                        | "time"
                        | "timestamp"
                        | "start"
                        | "end"
                        | "clock"
                        | "ttft_clock"
                        | "traceparent"
                        | "trace"
                        | "gaps"
                        | "itl"
                        | "tpot"
                        | "upstream_conn"
                ))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Sends one raw request through a proxy in front of `script` (relay on or off): the
/// client's status line and decoded body (or raw bytes after the head when not chunked),
/// whether the connection was cut, and the record.
#[expect(
    clippy::unwrap_used,
    reason = "test helper: a missing record must stop the test"
)]
async fn through(script: &Script, relay: bool, stream: bool) -> (String, Vec<u8>, bool, Value) {
    let fake = FakeUpstream::start(script.clone()).await;
    let mut cfg = test_config(&fake.url());
    cfg.upstream.http1_relay = relay;
    // Started directly: the harness would put every proxy on hyper's client under
    // GOODPUT_TEST_UPSTREAM_CLIENT=hyper.
    let proxy = goodput::run::start(cfg).await.unwrap();
    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "parity")],
        chat_body(stream, 5, true).as_bytes(),
    );
    let (out, cut) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, rest) = split_head(&out);
    let status = head.lines().next().unwrap_or_default().to_owned();
    let body = match decode_chunked(rest) {
        Some((data, _)) if head_value(&head, "transfer-encoding").is_some() => data,
        _ if head_value(&head, "transfer-encoding").is_some() => {
            // Cut inside the chunked body: the payload of the whole chunks that came.
            partial_chunks(rest)
        }
        _ => rest.to_vec(),
    };
    let r = record(proxy.admin_addr, "parity").await.unwrap();
    proxy.shutdown().await;
    (status, body, cut, r)
}

/// The payload of the complete chunks at the start of a cut chunked body.
fn partial_chunks(mut input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = input.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&input[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size else {
            return out;
        };
        let start = line_end + 2;
        if size == 0 || input.len() < start + size + 2 {
            return out;
        }
        out.extend_from_slice(&input[start..start + size]);
        input = &input[start + size + 2..];
    }
}

fn scenarios() -> Vec<(&'static str, Script, bool)> {
    let events = openai_chat_events(5, true);
    let mut bad_chunk = vec![Step::Write(Bytes::from_static(SSE_HEAD))];
    bad_chunk.push(Step::Write(http_chunk(&events[0])));
    bad_chunk.push(Step::Write(http_chunk(&events[1])));
    bad_chunk.push(Step::Write(Bytes::from_static(b"zz\r\nnot a chunk\r\n")));
    bad_chunk.push(Step::Stall);
    let mut reset = vec![Step::Write(Bytes::from_static(SSE_HEAD))];
    reset.extend(events.iter().take(3).map(|e| Step::Write(http_chunk(e))));
    reset.push(Step::Reset);
    let close_delimited = {
        let mut head =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                .to_vec();
        head.extend_from_slice(&events.concat());
        Script::new(vec![Step::Write(Bytes::from(head)), Step::Close])
    };
    vec![
        (
            "one chunk per event",
            Script::sse_chunked(&events, WritePlan::Whole, Duration::ZERO),
            true,
        ),
        (
            "three events per chunk",
            Script::sse_chunked(&events, WritePlan::Coalesced(3), Duration::ZERO),
            true,
        ),
        (
            "events split across chunks",
            Script::sse_chunked(
                &events,
                WritePlan::SplitAt(vec![7, 50, 51, 200]),
                Duration::ZERO,
            ),
            true,
        ),
        ("not streamed", ok_json_script(), false),
        (
            "upstream error",
            Script::response(
                500,
                &[("content-type", "application/json")],
                br#"{"error":{"message":"boom","type":"server_error"}}"#,
            ),
            true,
        ),
        (
            "closed mid-stream",
            Script::sse_then_close(&events, 3),
            true,
        ),
        ("reset mid-stream", Script::new(reset), true),
        ("broken chunk framing", Script::new(bad_chunk), true),
        ("close-delimited", close_delimited, true),
    ]
}

#[tokio::test]
async fn the_relay_and_hypers_client_give_the_same_bytes_and_records() {
    for (name, script, stream) in scenarios() {
        let relay = through(&script, true, stream).await;
        let hyper = through(&script, false, stream).await;
        assert_eq!(relay.0, hyper.0, "{name}: status line");
        assert_eq!(
            String::from_utf8_lossy(&relay.1),
            String::from_utf8_lossy(&hyper.1),
            "{name}: body"
        );
        assert_eq!(relay.2, hyper.2, "{name}: connection cut");
        let (a, b) = (comparable(&relay.3), comparable(&hyper.3));
        let differing: Vec<_> = a.iter().zip(b.iter()).filter(|(x, y)| x != y).collect();
        assert!(
            a.len() == b.len() && differing.is_empty(),
            "{name}: records differ: {differing:?}\nrelay: {}\nhyper: {}",
            relay.3,
            hyper.3
        );
    }
}
