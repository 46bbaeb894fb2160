//! The idle timeout cuts a stalled stream, never a long healthy one.

use super::*;

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
    // The upstream stalls forever: without the idle timeout the read would never end.
    let (raw, end) = read_to_end(&mut s, Duration::from_secs(10)).await;
    let took = sent.elapsed();
    assert_ne!(end, End::TimedOut, "the idle timeout never cut the stream");
    assert!(
        took >= Duration::from_millis(190),
        "cut before the timeout, after {took:?}"
    );
    let (head, body) = head_and_body(&raw).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (data, terminated) = dechunk(body);
    assert_eq!(data, SSE_COMMENT);
    assert!(!terminated, "an idle-timed-out stream must be an abort");
    assert!(
        up.wait_client_close(Duration::from_secs(10))
            .await
            .is_some()
    );
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
