//! Bodies over the inspection limit.

use super::*;

#[tokio::test]
async fn request_over_the_inspection_limit_passes_untouched_and_is_not_inspected() {
    let fake = FakeUpstream::start(ok_json_script()).await;
    let mut cfg = test_config(&fake.url());
    cfg.measure.request_inspect_limit = 256;
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");

    let big = format!(
        r#"{{"model":"test-model","stream":false,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(64 * 1024)
    );
    let (status, _, _) = collect(send_json(&chat, "big", big.clone()).await).await;
    assert_eq!(status, 200);
    // Control: the same proxy inspects a body under the limit.
    let small = chat_body(false, 1, false);
    assert!(small.len() < 256);
    let (status, _, _) = collect(send_json(&chat, "small", small).await).await;
    assert_eq!(status, 200);

    let received = fake.wait_requests(2, T).await;
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].body.len(), big.len());
    assert!(
        received[0].body == big.as_bytes(),
        "big body changed on its way"
    );
    let r = record(proxy.admin_addr, "big").await.unwrap();
    assert!(r["model"].is_null(), "over the limit, not inspected: {r}");
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["status"], 200);
    let r = record(proxy.admin_addr, "small").await.unwrap();
    assert_eq!(r["model"], "test-model", "{r}");
    proxy.shutdown().await;
}
