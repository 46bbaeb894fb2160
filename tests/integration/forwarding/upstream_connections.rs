//! Upstream connections: kept alive and reused, never a closed or stale one.

use super::*;

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
