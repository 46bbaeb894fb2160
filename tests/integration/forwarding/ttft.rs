//! TTFT ends at the first content-bearing event.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_skips_the_role_only_chunk() {
    let events = openai_chat_events(3, true); // role, tok0, tok1, tok2, usage, [DONE]
    let chunk = |i: usize| Step::Write(http_chunk(&events[i]));
    let ms = |n| Step::Pause(Duration::from_millis(n));
    let script = Script::new(vec![
        Step::Write(Bytes::from_static(SSE_HEAD)),
        chunk(0),
        // Content only once the client has the role chunk (and 150 ms more): a proxy
        // that held the role chunk back until content came would never see it come.
        Step::Hold,
        chunk(1),
        ms(40),
        chunk(2),
        ms(40),
        chunk(3),
        chunk(4),
        chunk(5),
        Step::Write(Bytes::from_static(LAST_CHUNK)),
    ]);
    let fake = FakeUpstream::start(script).await;
    let proxy = start_proxy(&fake.url()).await;

    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "role-first",
        chat_body(true, 3, true),
    )
    .await;
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the role chunk reaches the client before any content is sent")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert!(
        first.starts_with(b"data: ") && first.windows(6).any(|w| w == b"\"role\""),
        "first bytes to arrive are the role chunk"
    );
    // At least 150 ms from the role chunk to the content (a loaded machine only
    // stretches it).
    tokio::time::sleep(Duration::from_millis(150)).await;
    fake.release();
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!([first, second, rest].concat(), events.concat());

    let r = record(proxy.admin_addr, "role-first").await.unwrap();
    // Content at +150, +190, +230 at the earliest (pauses only ever stretch): TTFT ends at
    // the first content chunk, not the role chunk, and the two content gaps follow it.
    let ttft = num(&r, "ttft_ms").unwrap();
    let e2e = num(&r, "e2e_ms").unwrap();
    assert!(
        ttft >= 149.0,
        "ttft {ttft} ms: must end at the first content chunk (150 ms), not the role chunk"
    );
    assert!(e2e - ttft >= 79.0, "ttft {ttft} and e2e {e2e}: {r}");
    // tpot = at least 80 ms / (3 - 1).
    let tpot = num(&r, "tpot_ms").unwrap();
    assert!(tpot >= 39.0, "tpot {tpot}: {r}");
    let itl = &r["itl_ms"];
    assert!(itl["p50"].as_f64().unwrap() >= 39.0, "{r}");
    assert!(itl["max"].as_f64().unwrap() >= 39.0, "{r}");
    assert_eq!(r["events"], 3);
    assert_eq!(r["outcome"], "ok");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_comments_and_empty_deltas_are_not_tokens() {
    let content = openai_chat_events(2, false); // role, tok0, tok1, [DONE]
    let empty_delta = br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":null}]}

"#;
    let ms = |n| Step::Pause(Duration::from_millis(n));
    let write = |b: &[u8]| Step::Write(http_chunk(b));
    let script = Script::new(vec![
        Step::Write(Bytes::from_static(SSE_HEAD)),
        write(b": keep-alive\n\n"),
        ms(40),
        write(b":\r\n\r\n"),
        ms(40),
        write(&content[0]),
        ms(40),
        write(empty_delta),
        ms(40),
        write(&content[1]),
        ms(30),
        write(&content[2]),
        write(&content[3]),
        Step::Write(Bytes::from_static(LAST_CHUNK)),
    ]);
    let fake = FakeUpstream::start(script).await;
    // The events fallback is the subject: no estimate from the embedded tokenizer.
    let mut cfg = test_config(&fake.url());
    cfg.tokenizer.estimate = false;
    let proxy = start_proxy_with(cfg).await;
    let resp = send_json(
        &url(&proxy, "/v1/chat/completions"),
        "keepalive",
        chat_body(true, 2, false),
    )
    .await;
    let (status, _, _) = collect(resp).await;
    assert_eq!(status, 200);

    let r = record(proxy.admin_addr, "keepalive").await.unwrap();
    let ttft = num(&r, "ttft_ms").unwrap();
    assert!(
        (160.0..195.0).contains(&ttft),
        "ttft {ttft}: comments, role and empty delta before the first token are not tokens"
    );
    assert_eq!(r["events"], 2, "{r}");
    assert_eq!(r["output_tokens"], 2);
    assert_eq!(r["output_tokens_source"], "events");
    let tpot = num(&r, "tpot_ms").unwrap();
    assert!((28.0..40.0).contains(&tpot), "tpot {tpot}: {r}");
    assert_eq!(r["outcome"], "ok");
    proxy.shutdown().await;
}
