//! Outcomes of streams that end wrongly.

use super::*;

#[tokio::test]
async fn clean_http_end_without_done_is_an_upstream_reset() {
    let mut events = openai_chat_events(3, true);
    events.pop(); // no `data: [DONE]`
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, body) =
        collect(send_json(&chat, "no-done", chat_body(true, 3, true)).await).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_ref(), events.concat().as_slice());
    let r = record(proxy.admin_addr, "no-done").await.unwrap();
    assert_eq!(r["outcome"], "upstream_reset", "{r}");
    assert_eq!(r["events"], 3);
    proxy.shutdown().await;
}

#[tokio::test]
async fn error_event_mid_stream_is_an_upstream_error() {
    let mut events = openai_chat_events(2, false); // role, tok0, tok1, [DONE]
    events.insert(
        2,
        br#"data: {"error":{"message":"engine died","type":"server_error","code":500}}

"#
        .to_vec(),
    );
    events.remove(3); // tok1 never comes
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, body) =
        collect(send_json(&chat, "err-event", chat_body(true, 2, false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_ref(), events.concat().as_slice());
    let r = record(proxy.admin_addr, "err-event").await.unwrap();
    assert_eq!(r["outcome"], "upstream_error", "{r}");
    assert_eq!(r["status"], 200);
    assert_eq!(r["events"], 1);
    proxy.shutdown().await;
}
