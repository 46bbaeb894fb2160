//! Request bodies: the client's failures are `client_error`; `server.request_body_timeout`.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_chunked_body_is_a_400_client_error() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\
         connection: close\r\n\r\n2\r\n{{}}\r\nzz\r\nnot a chunk\r\n\r\n"
    );
    let answer = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_answered(
        proxy.admin_addr,
        answer,
        (400, "bad_request_body", "client_error"),
    )
    .await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_gone_mid_upload_is_a_client_error_not_an_upstream_one() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    s.write_all(
        format!("POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n{{\"model\"")
            .as_bytes(),
    )
    .await
    .unwrap();
    // The proxy has the head once the measurement counts the request in flight.
    assert_eq!(
        wait_metric(proxy.admin_addr, "goodput_in_flight_requests", 1.0).await,
        1.0
    );
    drop(s);
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_error", "{r}");
    assert!(
        up.requests().await.is_empty(),
        "no complete request went upstream"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_body_shorter_than_its_content_length_is_a_client_error() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut send = h2_connect(proxy.proxy_addr).await;
    let mut req = h2_post(proxy.proxy_addr, "{}");
    req.headers_mut()
        .insert("content-length", http::HeaderValue::from_static("100"));
    // h2 finds the mismatch itself and resets the stream; whether the proxy's 400 gets
    // out first depends on who looks first. Either way it is the client's doing.
    let answered = match send.send_request(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            Some((status, body.unwrap_or_default()))
        }
        Err(_) => None,
    };
    let r = one_record(proxy.admin_addr).await;
    match &answered {
        Some((status, body)) => {
            assert_eq!(*status, 400);
            assert_eq!(error_code(body), "bad_request_body");
            assert_eq!(r["outcome"], "client_error", "{r}");
        }
        // A reset stream before any answer: the client's doing either way. When h2 resets
        // the stream before the body tap has read the short body, the request ends as a
        // stream the client left (`client_abort`); after, as its broken body
        // (`client_error`). Both stay out of attainment; which one is a race on the cores.
        None => assert!(
            matches!(r["outcome"].as_str(), Some("client_error" | "client_abort")),
            "{r}"
        ),
    }
    assert!(
        up.requests().await.is_empty(),
        "no complete request went upstream"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_body_gets_408_at_the_deadline_and_frees_the_upstream() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.request_body_timeout = Duration::from_millis(300);
    let proxy = start_proxy_with(cfg).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    s.write_all(
        format!("POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n{{\"model\"")
            .as_bytes(),
    )
    .await
    .unwrap();
    // ... and nothing more, ever.
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut raw)).await;
    let (head, body) = split_head(&raw);
    let status = head.split(' ').nth(1).unwrap_or_default().to_owned();
    assert_answered(
        proxy.admin_addr,
        (status.parse().unwrap_or(0), body.to_vec()),
        (408, "request_body_timeout", "client_error"),
    )
    .await;
    let series = "goodput_limit_rejections_total{limit=\"server.request_body_timeout\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    assert!(up.requests().await.is_empty());
    // Excluded from SLO attainment, like a client abort.
    let text = metrics(proxy.admin_addr).await;
    assert!(
        text.lines().any(|l| l.starts_with("goodput_requests_total")
            && l.contains("outcome=\"client_error\"")
            && l.contains("slo=\"excluded\"")),
        "{text}"
    );
    proxy.shutdown().await;
}
