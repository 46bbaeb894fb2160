//! Upstream reset or truncation mid-stream reaches the client as an abort.

use super::*;

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
