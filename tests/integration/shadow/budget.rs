//! The shadow on a budget of its own through the real proxy: an answer past
//! `max_answer_bytes` is cut, a copy is in flight until its record is written, every copy
//! taken is written or counted at shutdown, and a slow, large candidate never holds a
//! primary record up.
use super::*;

/// `n` OpenAI chat events of about 1 KiB of text each, with usage and `[DONE]` (so that no
/// token counting is needed): a long answer.
fn long_events(n: usize) -> Vec<Vec<u8>> {
    let text = "x".repeat(1000);
    let mut events: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{i} {text}\"}},\"finish_reason\":null}}]}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    events.extend(openai_chat_events(0, true).into_iter().skip(1));
    events
}

/// The shadow record of the copy of `id`.
async fn shadow_record(proxy: &Running, id: &str) -> Value {
    record_of(proxy.admin_addr, &format!("{id}:shadow"), T).await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_past_max_answer_bytes_is_cut_counted_and_not_judged() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script.clone()).await;
    // The first copy is answered with 20 KiB that never end; the next one normally.
    let endless = Script::new(vec![
        Step::Write(Bytes::from_static(SSE_HEAD)),
        Step::Write(http_chunk(&long_events(20).concat())),
        Step::Stall,
    ]);
    let candidate = FakeUpstream::start_sequence(vec![endless, script]).await;
    let extra = "max_answer_bytes = 4096\ntimeout = \"1h\"";
    let proxy = proxy_with(&primary.url(), &shadow_config(&candidate.url(), extra)).await;
    let (status, body, _) = chat(&proxy, "cut-1").await;
    assert_eq!(status, 200);
    assert_identical(&body, &expected);
    let cut = shadow_record(&proxy, "cut-1").await;
    assert_eq!(cut["shadow_cut"], "too_large", "{cut:#}");
    assert_eq!(cut["outcome"], "client_abort");
    assert_eq!(cut["slo_met"], Value::Null, "a cut answer is not judged");
    assert_eq!(
        cut["bytes_out"], 4096,
        "only the bytes within the limit are measured"
    );
    assert_eq!(cut["pair_id"], "cut-1");
    // The cut connection is closed, not kept for the next copy.
    assert!(candidate.wait_client_close(T).await.is_some());
    let (status, body, _) = chat(&proxy, "cut-2").await;
    assert_eq!(status, 200);
    assert_identical(&body, &expected);
    let whole = shadow_record(&proxy, "cut-2").await;
    assert_eq!(whole["outcome"], "ok", "{whole:#}");
    assert!(whole.get("shadow_cut").is_none());
    assert_eq!(candidate.requests().await.len(), 2);
    let recs = records(proxy.admin_addr).await;
    assert!(
        recs.iter()
            .filter(|r| r["target"] == "primary")
            .all(|r| r.get("shadow_cut").is_none())
    );
    let text = metric_reaches(&proxy, "goodput_shadow_in_flight_requests", 0.0).await;
    for (series, want) in [
        (r#"goodput_shadow_dropped_total{reason="too_large"}"#, 1.0),
        (
            r#"goodput_shadow_requests_total{outcome="client_abort"}"#,
            1.0,
        ),
        (r#"goodput_shadow_requests_total{outcome="ok"}"#, 1.0),
        (
            r#"goodput_shadow_requests_total{outcome="upstream_reset"}"#,
            0.0,
        ),
    ] {
        assert_eq!(metric_value(&text, series), Some(want), "{series}\n{text}");
    }
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_is_in_flight_until_its_record_is_written() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script).await;
    // Headers, then nothing: the copy is under way until the candidate goes.
    let candidate = FakeUpstream::start(Script::stall_after_head()).await;
    let proxy = proxy_with(
        &primary.url(),
        &shadow_config(&candidate.url(), "timeout = \"1h\""),
    )
    .await;
    let (status, body, _) = chat(&proxy, "held").await;
    assert_eq!(status, 200);
    assert_identical(&body, &expected);
    candidate.wait_requests(1, T).await;
    metric_reaches(&proxy, "goodput_shadow_in_flight_requests", 1.0).await;
    let recs = records(proxy.admin_addr).await;
    assert!(recs.iter().all(|r| r["target"] == "primary"), "{recs:#?}");
    // The candidate goes away: the answer ends (reset) and its record is written.
    drop(candidate);
    poll_until!("the copy to be out of flight", T, {
        let text = metrics(proxy.admin_addr).await;
        let in_flight = metric_value(&text, "goodput_shadow_in_flight_requests");
        // The place is given up only after the record is written: read after the gauge,
        // the records must have it whenever the gauge says 0.
        let written = records(proxy.admin_addr)
            .await
            .into_iter()
            .any(|r| r["id"] == "held:shadow");
        assert!(in_flight == Some(1.0) || written, "{text}");
        (in_flight == Some(0.0)).then_some(())
    });
    let record = shadow_record(&proxy, "held").await;
    assert_eq!(record["outcome"], "upstream_reset", "{record:#}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn at_shutdown_every_copy_taken_is_written_or_counted() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script.clone()).await;
    // Two copies are answered; the three after them never are.
    let candidate =
        FakeUpstream::start_sequence(vec![script.clone(), script, Script::no_response()]).await;
    let proxy = proxy_with(
        &primary.url(),
        &shadow_config(&candidate.url(), "timeout = \"1h\""),
    )
    .await;
    for id in ["done-0", "done-1"] {
        let (status, body, _) = chat(&proxy, id).await;
        assert_eq!(status, 200);
        assert_identical(&body, &expected);
        shadow_record(&proxy, id).await;
    }
    for i in 0..3 {
        let (status, body, _) = chat(&proxy, &format!("open-{i}")).await;
        assert_eq!(status, 200);
        assert_identical(&body, &expected);
    }
    candidate.wait_requests(5, T).await;
    metric_reaches(&proxy, "goodput_shadow_in_flight_requests", 3.0).await;
    let (shadow, recent) = (proxy.shadow.clone(), proxy.recent.clone());
    proxy.shutdown().await;
    let written = recent
        .latest(usize::MAX)
        .iter()
        .filter(|r| r.pairing.target == goodput::measure::Target::Shadow)
        .count();
    let drops: std::collections::BTreeMap<_, _> = shadow.drops().into_iter().collect();
    assert_eq!(written, 2);
    assert_eq!(drops["shutdown"], 3, "{drops:?}");
    // Every copy taken is written or dropped for a reason that leaves no record
    // (`timeout` and `too_large` copies leave one, `in_flight` ones were never taken;
    // `answer_backlog` counts a comparison of answers given up, as the comparer stops
    // at shutdown, not a copy).
    let unwritten: u64 = drops
        .iter()
        .filter(|(r, _)| !["in_flight", "timeout", "too_large", "answer_backlog"].contains(r))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(written as u64 + unwritten, 5, "{drops:?}");
    assert_eq!(shadow.in_flight.get(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_large_candidate_does_not_hold_primary_records_up() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script).await;
    // Every copy is answered 2 MiB, 64 events per chunk: the shadow has a lot to decode
    // and to record while the primaries go on.
    let large = Script::sse_chunked(&long_events(2000), WritePlan::Coalesced(64), Duration::ZERO);
    let candidate = FakeUpstream::start(large).await;
    let extra = "max_answer_bytes = 16777216\ntimeout = \"1h\"";
    let proxy = proxy_with(&primary.url(), &shadow_config(&candidate.url(), extra)).await;
    let n = 8;
    for i in 0..n {
        let id = format!("fast-{i}");
        let (status, body, _) = chat(&proxy, &id).await;
        assert_eq!(status, 200);
        assert_identical(&body, &expected);
        // Each primary record is written while the copies are still being read.
        let record = record_of(proxy.admin_addr, &id, T).await;
        assert_eq!(record["outcome"], "ok");
    }
    // The copies are all answered and written too, in their own time.
    metric_reaches(
        &proxy,
        r#"goodput_shadow_requests_total{outcome="ok"}"#,
        n as f64,
    )
    .await;
    metric_reaches(&proxy, "goodput_shadow_in_flight_requests", 0.0).await;
    let recs = records(proxy.admin_addr).await;
    let shadows: Vec<&Value> = recs.iter().filter(|r| r["target"] == "shadow").collect();
    assert_eq!(shadows.len(), n);
    assert!(
        shadows
            .iter()
            .all(|r| r["bytes_out"].as_u64() > Some(2_000_000))
    );
    proxy.shutdown().await;
}
