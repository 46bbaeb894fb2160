//! Byte-exact forwarding under adversarial upstream writes.

use super::*;

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
        Step::Pause(Duration::from_millis(10)),
        Step::Write(Bytes::copy_from_slice(&body[1..100])),
        Step::Pause(Duration::from_millis(10)),
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
