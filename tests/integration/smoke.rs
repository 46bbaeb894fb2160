//! The shortest path through the system: a streamed chat completion from the simulator
//! through goodput, and its record.

use std::time::Duration;

use crate::common::harness::*;

#[tokio::test]
async fn streamed_chat_is_forwarded_and_recorded() {
    let (_sim, upstream) = start_sim(fast_sim(30.0, 5.0)).await;
    let proxy = start_proxy(&upstream).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let (status, body) = post_collect(&client(), &url, chat_body(true, 10, true)).await;
    assert_eq!(status, 200);
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let recs = wait_records(proxy.admin_addr, 1, Duration::from_secs(5)).await;
    let r = &recs[0];
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["output_tokens"], 10);
    assert_eq!(r["output_tokens_source"], "usage");
    assert_eq!(r["model"], "test-model");
    assert!(r["ttft_ms"].as_f64().unwrap() >= 30.0);
    proxy.shutdown().await;
}
