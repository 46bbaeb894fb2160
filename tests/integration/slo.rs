//! SLO classes, verdicts, windows, goodput, cost and capacity through the real proxy with
//! the simulator at controlled latency: the numbers must equal hand-computed values, and
//! the capacity view must find the knee the simulator was configured to have.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::time::Duration;

use crate::common::harness::*;
use bytes::Bytes;
use goodput::{run::Running, sim::SimConfig};
use http::{Request, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

const T: Duration = Duration::from_secs(5);

async fn proxy_with(upstream: &str, toml: &str) -> Running {
    start_proxy_toml(upstream, toml).await
}

fn body(model: &str, tokens: u32) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

async fn send(proxy: &Running, model: &str, tokens: u32, headers: &[(&str, &str)]) {
    let mut req = Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .header(CONTENT_TYPE, "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body(model, tokens))))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));
}

async fn summary(proxy: &Running, window: &str) -> Value {
    let (status, text) = admin_get(
        proxy.admin_addr,
        &format!("/api/v1/summary?window={window}"),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn class<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

const CLASSES: &str = r#"
[slo]
windows = ["1m", "5m"]
[[slo.class]]
name = "fast"
match = { model = "fast-*" }
ttft_ms = 500
attainment = 0.99
[[slo.class]]
name = "slow"
match = { model = "slow-*" }
ttft_ms = 10
attainment = 0.9
[cost]
currency = "EUR"
per_hour = { hardware = 3000.0, operations = 600.0 }
"#;

#[tokio::test(flavor = "multi_thread")]
async fn attainment_goodput_and_cost_equal_hand_computed_values() {
    let (_sim, upstream) = start_sim(fast_sim(30.0, 2.0)).await;
    let proxy = proxy_with(&upstream, CLASSES).await;
    for _ in 0..4 {
        send(&proxy, "fast-model", 10, &[]).await;
        send(&proxy, "slow-model", 10, &[]).await;
    }
    send(&proxy, "other", 5, &[]).await;
    let recs = wait_records(proxy.admin_addr, 9, T).await;
    assert_eq!(recs.len(), 9);
    let slow = recs.iter().find(|r| r["model"] == "slow-model").unwrap();
    assert_eq!(
        (slow["slo_class"].as_str(), slow["slo_met"].as_bool()),
        (Some("slow"), Some(false))
    );
    assert_eq!(slow["slo_miss_reason"], "ttft");
    let fast = recs.iter().find(|r| r["model"] == "fast-model").unwrap();
    assert_eq!(
        (fast["slo_class"].as_str(), fast["slo_met"].as_bool()),
        (Some("fast"), Some(true))
    );
    assert!(fast["slo_miss_reason"].is_null());

    let s = summary(&proxy, "1m").await;
    assert_eq!(s["window"], "1m");
    let (f, sl, d) = (class(&s, "fast"), class(&s, "slow"), class(&s, "default"));
    assert_eq!(
        (f["requests"].as_u64(), f["slo_met"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(f["attainment"], 1.0);
    assert_eq!(
        (sl["requests"].as_u64(), sl["slo_met"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(sl["attainment"], 0.0);
    assert_eq!(d["attainment"], 1.0);
    let o = &s["overall"];
    assert_eq!(
        (o["requests"].as_u64(), o["slo_met"].as_u64()),
        (Some(9), Some(5))
    );
    assert!(
        (o["attainment"].as_f64().unwrap() - 5.0 / 9.0).abs() < 1e-9,
        "{o}"
    );

    // 45 effective tokens (4 × 10 fast + 5 default), 85 raw, over the reported span.
    let span = s["window_seconds"].as_f64().unwrap();
    assert!(span > 0.0 && span <= 65.0, "{span}");
    let eff = o["effective_goodput_tokens_per_s"].as_f64().unwrap();
    let raw = o["raw_output_tokens_per_s"].as_f64().unwrap();
    assert!((eff * span - 45.0).abs() < 1e-6, "{eff} × {span}");
    assert!((raw * span - 85.0).abs() < 1e-6, "{raw} × {span}");
    // 3600 EUR/h is 1 EUR/s: the window cost is the span in euros.
    let cost = &o["cost"];
    assert_eq!(cost["currency"], "EUR");
    assert!((cost["per_hour"].as_f64().unwrap() - 3600.0).abs() < 1e-9);
    let per_m = o["cost_per_million_effective_tokens"].as_f64().unwrap();
    assert!(
        (per_m - span / 45.0 * 1e6).abs() / per_m < 1e-9,
        "{per_m} vs span {span}"
    );
    let wasted = cost["wasted_share"].as_f64().unwrap();
    assert!((wasted - 40.0 / 85.0).abs() < 1e-9, "{wasted}");
    for key in ["p50", "p90", "p95", "p99", "max"] {
        let ttft = f["ttft_ms"][key].as_f64().unwrap();
        assert!((30.0..60.0).contains(&ttft), "fast ttft {key} = {ttft}");
        assert!(o["tpot_ms"][key].as_f64().is_some() && o["e2e_ms"][key].as_f64().is_some());
    }

    // The same numbers reach Prometheus, with bounded labels.
    let text = metrics(proxy.admin_addr).await;
    let v = |series: &str| metric_value(&text, series);
    assert_eq!(
        v(r#"goodput_output_tokens_total{class="fast",slo="met"}"#),
        Some(40.0),
        "{text}"
    );
    assert_eq!(
        v(r#"goodput_output_tokens_total{class="slow",slo="missed"}"#),
        Some(40.0)
    );
    assert_eq!(
        v(
            r#"goodput_requests_total{model="slow-model",api="chat_completions",outcome="ok",class="slow",slo="missed",status_class="2xx"}"#
        ),
        Some(4.0)
    );
    assert_eq!(
        v(r#"goodput_slo_attainment_target_ratio{class="slow"}"#),
        Some(0.9)
    );
    assert_eq!(v(r#"goodput_cost_per_hour{currency="EUR"}"#), Some(3600.0));
    // Windowed gauges are refreshed every second.
    poll_loop!(deadline = tokio::time::Instant::now() + T, {
        let text = metrics(proxy.admin_addr).await;
        let fast = metric_value(
            &text,
            r#"goodput_slo_attainment_ratio{class="fast",window="1m",target="primary"}"#,
        );
        let slow = metric_value(
            &text,
            r#"goodput_slo_attainment_ratio{class="slow",window="5m",target="primary"}"#,
        );
        let cost = metric_value(
            &text,
            r#"goodput_cost_per_million_effective_tokens{window="1m",currency="EUR"}"#,
        );
        if fast == Some(1.0) && slow == Some(0.0) && cost.is_some() {
            assert!(
                metric_value(
                    &text,
                    r#"goodput_effective_output_tokens_per_second{class="fast",window="1m",target="primary"}"#
                )
                .unwrap()
                    > 0.0
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gauges never refreshed:\n{text}"
        );
    });
    let (status, _) = admin_get(proxy.admin_addr, "/api/v1/summary?window=7m").await;
    assert_eq!(status, 400);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn override_headers_and_tenants_pick_targets_and_classes() {
    let (_sim, upstream) = start_sim(fast_sim(20.0, 1.0)).await;
    let toml = r#"
[slo]
override_headers = true
tenant_header = "x-tenant"
[[slo.class]]
name = "tenant-a"
match = { tenant = "acme" }
ttft_ms = 1000
"#;
    let proxy = proxy_with(&upstream, toml).await;
    send(&proxy, "m", 3, &[("x-tenant", "acme")]).await;
    send(
        &proxy,
        "m",
        3,
        &[("x-tenant", "acme"), ("x-slo-ttft-ms", "5")],
    )
    .await;
    send(&proxy, "m", 3, &[("x-tenant", "other")]).await;
    let recs = wait_records(proxy.admin_addr, 3, T).await;
    let got: Vec<(&str, Option<bool>)> = recs
        .iter()
        .map(|r| (r["slo_class"].as_str().unwrap(), r["slo_met"].as_bool()))
        .collect();
    assert_eq!(
        got,
        [
            ("tenant-a", Some(true)),
            ("tenant-a", Some(false)),
            ("default", Some(true))
        ]
    );
    assert_eq!(recs[1]["slo_miss_reason"], "ttft");
    // The tenant value itself is never exposed: only its class.
    let text = metrics(proxy.admin_addr).await;
    assert!(
        text.contains("class=\"tenant-a\"") && !text.contains("acme"),
        "{text}"
    );
    let api = admin_get(proxy.admin_addr, "/api/v1/requests").await.1;
    assert!(!api.contains("acme") && !api.contains("other\""), "{api}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_finds_the_knee_the_simulator_has() {
    // Above 3 requests in flight every latency grows fivefold, ninefold, ...: 20 ms TTFT
    // becomes 100 ms at 4 in flight, past the 80 ms target, while up to 3 in flight are
    // 60 ms inside it (a loaded machine's delays must not make them miss it).
    let (_sim, upstream) = start_sim(SimConfig {
        concurrency_knee: Some(3),
        slowdown_per_request: 4.0,
        ..fast_sim(20.0, 2.0)
    })
    .await;
    let toml = r#"
[slo]
windows = ["1m"]
min_samples = 10
[[slo.class]]
name = "chat"
match = { api = "chat" }
ttft_ms = 80
attainment = 0.9
"#;
    let proxy = std::sync::Arc::new(proxy_with(&upstream, toml).await);
    for level in 1..=6usize {
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..level {
            let proxy = proxy.clone();
            workers.spawn(async move {
                for _ in 0..14 {
                    send(&proxy, "m", 5, &[]).await;
                }
            });
        }
        while workers.join_next().await.is_some() {}
    }
    let (status, text) = admin_get(proxy.admin_addr, "/api/v1/capacity?class=chat").await;
    assert_eq!(status, 200, "{text}");
    let c: Value = serde_json::from_str(&text).unwrap();
    let stable = c["max_stable_concurrency"].as_u64();
    // The knee is at 3: never stable above it. A loaded machine can only slow the
    // simulator's answers further, so a lower level is allowed, not a higher one.
    assert!(
        matches!(stable, Some(1..=3)),
        "max stable {stable:?} in {c}"
    );
    let levels = c["levels"].as_array().unwrap();
    let level = |n: u64| levels.iter().find(|l| l["concurrency"] == n).unwrap();
    assert_eq!(level(1)["stable"], true);
    assert_eq!(level(6)["stable"], false, "{c}");
    assert!(level(6)["attainment"].as_f64().unwrap() < 0.5, "{c}");
    assert!(level(6)["ttft_p95_ms"].as_f64().unwrap() > 80.0, "{c}");
    let s = summary(&proxy, "1m").await;
    assert_eq!(class(&s, "chat")["max_stable_concurrency"].as_u64(), stable);
    let (status, _) = admin_get(proxy.admin_addr, "/api/v1/capacity?class=nope").await;
    assert_eq!(status, 404);
}
