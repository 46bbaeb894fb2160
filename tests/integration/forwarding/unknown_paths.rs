//! Unknown paths and content types.

use super::*;

#[tokio::test]
async fn unknown_path_passes_bytes_and_records_e2e_and_bytes_only() {
    let body = b"line one\nline two: data: [DONE]\n\n\x00\xff binary tail".repeat(50);
    let fake = FakeUpstream::start(Script::response(
        200,
        &[("content-type", "text/plain")],
        &body,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let raw = raw_post_with("/v2/whatever", &[("x-request-id", "unknown")], b"hello");
    let (out, errored) = raw_exchange(proxy.proxy_addr, &raw, T).await;
    assert!(!errored);
    let (head, rest) = split_head(&out);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(
        head_value(&head, "content-type").as_deref(),
        Some("text/plain")
    );
    assert!(rest == body.as_slice(), "unknown-path body changed");
    let received = fake.wait_requests(1, T).await;
    assert_eq!(received[0].target, "/v2/whatever");
    assert_eq!(received[0].body, b"hello");

    let r = record(proxy.admin_addr, "unknown").await.unwrap();
    assert_eq!(r["api"], "unknown", "{r}");
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["status"], 200);
    assert_eq!(r["bytes_out"], body.len());
    assert!(r["ttft_ms"].is_null() && r["tpot_ms"].is_null(), "{r}");
    assert!(
        r["output_tokens"].is_null() && r["input_tokens"].is_null(),
        "{r}"
    );
    assert_eq!(r["events"], 0);
    assert!(num(&r, "e2e_ms").unwrap() > 0.0);
    proxy.shutdown().await;
}
