//! Graceful drain, and the drain deadline.

use super::*;

/// Polls until connecting to `addr` is refused; false if it never is within `timeout`.
async fn refused_within(addr: SocketAddr, timeout: Duration) -> bool {
    poll_loop!(deadline = Instant::now() + timeout, {
        if TcpStream::connect(addr).await.is_err() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    })
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
    // Nothing is left to drain: shutdown ends long before the drain deadline would.
    let shut = tokio::time::timeout(Duration::from_secs(10), proxy.shutdown()).await;
    assert!(shut.is_ok(), "shutdown waited for a drained stream");

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
    // 4,096 tokens (the simulator's cap) 10 ms apart, 40 s: a stream the deadline must cut.
    let mut resp = post(&client, &chat_url(&proxy), chat_body(true, 5000, false)).await;
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
        cut_after >= Duration::from_millis(250),
        "cut before the drain deadline, after {cut_after:?}"
    );
    // The stream would run for 40 s: shutdown ending within 20 means the deadline cut it.
    tokio::time::timeout(Duration::from_secs(20), shutting)
        .await
        .expect("shutdown waited past the drain deadline")
        .unwrap();
    let recs = recent.latest(10);
    assert_eq!(recs.len(), 1, "the cut stream is recorded");
    assert_eq!(recs[0].outcome, Outcome::ProxyError, "{:?}", recs[0]);
    assert!(recs[0].events > 0 && recs[0].events < 500);
}
