//! A client that goes away cancels the upstream request.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_mid_stream_closes_the_upstream_connection() {
    // 600 events 30 ms apart: an upstream request that was not cancelled is still
    // streaming when the wait for its close gives up.
    let events = openai_chat_events(600, false);
    let up = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::from_millis(30),
    ))
    .await;
    let proxy = start_proxy(&up.url()).await;
    let (s, _) = raw_stream_events(proxy.proxy_addr, 3).await.unwrap();
    drop(s);
    let closed = up.wait_client_close(Duration::from_secs(10)).await;
    assert!(closed.is_some(), "the upstream never saw the proxy hang up");
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    assert_eq!(r["status"], 200);
    let n = r["events"].as_u64().unwrap();
    assert!((2..600).contains(&n), "{r}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_abort_of_a_hyper_client_closes_the_upstream_connection() {
    // 600 events 30 ms apart: an upstream request that was not cancelled is still
    // streaming when the wait for its close gives up.
    let events = openai_chat_events(600, false);
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
    drop(resp);
    drop(client);
    assert!(
        up.wait_client_close(Duration::from_secs(10))
            .await
            .is_some()
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
    drop(s);
    assert!(
        up.wait_client_close(Duration::from_secs(10))
            .await
            .is_some(),
        "the upstream request was not cancelled"
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
    // Aborting the task drops the request future and the only client: RST_STREAM, then the
    // connection goes.
    pending.abort();
    assert!(
        up.wait_client_close(Duration::from_secs(10))
            .await
            .is_some()
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
    // Cancelled or not, the simulator's request ends (it streams for 2 s); how it ended
    // is the test.
    poll_loop!(deadline = Instant::now() + Duration::from_secs(10), {
        if !sim.truth().is_empty() || Instant::now() >= deadline {
            break;
        }
    });
    let truth = sim.truth();
    assert_eq!(truth.len(), 1, "the simulator's request did not end");
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
