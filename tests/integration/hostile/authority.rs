//! Which authority the upstream hears of with `upstream.preserve_host = true`: an HTTP/2
//! request whose `host` differs from its `:authority` is refused (RFC 9113 §8.3.1), and an
//! HTTP/1 absolute-form request's target wins over its `Host` (RFC 9112 §3.2.2).

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_host_that_differs_from_authority_is_refused() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.preserve_host = true;
    let proxy = start_proxy_with(cfg).await;
    let mut send = h2_connect(proxy.proxy_addr).await;
    let request = |host: &'static str| {
        let mut req = h2_post(proxy.proxy_addr, "{}");
        *req.uri_mut() = format!("http://api.example{CHAT}").parse().unwrap();
        req.headers_mut()
            .insert("host", http::HeaderValue::from_static(host));
        req
    };
    let resp = send
        .send_request(request("elsewhere.example"))
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_answered(
        proxy.admin_addr,
        (status, body.to_vec()),
        (400, "bad_host", "client_error"),
    )
    .await;
    assert!(up.requests().await.is_empty(), "nothing went upstream");
    // The same authority in both (case aside) is forwarded, with that Host.
    let resp = send.send_request(request("API.example")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await.unwrap();
    let seen = up.wait_requests(1, WAIT).await;
    assert_eq!(
        seen[0].header("host"),
        Some("api.example"),
        "{:?}",
        seen[0].headers
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http1_absolute_form_target_wins_over_host() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.preserve_host = true;
    let proxy = start_proxy_with(cfg).await;
    let request = format!(
        "POST http://right.example:8443{CHAT} HTTP/1.1\r\nhost: wrong.example\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_eq!(status, 200);
    let seen = up.wait_requests(1, WAIT).await;
    assert_eq!(
        seen[0].header_all("host"),
        ["right.example:8443"],
        "{:?}",
        seen[0].headers
    );
    assert_eq!(
        seen[0].header("x-forwarded-host"),
        Some("right.example:8443")
    );
    assert_eq!(seen[0].target, CHAT, "origin-form upstream");
    proxy.shutdown().await;
}
