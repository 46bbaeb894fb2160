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

/// What a client sent when the `http_exchange` fuzz target first caught hyper writing a
/// 400 ahead of the end of the answer before it: a request whose body runs into the next,
/// a second request (`expect: 100-continue`), and a third whose version is malformed.
const PIPELINE_FROM_FUZZING: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n\
content-type: application/json\r\ncontent-length: 71\r\n\r\n\
{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"POS\
TPOST /vcac//t1hompletions HTTP/1.1\r\nhostetimdeolsent-type: application/json\r\n\
expect: 100-continue\r\ncontent-length: 71\r\n\r\n\
{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n\
--upstreaPOST /v2/chat/completions HTTR/1.1\r\nhost: t\r\n\r\n";

/// A malformed request pipelined behind others: its 400 comes after the whole of the
/// answers before it, never inside one. hyper writes that 400 at once, while the end of
/// the answer before may still wait in the connection's write buffer (held back for
/// coalescing, as the second of two answers in a row is, or for a slow reader). The
/// answers here are the proxy's own 502s (the upstream's head is malformed).
#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_pipelined_request_is_answered_after_the_whole_previous_response() {
    let up = FakeUpstream::start(Script::new(vec![
        Step::Write(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\nnot a header line\r\n\r\n",
        )),
        Step::Close,
    ]))
    .await;
    let proxy = start_proxy(&up.url()).await;
    let (got, _) = raw_exchange(
        proxy.proxy_addr,
        PIPELINE_FROM_FUZZING,
        Duration::from_secs(10),
    )
    .await;
    // The proxy's 502 (the upstream's head is malformed), its 400 `bad_host` (the second
    // request names no host), then hyper's 400 for the third, which closes.
    let mut rest = &got[..];
    let mut statuses = Vec::new();
    while !rest.is_empty() {
        let (head, after_head) = split_head(rest);
        let status = &head[9..12];
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("a length: {head}"));
        let (body, after) = after_head.split_at(length.min(after_head.len()));
        if statuses.len() < 2 {
            let error: Value = serde_json::from_slice(body).unwrap_or_else(|e| {
                panic!(
                    "answer {status}'s body is not whole ({e}):\n{}",
                    String::from_utf8_lossy(after_head)
                )
            });
            assert_eq!(error["error"]["type"], "goodput_proxy_error", "{error}");
        } else {
            assert!(head.contains("connection: close"), "{head}");
        }
        statuses.push(status.to_owned());
        rest = after;
    }
    assert_eq!(statuses, ["502", "400", "400"]);
    let mut records = wait_records(proxy.admin_addr, 2, Duration::from_secs(5)).await;
    records.sort_by_key(|r| r["status"].as_u64());
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0]["status"], 400);
    assert_eq!(records[0]["outcome"], "client_error");
    assert_eq!(records[1]["status"], 502);
    proxy.shutdown().await;
}
