//! Operational truth through the real proxy: traffic that is no generation (metrics
//! scrapes, model lists, health probes) passes through without touching the SLO views or
//! the profile; upstream statuses land in the right outcome (a 401 is the client's, a 429
//! is a rejection and a miss); misses and finish reasons are counted by why.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::{path::Path, time::Duration};

use crate::common::{
    fake::{FakeUpstream, Script, WritePlan, openai_chat_events},
    harness::*,
    temp::TempDir,
};
use bytes::Bytes;
use goodput::{
    config::{self, Overrides},
    run::Running,
};
use http::{Request, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Empty, Full};
use serde_json::Value;

const T: Duration = Duration::from_secs(5);

async fn proxy_with(upstream: &str, toml: &str) -> Running {
    start_proxy_toml(upstream, toml).await
}

async fn chat(proxy: &Running, tokens: u32) -> u16 {
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req = Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

async fn get(proxy: &Running, path: &str) -> u16 {
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let req = Request::get(format!("http://{}{path}", proxy.proxy_addr))
        .body(Empty::new())
        .unwrap();
    let resp = c.request(req).await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

async fn summary(proxy: &Running) -> Value {
    let (status, text) = admin_get(proxy.admin_addr, "/api/v1/summary?window=1m").await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn profile_lines(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "jsonl") {
            let text = std::fs::read_to_string(&path).unwrap();
            // The first line is the header; `blocks` lines carry no request.
            out.extend(
                text.lines()
                    .skip(1)
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .filter(|l| l.get("type").is_none()),
            );
        }
    }
    out
}

/// The sum of every sample of a metric family whose line contains all of `needles`.
fn metric_sum(text: &str, name: &str, needles: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn scrapes_and_probes_pass_through_without_touching_slo_views_or_profiles() {
    let (_sim, upstream) = start_sim(fast_sim(2.0, 0.5)).await;
    let tmp = TempDir::new("passthrough");
    let toml = format!(
        "[slo]\nwindows = [\"1m\"]\n[[slo.class]]\nname = \"interactive\"\nttft_ms = 5000\n[profile]\ndir = \"{}\"\n",
        tmp.path().display()
    );
    let proxy = proxy_with(&upstream, &toml).await;
    for _ in 0..3 {
        assert_eq!(chat(&proxy, 8).await, 200);
    }
    for _ in 0..4 {
        assert_eq!(get(&proxy, "/metrics").await, 200);
    }
    assert_eq!(get(&proxy, "/v1/models").await, 200);
    assert_eq!(get(&proxy, "/health").await, 200);
    assert_eq!(get(&proxy, "/no/such/path").await, 404);
    let recs = wait_records(proxy.admin_addr, 10, T).await;
    assert_eq!(recs.len(), 10);
    // Passed-through requests keep their record, with no class and no verdict.
    let unknown: Vec<&Value> = recs.iter().filter(|r| r["api"] == "unknown").collect();
    assert_eq!(unknown.len(), 7);
    for r in &unknown {
        assert_eq!(
            (r["slo_class"].as_str(), r["slo_met"].as_bool()),
            (Some(""), None),
            "{r}"
        );
    }
    // The SLO views count the three chats and nothing else.
    let s = summary(&proxy).await;
    assert_eq!(s["overall"]["requests"], 3, "{s}");
    assert_eq!(s["overall"]["slo_met"], 3, "{s}");
    let interactive = s["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "interactive")
        .unwrap();
    assert_eq!(interactive["requests"], 3);
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_sum(
            &text,
            "goodput_passthrough_requests_total",
            &["api=\"unknown\""]
        ),
        7.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(
            &text,
            "goodput_passthrough_requests_total",
            &["status_class=\"4xx\""]
        ),
        1.0
    );
    assert_eq!(metric_sum(&text, "goodput_requests_total", &[]), 3.0);
    assert_eq!(
        metric_sum(&text, "goodput_requests_total", &["api=\"unknown\""]),
        0.0
    );
    proxy.shutdown().await;
    // The profile holds the chats only.
    let lines = profile_lines(tmp.path());
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| l["api"] == "chat_completions"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_may_opt_in_to_unknown_traffic() {
    let (_sim, upstream) = start_sim(fast_sim(2.0, 0.5)).await;
    let toml = "[slo]\nwindows = [\"1m\"]\n[[slo.class]]\nname = \"probes\"\nmatch = { api = \"unknown\" }\ne2e_ms = 10000\n";
    let proxy = proxy_with(&upstream, toml).await;
    assert_eq!(get(&proxy, "/v1/models").await, 200);
    let recs = wait_records(proxy.admin_addr, 1, T).await;
    assert_eq!(recs[0]["slo_class"], "probes");
    assert_eq!(recs[0]["slo_met"], true);
    let s = summary(&proxy).await;
    assert_eq!(s["overall"]["requests"], 1, "{s}");
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_sum(&text, "goodput_passthrough_requests_total", &[]),
        0.0
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_401_is_the_clients_and_a_429_is_a_rejection_and_a_miss() {
    let error = br#"{"error":{"message":"no","type":"x"}}"#;
    let json = [("content-type", "application/json")];
    let up = FakeUpstream::start_sequence(vec![
        Script::sse_chunked(
            &openai_chat_events(5, true),
            WritePlan::Whole,
            Duration::ZERO,
        ),
        Script::response(401, &json, error),
        Script::response(429, &json, error),
        Script::response(503, &json, error),
        Script::response(500, &json, error),
    ])
    .await;
    let proxy = proxy_with(&up.url(), "[slo]\nwindows = [\"1m\"]\n").await;
    for want in [200, 401, 429, 503, 500] {
        assert_eq!(chat(&proxy, 5).await, want);
    }
    let recs = wait_records(proxy.admin_addr, 5, T).await;
    let outcomes: Vec<&str> = recs
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        [
            "ok",
            "client_error",
            "rejected",
            "rejected",
            "upstream_error"
        ]
    );
    assert_eq!(recs[1]["slo_met"], Value::Null);
    assert_eq!(recs[2]["slo_met"], false);
    let s = summary(&proxy).await;
    let o = &s["overall"];
    assert_eq!(o["requests"], 5, "{s}");
    // The 401 has no verdict: 1 met of 4 judged.
    assert_eq!(
        (o["slo_met"].as_u64(), o["slo_missed"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(o["attainment"], 0.25);
    assert_eq!(o["rejection_rate"], 0.4);
    assert_eq!(o["error_rate"], 0.2);
    assert_eq!(o["client_error_rate"], 0.2);
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_sum(
            &text,
            "goodput_requests_total",
            &[
                "outcome=\"client_error\"",
                "slo=\"excluded\"",
                "status_class=\"4xx\""
            ]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(
            &text,
            "goodput_requests_total",
            &["outcome=\"rejected\"", "slo=\"missed\""]
        ),
        2.0
    );
    assert_eq!(
        metric_sum(&text, "goodput_requests_total", &["status_class=\"2xx\""]),
        1.0
    );
    // Why the misses happened, and how the one answer finished.
    let misses = |reason: &str| {
        metric_sum(
            &text,
            "goodput_slo_misses_total",
            &["class=\"default\"", &format!("reason=\"{reason}\"")],
        )
    };
    assert_eq!((misses("rejected"), misses("upstream_error")), (2.0, 1.0));
    assert_eq!(
        metric_sum(
            &text,
            "goodput_finish_reasons_total",
            &["class=\"default\"", "reason=\"stop\""]
        ),
        1.0
    );
    assert_eq!(o["miss_reasons"]["rejected"], 2);
    assert_eq!(o["miss_reasons"]["upstream_error"], 1);
    assert_eq!(o["finish_reasons"]["stop"], 1);
    assert_eq!(o["truncation_rate"], 0.0);
    assert_eq!(recs[0]["finish_reason"], "stop");
    assert_eq!(o["input_tokens"], 7);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn configured_client_error_statuses_and_error_rate_max() {
    let error = br#"{"error":{"message":"no","type":"x"}}"#;
    let json = [("content-type", "application/json")];
    let up = FakeUpstream::start_sequence(vec![
        Script::response(409, &json, error),
        Script::response(401, &json, error),
    ])
    .await;
    let toml = "[slo]\nwindows = [\"1m\"]\nclient_error_statuses = [409]\n[slo.default]\nerror_rate_max = 0.1\n";
    let proxy = proxy_with(&up.url(), toml).await;
    assert_eq!(chat(&proxy, 5).await, 409);
    assert_eq!(chat(&proxy, 5).await, 401);
    let recs = wait_records(proxy.admin_addr, 2, T).await;
    let outcomes: Vec<&str> = recs
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["client_error", "upstream_error"]);
    let s = summary(&proxy).await;
    let default = &s["classes"][0];
    assert_eq!(default["name"], "default");
    assert_eq!(default["error_rate"], 0.5);
    assert_eq!(default["error_rate_max"], 0.1);
    assert_eq!(default["error_rate_holds"], false);
    proxy.shutdown().await;
}

/// The example config documents every `[slo]` and `[cost]` key, and the commented-out
/// examples there are valid when uncommented.
#[test]
fn the_example_config_documents_every_slo_and_cost_key() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/goodput.example.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let overrides = Overrides::default();
    config::load_str(&text, "example", &overrides).unwrap();
    let start = text.find("\n[slo]\n").unwrap();
    let end = text.find("\n[tokenizer]\n").unwrap();
    let section = &text[start..end];
    for key in [
        "windows",
        "tenant_header",
        "tenant_salt",
        "override_headers",
        "min_samples",
        "input_buckets",
        "history",
        "long_input_bytes",
        "client_error_statuses",
        "[[slo.class]]",
        "name",
        "match",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
        "attainment",
        "error_rate_max",
        "percentiles",
        "[slo.default]",
        "[cost]",
        "currency",
        "per_hour",
        "one_time",
        "amortize_months",
        "kw",
        "energy_price_per_kwh",
        "idle_share",
        "failure_share",
    ] {
        let documented = section.lines().any(|l| {
            let l = l.trim_start_matches(['#', ' ']);
            l.starts_with(&format!("{key} =")) || l == key
        });
        assert!(
            documented,
            "{key} is not in the example's [slo] / [cost] part"
        );
    }
    // Uncommented, the examples load.
    let uncommented: String = section
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if is_toml_line(rest) => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let with_upstream = Overrides {
        upstream: Some("http://127.0.0.1:9".into()),
        ..Overrides::default()
    };
    let cfg = config::load_str(&uncommented, "example-slo", &with_upstream).unwrap();
    assert_eq!(cfg.slo.classes[0].error_rate_max, Some(0.01));
    assert_eq!(
        cfg.slo.client_error_statuses,
        [400, 401, 403, 404, 413, 422]
    );
    assert!(cfg.cost.is_some());
}

/// A commented-out example line: `key = value` or `[section]`.
fn is_toml_line(l: &str) -> bool {
    let key = |k: &str| {
        !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    (l.starts_with('[') && l.ends_with(']') && !l.contains(' '))
        || l.split_once(" = ").is_some_and(|(k, _)| key(k))
}

#[tokio::test(flavor = "multi_thread")]
async fn embeddings_are_recognised_measured_and_not_judged() {
    let body = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"e5","usage":{"prompt_tokens":8,"total_tokens":8}}"#;
    let up = FakeUpstream::start(Script::response(
        200,
        &[("content-type", "application/json")],
        body,
    ))
    .await;
    let proxy = proxy_with(&up.url(), "[slo]\nwindows = [\"1m\"]\n").await;
    let req = Request::post(format!("http://{}/v1/embeddings", proxy.proxy_addr))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"e5","input":"hello"}"#,
        )))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .as_ref(),
        body
    );
    let recs = wait_records(proxy.admin_addr, 1, T).await;
    let r = &recs[0];
    assert_eq!(
        (r["api"].as_str(), r["model"].as_str()),
        (Some("embeddings"), Some("e5"))
    );
    assert_eq!(
        (r["input_tokens"].as_u64(), r["output_tokens"].as_u64()),
        (Some(8), None)
    );
    assert_eq!(r["slo_met"], Value::Null);
    assert_eq!(summary(&proxy).await["overall"]["requests"], 0);
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_sum(
            &text,
            "goodput_passthrough_requests_total",
            &["api=\"embeddings\"", "status_class=\"2xx\""]
        ),
        1.0,
        "{text}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn cached_input_tokens_reach_the_record_and_split_ttft_by_cache() {
    let chunk = |json: &str| format!("data: {json}\n\n").into_bytes();
    let events = vec![
        chunk(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#),
        chunk(r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#),
        chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":1,"total_tokens":129,"prompt_tokens_details":{"cached_tokens":96}}}"#,
        ),
        b"data: [DONE]\n\n".to_vec(),
    ];
    let up = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = proxy_with(&up.url(), "[slo]\nwindows = [\"1m\"]\n").await;
    assert_eq!(chat(&proxy, 1).await, 200);
    let recs = wait_records(proxy.admin_addr, 1, T).await;
    assert_eq!(recs[0]["cached_input_tokens"], 96, "{}", recs[0]);
    assert_eq!(recs[0]["input_tokens"], 128);
    let s = summary(&proxy).await;
    let by_cache = &s["overall"]["ttft_ms_by_cache"];
    assert_eq!(
        (
            by_cache["hit"]["count"].as_u64(),
            by_cache["miss"]["count"].as_u64()
        ),
        (Some(1), Some(0)),
        "{s}"
    );
    proxy.shutdown().await;
}

/// Waits for the in-flight gauge to read `want`; returns what it read last.
async fn in_flight_becomes(proxy: &Running, want: f64) -> Option<f64> {
    poll_loop!(deadline = tokio::time::Instant::now() + T, {
        let seen = metric_value(
            &metrics(proxy.admin_addr).await,
            "goodput_in_flight_requests",
        );
        if seen == Some(want) || tokio::time::Instant::now() >= deadline {
            return seen;
        }
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn the_in_flight_gauge_counts_generation_requests_only() {
    // Every answer is a head and then nothing: each request stays open until dropped.
    let up = FakeUpstream::start(crate::common::fake::Script::stall_after_head()).await;
    let proxy = proxy_with(&up.url(), "").await;
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let probe = c
        .request(
            Request::get(format!("http://{}/health", proxy.proxy_addr))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    // The probe's head came back through the proxy: it is being served, yet not counted.
    assert_eq!(probe.status(), 200);
    assert_eq!(in_flight_becomes(&proxy, 0.0).await, Some(0.0));
    let chat = post(
        &client(),
        &format!("http://{}/v1/chat/completions", proxy.proxy_addr),
        chat_body(true, 8, true),
    )
    .await;
    assert_eq!(chat.status(), 200);
    assert_eq!(in_flight_becomes(&proxy, 1.0).await, Some(1.0));
    // A probe ending changes nothing; the chat ending brings the gauge back to zero.
    drop(probe);
    let recs = wait_records(proxy.admin_addr, 1, T).await;
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["api"], "unknown");
    assert_eq!(in_flight_becomes(&proxy, 1.0).await, Some(1.0));
    drop(chat);
    assert_eq!(wait_records(proxy.admin_addr, 2, T).await.len(), 2);
    assert_eq!(in_flight_becomes(&proxy, 0.0).await, Some(0.0));
    proxy.shutdown().await;
}
