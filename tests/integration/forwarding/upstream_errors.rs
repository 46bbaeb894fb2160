//! Upstream errors pass through.

use super::*;

#[tokio::test]
async fn upstream_500_passes_through_exactly() {
    let body = br#"{"error":{"message":"model overloaded","type":"server_error","param":null,"code":null}}"#;
    let fake = FakeUpstream::start(Script::response(
        500,
        &[("content-type", "application/json")],
        body,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, got) = collect(send_json(&chat, "e500", chat_body(true, 5, true)).await).await;
    assert_eq!(status, 500);
    assert_eq!(got.as_ref(), body.as_slice());

    let raw = raw_post_with(
        "/v1/chat/completions",
        &[("x-request-id", "e500-raw")],
        chat_body(true, 5, true).as_bytes(),
    );
    let (out, _) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 500 "), "{head}");
    assert_eq!(rest, body.as_slice());

    for id in ["e500", "e500-raw"] {
        let r = record(proxy.admin_addr, id).await.unwrap();
        assert_eq!(r["outcome"], "upstream_error", "{r}");
        assert_eq!(r["status"], 500);
        assert!(r["ttft_ms"].is_null());
        assert_eq!(r["bytes_out"], body.len());
    }
    let text = metrics(proxy.admin_addr).await;
    let series = r#"goodput_requests_total{model="test-model",api="chat_completions",outcome="upstream_error",class="default",slo="missed",status_class="5xx"}"#;
    assert_eq!(metric_value(&text, series), Some(2.0), "{text}");
    proxy.shutdown().await;
}
