//! No response head: 502 for a dead upstream, 504 for a silent one.

use super::*;

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
    // The upstream never answers: without the timeout the request would wait forever.
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        post(&client(), &chat_url(&proxy), chat_body(true, 5, false)),
    )
    .await
    .expect("the header timeout never fired");
    let took = sent.elapsed();
    assert_eq!(resp.status(), 504);
    assert!(
        took >= Duration::from_millis(190),
        "the 504 came before the timeout, after {took:?}"
    );
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_header_timeout", "{v}");
    assert!(
        up.wait_client_close(Duration::from_secs(10))
            .await
            .is_some(),
        "the proxy must close the upstream connection it gave up on"
    );
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "timeout", "{r}");
    assert_eq!(r["status"], 504);
    proxy.shutdown().await;
}
