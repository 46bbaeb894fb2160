//! The request side: body, headers, request id.

use super::*;

#[tokio::test]
async fn request_body_arrives_upstream_byte_identical() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    // Odd whitespace, escapes, raw UTF-8 and a large prompt (several frames).
    let prompt = "ünïcödé \\u00e9 \\\"q\\\" ".repeat(20_000);
    let body = format!(
        "  {{\"model\" : \"test-model\",\n\t\"messages\":[{{\"role\":\"user\",\"content\":\"{prompt}\"}}],\"stream\":false}}\r\n"
    );
    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "req-body",
        body.clone(),
    )
    .await;
    let (status, _, _) = collect(resp).await;
    assert_eq!(status, 200);
    let received = fake.wait_requests(1, T).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body.len(), body.len());
    assert!(received[0].body == body.as_bytes(), "request body changed");
    assert_eq!(received[0].method, "POST");
    assert_eq!(received[0].target, "/v1/chat/completions");
    assert_eq!(
        received[0].header("content-length"),
        Some(body.len().to_string().as_str()),
        "a Content-Length request keeps its length"
    );
    let r = record(proxy.admin_addr, "req-body").await.unwrap();
    assert_eq!(r["model"], "test-model", "inspected while forwarded: {r}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn chunked_request_body_arrives_upstream_byte_identical() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let body = chat_body(false, 1, false);
    let bytes = body.as_bytes();
    let mut raw = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: test\r\n\
        content-type: application/json\r\ntransfer-encoding: chunked\r\n\
        x-request-id: chunked-req\r\nconnection: close\r\n\r\n"
        .to_vec();
    for piece in [&bytes[..1], &bytes[1..20], &bytes[20..]] {
        raw.extend_from_slice(&http_chunk(piece));
    }
    raw.extend_from_slice(LAST_CHUNK);
    let (out, _) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, _) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");

    let received = fake.wait_requests(1, T).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body_text(), body);
    assert_eq!(received[0].target, "/v1/chat/completions?x=1");
    let r = record(proxy.admin_addr, "chunked-req").await.unwrap();
    assert_eq!(r["model"], "test-model", "{r}");
    assert_eq!(r["stream"], false);
    proxy.shutdown().await;
}

#[tokio::test]
async fn hop_by_hop_request_headers_are_not_forwarded() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let body = chat_body(false, 1, false);
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\n\
         host: client-facing.example\r\n\
         content-type: application/json\r\n\
         content-length: {}\r\n\
         connection: close, x-custom-hop\r\n\
         x-custom-hop: secret-hop\r\n\
         keep-alive: timeout=5\r\n\
         te: gzip\r\n\
         proxy-authorization: Basic c2VjcmV0\r\n\
         authorization: Bearer end-to-end\r\n\
         x-end-to-end: kept\r\n\
         x-request-id: hop\r\n\
         \r\n{body}",
        body.len()
    );
    let (out, _) = raw_exchange(proxy.proxy_addr, raw.as_bytes(), T).await;
    let (head, _) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");

    let received = fake.wait_requests(1, T).await;
    let req = &received[0];
    for gone in ["x-custom-hop", "keep-alive", "te", "proxy-authorization"] {
        assert_eq!(
            req.header(gone),
            None,
            "{gone} was forwarded: {:?}",
            req.headers
        );
    }
    for value in req.header_all("connection") {
        assert!(!value.contains("x-custom-hop"), "{value}");
    }
    assert_eq!(req.header("authorization"), Some("Bearer end-to-end"));
    assert_eq!(req.header("x-end-to-end"), Some("kept"));
    assert_eq!(req.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(req.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        req.header("x-forwarded-host"),
        Some("client-facing.example")
    );
    assert_eq!(req.header_all("host"), [fake.addr().to_string().as_str()]);
    assert_eq!(req.header("x-request-id"), Some("hop"));
    assert!(req.body == body.as_bytes());
    proxy.shutdown().await;
}

#[tokio::test]
async fn hop_by_hop_response_headers_are_not_passed_to_the_client() {
    let body = br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    let fake = FakeUpstream::start(Script::response(
        200,
        &[
            ("content-type", "application/json"),
            ("connection", "x-resp-hop"),
            ("x-resp-hop", "secret"),
            ("keep-alive", "timeout=5, max=100"),
            ("proxy-authenticate", "Basic realm=\"x\""),
            ("x-kept", "yes"),
        ],
        body,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "resp-hop")],
        chat_body(false, 1, false).as_bytes(),
    );
    let (out, _) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let names = head_names(&head);
    for gone in ["x-resp-hop", "keep-alive", "proxy-authenticate"] {
        assert!(!names.iter().any(|n| n == gone), "{gone} passed: {head}");
    }
    if let Some(connection) = head_value(&head, "connection") {
        assert!(!connection.contains("x-resp-hop"), "{head}");
    }
    assert_eq!(head_value(&head, "x-kept").as_deref(), Some("yes"));
    assert_eq!(rest, body.as_slice());

    // The same through hyper.
    let resp = send_json(&url(&proxy, "/v1/chat/completions"), "resp-hop-2", "{}").await;
    let (_, headers, _) = collect(resp).await;
    assert!(headers.get("x-resp-hop").is_none() && headers.get("keep-alive").is_none());
    assert_eq!(headers["x-kept"], "yes");
    proxy.shutdown().await;
}

#[tokio::test]
async fn incoming_request_id_is_forwarded_and_is_the_record_id() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, _) =
        collect(send_json(&chat, "client-id-42", chat_body(false, 1, false)).await).await;
    assert_eq!(status, 200);
    let received = fake.wait_requests(1, T).await;
    assert_eq!(received[0].header_all("x-request-id"), ["client-id-42"]);
    let r = record(proxy.admin_addr, "client-id-42").await;
    assert!(r.is_some(), "no record with the client's id");
    proxy.shutdown().await;
}

#[tokio::test]
async fn missing_request_id_is_generated_forwarded_and_recorded() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    for _ in 0..2 {
        let resp = send(
            &chat,
            &[("content-type", "application/json")],
            chat_body(false, 1, false),
        )
        .await;
        assert_eq!(collect(resp).await.0, 200);
    }
    let received = fake.wait_requests(2, T).await;
    let sent: Vec<String> = received
        .iter()
        .map(|r| {
            let ids = r.header_all("x-request-id");
            assert_eq!(ids.len(), 1, "{:?}", r.headers);
            ids[0].to_owned()
        })
        .collect();
    assert!(!sent[0].is_empty());
    assert_ne!(sent[0], sent[1], "generated ids must differ");
    let recs = wait_records(proxy.admin_addr, 2, T).await;
    let recorded: BTreeSet<&str> = recs.iter().filter_map(|r| r["id"].as_str()).collect();
    let forwarded: BTreeSet<&str> = sent.iter().map(String::as_str).collect();
    assert_eq!(recorded, forwarded);
    proxy.shutdown().await;
}
