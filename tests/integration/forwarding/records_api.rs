//! Metrics and the records API, read as a user would.

use super::*;

/// The contract field set of a record (the records API), then the fields later
/// capabilities added (TTFO from the dialects; the SLO verdict; the finish reason; whether
/// the terminal event was delivered).
const RECORD_FIELDS: [&str; 36] = [
    "id",
    "slo_miss_component",
    "slo_source",
    "engine_queue_ms",
    "engine_prefill_ms",
    "engine_decode_ms",
    "engine_inference_ms",
    "outside_engine_ms",
    "engine_timing_source",
    "clock",
    "started_at",
    "model",
    "api",
    "stream",
    "status",
    "outcome",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "upload_ms",
    "ttft_after_upload_ms",
    "e2e_after_upload_ms",
    "itl_ms",
    "input_tokens",
    "input_tokens_source",
    "cached_input_tokens",
    "output_tokens",
    "output_tokens_source",
    "events",
    "bytes_out",
    "terminal_event",
    "ttfo_ms",
    "slo_class",
    "slo_met",
    "slo_miss_reason",
    "finish_reason",
];

#[tokio::test]
async fn metrics_and_records_api_agree_with_the_traffic() {
    let (sim, upstream) = start_sim(fast_sim(5.0, 2.0)).await;
    let proxy = start_proxy(&upstream).await;
    let chat = url(&proxy, "/v1/chat/completions");
    let before = SystemTime::now();
    for i in 0..3 {
        let id = format!("m{i}");
        let (status, _, _) = collect(send_json(&chat, &id, chat_body(true, 4, true)).await).await;
        assert_eq!(status, 200);
    }
    let recs = wait_records(proxy.admin_addr, 3, T).await;
    assert_eq!(recs.len(), 3);

    let (status, content_type, text) = admin_get_typed(proxy.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
    let value = |series: &str| metric_value(&text, series);
    let labels = r#"{model="test-model",api="chat_completions",class="default"}"#;
    assert_eq!(
        value(
            r#"goodput_requests_total{model="test-model",api="chat_completions",outcome="ok",class="default",slo="met",status_class="2xx"}"#
        ),
        Some(3.0),
        "{text}"
    );
    for family in [
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "gen_ai_server_request_duration_seconds",
    ] {
        assert_eq!(
            value(&format!("{family}_count{labels}")),
            Some(3.0),
            "{family}"
        );
    }
    // 4 single-token events per stream: 3 gaps each.
    assert_eq!(
        value(&format!(
            "goodput_inter_token_latency_seconds_count{labels}"
        )),
        Some(9.0)
    );
    let ttft_sum = value(&format!(
        "gen_ai_server_time_to_first_token_seconds_sum{labels}"
    ))
    .unwrap();
    let recorded_ttft: f64 = recs.iter().filter_map(|r| num(r, "ttft_ms")).sum();
    assert!(
        (ttft_sum * 1000.0 - recorded_ttft).abs() < 0.1,
        "{ttft_sum} vs {recorded_ttft}"
    );
    assert!(
        ttft_sum >= 3.0 * 0.005,
        "three TTFTs of at least 5 ms: {ttft_sum}"
    );

    let tokens = |kind: &str, what: &str| {
        value(&format!(
            r#"gen_ai_client_token_usage_{what}{{model="test-model",api="chat_completions",class="default",gen_ai_token_type="{kind}"}}"#
        ))
    };
    let prompt_total: u64 = sim.truth().iter().map(|t| t.prompt_tokens).sum();
    assert_eq!(tokens("input", "count"), Some(3.0), "{text}");
    assert_eq!(tokens("input", "sum"), Some(prompt_total as f64));
    assert_eq!(tokens("output", "count"), Some(3.0));
    assert_eq!(tokens("output", "sum"), Some(12.0));
    assert!(text.contains("# TYPE goodput_in_flight_requests gauge"));
    assert_eq!(value("goodput_in_flight_requests"), Some(0.0));
    assert_eq!(value("goodput_measurement_dropped_total"), Some(0.0));

    let (status, content_type, body) =
        admin_get_typed(proxy.admin_addr, "/api/v1/requests?limit=1").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let v: Value = serde_json::from_str(&body).unwrap();
    let list = v["requests"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    let r = &list[0];
    assert_eq!(r["id"], "m2", "newest last");
    let keys: BTreeSet<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, RECORD_FIELDS.into_iter().collect::<BTreeSet<_>>());
    assert!(
        ["kernel", "user"].contains(&r["clock"].as_str().unwrap()),
        "{r}"
    );
    let itl_keys: BTreeSet<&str> = r["itl_ms"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(itl_keys, BTreeSet::from(["p50", "p95", "max"]));
    let started = humantime::parse_rfc3339(r["started_at"].as_str().unwrap()).unwrap();
    let skew = Duration::from_secs(1);
    assert!(
        started + skew >= before && started <= SystemTime::now(),
        "started_at {} is not this request's arrival",
        r["started_at"]
    );
    assert_eq!(r["output_tokens"], 4);
    proxy.shutdown().await;
}
