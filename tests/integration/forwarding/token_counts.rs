//! Token counts and TPOT against the simulator's ground truth.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpot_with_multi_token_events_and_usage_matches_sim_truth() {
    let mut cfg = fast_sim(40.0, 25.0);
    cfg.tokens_per_event = 4;
    let (sim, upstream) = start_sim(cfg).await;
    let proxy = start_proxy(&upstream).await;
    let chat = url(&proxy, "/v1/chat/completions");
    // Warm the pooled upstream connection, as in steady production traffic.
    let (status, _, _) = collect(send_json(&chat, "warm-up", chat_body(true, 1, true)).await).await;
    assert_eq!(status, 200);

    let sent = Instant::now();
    let resp = send_json(&chat, "tpot", chat_body(true, 10, true)).await;
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    let mut client_first = None;
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap_or_default();
        seen.extend_from_slice(&data);
        if client_first.is_none() && seen.windows(20).any(|w| w == br#""delta":{"content":""#) {
            client_first = Some(sent.elapsed());
        }
    }
    let client_first = client_first.unwrap();
    assert!(seen.ends_with(b"data: [DONE]\n\n"));

    let truth = sim
        .truth()
        .into_iter()
        .find(|t| t.request_id.as_deref() == Some("tpot"))
        .unwrap();
    assert!(truth.completed);
    assert_eq!((truth.completion_tokens, truth.events), (10, 3));
    let r = record(proxy.admin_addr, "tpot").await.unwrap();
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["output_tokens"], 10, "from usage, not the 3 events");
    assert_eq!(r["output_tokens_source"], "usage");
    assert_eq!(r["input_tokens"], truth.prompt_tokens);
    assert_eq!(r["input_tokens_source"], "usage");
    assert_eq!(r["events"], 3, "ceil(10 / 4) content events");

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // First to last token, as the sim sent them (~50 ms: two 25 ms gaps; the sim's own
    // scheduling may shift it a little, which is why the proxy is compared with the truth
    // and not with the configuration) and as the proxy saw them (tpot × (output_tokens − 1)).
    // Dividing by the 2 event gaps instead of the 9 token gaps would be off by 4.5×.
    let truth_span = ms(truth.last_token_at.unwrap() - truth.first_token_at.unwrap());
    // The sim paused at least its configured gaps; a loaded machine only stretches them.
    assert!(truth_span >= 40.0, "sim span {truth_span}");
    let tpot = num(&r, "tpot_ms").unwrap();
    assert!(
        (tpot * 9.0 - truth_span).abs() <= (truth_span * 0.2).max(2.0),
        "tpot {tpot} ms × 9 vs the sim's first-to-last {truth_span} ms"
    );

    // TTFT: the proxy's clock starts before the sim got the request and stops after the
    // sim sent the first token, so it is at least the sim's own TTFT and at most what the
    // client observed (how far above the sim's depends on how busy the cores are).
    let truth_ttft = ms(truth.first_token_at.unwrap() - truth.received_at);
    assert!(truth_ttft >= 39.0, "sim ttft {truth_ttft}");
    let ttft = num(&r, "ttft_ms").unwrap();
    assert!(
        ttft >= truth_ttft,
        "ttft {ttft} ms vs sim truth {truth_ttft} ms"
    );
    assert!(
        ttft <= ms(client_first) + 0.01,
        "ttft {ttft} ms is later than the client saw the token ({client_first:?})"
    );
    // Two ~25 ms gaps between the three events: the smaller is p50, the larger max, and
    // together they span the sim's first to last token.
    let itl = &r["itl_ms"];
    let (p50, max) = (itl["p50"].as_f64().unwrap(), itl["max"].as_f64().unwrap());
    assert!(p50 >= 15.0 && p50 <= max, "{r}");
    assert!(
        (p50 + max - truth_span).abs() <= 2.0,
        "{r} vs span {truth_span}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_usage_output_tokens_are_counted_from_events() {
    let (sim, upstream) = start_sim(fast_sim(5.0, 2.0)).await;
    // The events fallback is the subject: no estimate from the embedded tokenizer.
    let mut cfg = test_config(&upstream);
    cfg.tokenizer.estimate = false;
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, body) =
        collect(send_json(&chat, "events", chat_body(true, 6, false)).await).await;
    assert_eq!(status, 200);
    assert!(
        !body.windows(8).any(|w| w == b"\"usage\""),
        "no usage asked, none sent"
    );

    let truth = sim.truth();
    let truth = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("events"))
        .unwrap();
    assert_eq!(truth.events, 6);
    let r = record(proxy.admin_addr, "events").await.unwrap();
    assert_eq!(r["output_tokens"], 6, "{r}");
    assert_eq!(r["output_tokens_source"], "events");
    assert_eq!(r["events"], 6);
    assert!(r["input_tokens"].is_null(), "{r}");
    assert!(r["input_tokens_source"].is_null(), "{r}");
    assert_eq!(r["outcome"], "ok");
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_usage_multi_token_events_count_events_not_tokens() {
    let mut cfg = fast_sim(5.0, 2.0);
    cfg.tokens_per_event = 3;
    let (sim, upstream) = start_sim(cfg).await;
    // The events fallback is the subject: no estimate from the embedded tokenizer.
    let mut cfg = test_config(&upstream);
    cfg.tokenizer.estimate = false;
    let proxy = start_proxy_with(cfg).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, _, _) =
        collect(send_json(&chat, "events3", chat_body(true, 7, false)).await).await;
    assert_eq!(status, 200);
    let truth = sim.truth();
    let truth = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("events3"))
        .unwrap();
    assert_eq!((truth.completion_tokens, truth.events), (7, 3));
    let r = record(proxy.admin_addr, "events3").await.unwrap();
    assert_eq!(r["output_tokens"], 3, "the events are all it can know: {r}");
    assert_eq!(r["output_tokens_source"], "events");
    assert_eq!(r["events"], 3);
    proxy.shutdown().await;
}

#[tokio::test]
async fn non_streaming_usage_comes_from_the_json_body() {
    let (sim, upstream) = start_sim(fast_sim(10.0, 2.0)).await;
    let proxy = start_proxy(&upstream).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let (status, headers, body) =
        collect(send_json(&chat, "non-stream", chat_body(false, 6, false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let parsed: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(parsed["usage"]["completion_tokens"], 6);

    let truth = sim.truth();
    let truth = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("non-stream"))
        .unwrap();
    let r = record(proxy.admin_addr, "non-stream").await.unwrap();
    assert_eq!(r["stream"], false);
    assert_eq!(r["status"], 200);
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["output_tokens"], truth.completion_tokens, "{r}");
    assert_eq!(r["output_tokens_source"], "usage");
    assert_eq!(r["input_tokens"], truth.prompt_tokens);
    assert_eq!(r["input_tokens_source"], "usage");
    assert!(r["ttft_ms"].is_null(), "no TTFT without a stream: {r}");
    assert!(r["tpot_ms"].is_null(), "{r}");
    assert!(r["itl_ms"].is_null(), "{r}");
    assert_eq!(r["events"], 0);
    assert_eq!(r["bytes_out"], body.len());
    // The sim answers after ttft + 5 gaps = 20 ms.
    assert!(num(&r, "e2e_ms").unwrap() >= 19.0, "{r}");
    proxy.shutdown().await;
}
