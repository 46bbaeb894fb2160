//! Request heads: `Host`, `server.max_request_header_bytes`.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_or_doubled_host_is_a_400_before_anything_is_forwarded() {
    let up = FakeUpstream::start(ok_json()).await;
    let heads: [&[u8]; 2] = [
        b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\nhost: b\r\ncontent-length: 2\r\n\
          connection: close\r\n\r\n{}",
    ];
    for head in heads {
        let proxy = start_proxy(&up.url()).await;
        let answer = raw_status(proxy.proxy_addr, head).await;
        assert_answered(proxy.admin_addr, answer, (400, "bad_host", "client_error")).await;
        proxy.shutdown().await;
    }
    assert_eq!(up.connections(), 0, "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_request_head_is_a_431() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let big = "x".repeat(100 << 10);
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\nx-big: {big}\r\ncontent-length: 2\r\n\
         connection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_eq!(status, 431);
    let series = "goodput_limit_rejections_total{limit=\"server.max_request_header_bytes\"}";
    assert_eq!(wait_metric(proxy.admin_addr, series, 1.0).await, 1.0);
    assert_eq!(up.connections(), 0);
    // Just under the limit still goes through.
    let fits = "x".repeat(60 << 10);
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\nx-big: {fits}\r\ncontent-length: 2\r\n\
         connection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_eq!(status, 200);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_http2_header_list_is_a_431() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut send = h2_connect(proxy.proxy_addr).await;
    let mut req = h2_post(proxy.proxy_addr, "{}");
    let big = http::HeaderValue::from_str(&"x".repeat(100 << 10)).unwrap();
    req.headers_mut().insert("x-big", big);
    let answer = send.send_request(req).await;
    let status = answer.as_ref().map(|r| r.status().as_u16());
    assert!(matches!(status, Ok(431)), "{answer:?}");
    assert_eq!(up.connections(), 0);
    proxy.shutdown().await;
}
