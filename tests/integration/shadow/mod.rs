//! Shadow acceptance through the real proxy: a candidate receives a copy of every
//! generation request (`share = 1.0`) and is judged beside the primary, while the client
//! gets exactly the primary's bytes, never waits for the candidate, and never fails
//! because of it.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use goodput::run::Running;
use http::{Request, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::common::{
    fake::{FakeUpstream, SSE_HEAD, Script, Step, WritePlan, http_chunk, openai_chat_events},
    harness::*,
};

const T: Duration = Duration::from_secs(10);

async fn proxy_with(upstream: &str, toml: &str) -> Running {
    start_proxy_toml(upstream, toml).await
}

/// One class of 300 ms TTFT, a verdict from 6 pairs, and the candidate at `candidate`.
fn shadow_config(candidate: &str, extra: &str) -> String {
    format!(
        r#"
[slo]
min_samples = 6
[[slo.class]]
name = "interactive"
match = {{ api = "chat" }}
ttft_ms = 300
attainment = 0.9
[shadow]
url = "{candidate}"
share = 1.0
{extra}
"#
    )
}

/// A streamed chat request with a credential and a cookie; returns the status, the whole
/// body and when its last byte arrived.
async fn chat(proxy: &Running, id: &str) -> (u16, Bytes, Instant) {
    chat_at(proxy.proxy_addr, id).await
}

async fn chat_at(addr: std::net::SocketAddr, id: &str) -> (u16, Bytes, Instant) {
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(CONTENT_TYPE, "application/json")
        .header("authorization", "Bearer CLIENT-SECRET")
        .header("cookie", "session=CLIENT-COOKIE")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(chat_body(true, 8, true))))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body, Instant::now())
}

async fn shadow_report(proxy: &Running) -> Value {
    let (status, text) = admin_get(proxy.admin_addr, "/api/v1/shadow?window=1h").await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Polls the report until `done` holds (records are finished off the data path).
async fn report_when(proxy: &Running, done: impl Fn(&Value) -> bool) -> Value {
    poll_until!("the shadow report to be ready", T, {
        let report = shadow_report(proxy).await;
        done(&report).then_some(report)
    })
}

fn pairs(report: &Value) -> u64 {
    report["classes"][0]["shadow"]["requests"]
        .as_u64()
        .unwrap_or(0)
}

/// Polls `/metrics` until `series` reaches `want`.
async fn metric_reaches(proxy: &Running, series: &str, want: f64) -> String {
    poll_until!(format!("{series} to reach {want}"), T, {
        let text = metrics(proxy.admin_addr).await;
        (metric_value(&text, series) == Some(want)).then_some(text)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_candidate_fails_beside_a_fast_primary_without_slowing_it() {
    let (_primary, upstream) = start_sim(fast_sim(30.0, 1.0)).await;
    let (candidate, candidate_url) = start_sim(fast_sim(600.0, 1.0)).await;
    let proxy = proxy_with(&upstream, &shadow_config(&candidate_url, "")).await;
    let n = 6;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let addr = proxy.proxy_addr;
        tasks.spawn(async move { (i, chat_at(addr, &format!("req-{i}")).await) });
    }
    let mut answers = tasks.join_all().await;
    answers.sort_by_key(|(i, _)| *i);
    let answers: Vec<_> = answers.into_iter().map(|(_, a)| a).collect();
    let report = report_when(&proxy, |r| pairs(r) >= n).await;
    // Every client stream ended before the candidate had produced its first token: the
    // client never waited for the copy.
    let truth = candidate.truth();
    for (i, (status, body, done)) in answers.iter().enumerate() {
        assert_eq!(*status, 200);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
        let id = format!("req-{i}");
        let copy = truth
            .iter()
            .find(|t| t.request_id.as_deref() == Some(&id))
            .unwrap_or_else(|| panic!("the candidate got no copy of {id}"));
        assert!(*done < copy.first_token_at.unwrap(), "{id} waited");
    }
    let class = &report["classes"][0];
    assert_eq!(class["class"], "interactive");
    assert_eq!(class["primary"]["attainment"], 1.0, "{report:#}");
    assert_eq!(class["shadow"]["attainment"], 0.0, "{report:#}");
    assert_eq!(class["verdict"], "fail");
    assert!(class["rule"].as_str().unwrap().contains("min_samples"));
    assert_eq!(class["ttft_ratio"]["pairs"], n);
    let median = class["ttft_ratio"]["median"]["value"].as_f64().unwrap();
    assert!(median > 1.0, "{report:#}");
    let ci = class["ttft_ratio"]["median"]["ci95"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= median && median <= ci[1].as_f64().unwrap());
    // The paired shift: every copy's first token came later than every primary's (600 ms
    // against 30), so the whole interval is above 0 and the two samples are told apart
    // (fully separated, 6 and 6: p ≈ 0.005). No secondary, so no spread beside it.
    let shift = &class["ttft_shift"]["candidate"];
    assert_eq!(shift["pairs"], n, "{report:#}");
    let (lo, hi) = (
        shift["ci95"][0].as_f64().unwrap(),
        shift["ci95"][1].as_f64().unwrap(),
    );
    let hl = shift["shift_ms"].as_f64().unwrap();
    assert!(0.0 < lo && lo <= hl && hl <= hi, "{report:#}");
    assert!(shift["p_value"].as_f64().unwrap() < 0.01, "{report:#}");
    assert!(class["ttft_shift"]["secondary"].is_null());
    assert_eq!(class["tpot_shift"]["candidate"]["pairs"], n);
    // Shadow records are paired, and kept out of the primary's numbers.
    let recs = records(proxy.admin_addr).await;
    let shadows: Vec<&Value> = recs.iter().filter(|r| r["target"] == "shadow").collect();
    assert_eq!(shadows.len(), n as usize);
    assert!(
        shadows
            .iter()
            .all(|r| r["pair_id"].as_str().unwrap().starts_with("req-"))
    );
    assert!(shadows.iter().all(|r| r["slo_met"] == false));
    let primaries = recs.iter().filter(|r| r["target"] == "primary").count();
    assert_eq!(primaries, n as usize);
    metric_reaches(
        &proxy,
        r#"goodput_shadow_requests_total{outcome="ok"}"#,
        n as f64,
    )
    .await;
    // The attainment gauges carry both, told apart by `target`.
    let text = metric_reaches(
        &proxy,
        r#"goodput_slo_attainment_ratio{class="interactive",window="5m",target="shadow"}"#,
        0.0,
    )
    .await;
    assert_eq!(
        metric_value(
            &text,
            r#"goodput_slo_attainment_ratio{class="interactive",window="5m",target="primary"}"#
        ),
        Some(1.0),
        "{text}"
    );
    proxy.shutdown().await;
}

/// The SSE events the fake primary sends, and the bytes a client must receive.
fn primary_script() -> (Script, Vec<u8>) {
    let events = openai_chat_events(4, true);
    let expected: Vec<u8> = events.concat();
    (
        Script::sse_chunked(&events, WritePlan::Whole, Duration::ZERO),
        expected,
    )
}

/// The body of a chunked response, decoded by the client.
fn assert_identical(body: &Bytes, expected: &[u8]) {
    assert_eq!(
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(expected)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_copy_carries_the_body_but_not_the_clients_credentials() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script.clone()).await;
    let candidate = FakeUpstream::start(script).await;
    let extra = "auth_header = \"Bearer CANDIDATE-KEY\"\nmodel = \"candidate-model\"";
    let proxy = proxy_with(&primary.url(), &shadow_config(&candidate.url(), extra)).await;
    let (status, body, _) = chat(&proxy, "copy-1").await;
    assert_eq!(status, 200);
    assert_identical(&body, &expected);
    // Only generation is mirrored: a model list goes to the primary alone.
    let (status, _) = admin_get(proxy.proxy_addr, "/v1/models").await;
    assert_eq!(status, 200);
    let copies = candidate.wait_requests(1, T).await;
    let copy = &copies[0];
    assert_eq!(copy.target, "/v1/chat/completions");
    assert_eq!(copy.header("authorization"), Some("Bearer CANDIDATE-KEY"));
    assert_eq!(copy.header("cookie"), None);
    assert_eq!(copy.header("x-request-id"), Some("copy-1"));
    let sent: Value = serde_json::from_slice(&copy.body).unwrap();
    let original: Value = serde_json::from_str(&chat_body(true, 8, true)).unwrap();
    assert_eq!(sent["model"], "candidate-model");
    assert_eq!(sent["messages"], original["messages"]);
    let at_primary = primary.wait_requests(2, T).await;
    assert_eq!(
        at_primary[0].header("authorization"),
        Some("Bearer CLIENT-SECRET")
    );
    // The shadow record names the client's model, so it is held to the primary's class.
    let recs = wait_records(proxy.admin_addr, 3, T).await;
    let shadow = recs.iter().find(|r| r["target"] == "shadow").unwrap();
    assert_eq!(shadow["pair_id"], "copy-1");
    assert_eq!(shadow["model"], "test-model");
    assert_eq!(shadow["slo_class"], "interactive");
    assert_eq!(candidate.requests().await.len(), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_candidate_gone_every_request_succeeds_and_drops_are_counted() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script).await;
    // A port that was bound and released: connections to it are refused.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let proxy = proxy_with(&primary.url(), &shadow_config(&gone, "")).await;
    for i in 0..5 {
        let (status, body, _) = chat(&proxy, &format!("gone-{i}")).await;
        assert_eq!(status, 200);
        assert_identical(&body, &expected);
    }
    metric_reaches(
        &proxy,
        r#"goodput_shadow_dropped_total{reason="unreachable"}"#,
        5.0,
    )
    .await;
    let report = shadow_report(&proxy).await;
    assert_eq!(report["dropped"]["unreachable"], 5);
    assert_eq!(report["classes"].as_array().unwrap().len(), 0);
    let recs = wait_records(proxy.admin_addr, 5, T).await;
    assert!(
        recs.iter()
            .all(|r| r["target"] == "primary" && r["outcome"] == "ok")
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_past_max_in_flight_are_dropped_not_queued() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script).await;
    // A candidate that answers nothing: each copy holds its place until the timeout.
    let candidate = FakeUpstream::start(Script::no_response()).await;
    let extra = "max_in_flight = 2\ntimeout = \"1h\"";
    let toml = format!(
        "{}\n[measure]\nrequest_inspect_limit = 1000\n",
        shadow_config(&candidate.url(), extra)
    );
    let proxy = proxy_with(&primary.url(), &toml).await;
    for i in 0..2 {
        let (status, body, _) = chat(&proxy, &format!("held-{i}")).await;
        assert_eq!(status, 200);
        assert_identical(&body, &expected);
    }
    // Both places are taken once the candidate has both copies.
    candidate.wait_requests(2, T).await;
    for i in 0..3 {
        let (status, body, _) = chat(&proxy, &format!("over-{i}")).await;
        assert_eq!(status, 200);
        assert_identical(&body, &expected);
    }
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_value(&text, r#"goodput_shadow_dropped_total{reason="in_flight"}"#),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "goodput_shadow_in_flight_requests"),
        Some(2.0)
    );
    assert_eq!(candidate.requests().await.len(), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_inspection_limit_is_not_mirrored() {
    let (script, expected) = primary_script();
    let primary = FakeUpstream::start(script.clone()).await;
    let candidate = FakeUpstream::start(script).await;
    let toml = format!(
        "{}\n[measure]\nrequest_inspect_limit = 64\n",
        shadow_config(&candidate.url(), "")
    );
    let proxy = proxy_with(&primary.url(), &toml).await;
    let (status, body, _) = chat(&proxy, "large").await;
    assert_eq!(status, 200);
    assert_identical(&body, &expected);
    metric_reaches(
        &proxy,
        r#"goodput_shadow_dropped_total{reason="body_too_large"}"#,
        1.0,
    )
    .await;
    assert!(candidate.requests().await.is_empty());
    proxy.shutdown().await;
}

/// A baseline of `n` short answers (8 output tokens), as a profile file.
fn short_baseline(n: usize) -> String {
    let mut text = String::from(
        r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-12-02T15:30:00.000Z","salt_id":"0000000000000000","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#,
    );
    for i in 0..n {
        text.push_str(&format!(
            "\n{{\"t_ms\":{},\"model\":\"test-model\",\"api\":\"chat_completions\",\"stream\":true,\"input_tokens\":12,\"input_tokens_source\":\"usage\",\"output_tokens\":8,\"output_tokens_source\":\"usage\",\"max_tokens\":8,\"outcome\":\"ok\",\"status\":200,\"slo_class\":\"interactive\",\"slo_met\":true,\"ttft_ms\":30.0,\"tpot_ms\":1.0,\"e2e_ms\":40.0}}",
            i * 100
        ));
    }
    text.push('\n');
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drift_trigger_switches_a_disabled_shadow_on_and_the_snapshot_names_its_verdict() {
    let dir = crate::common::temp::TempDir::new("shadow-drift");
    let baseline = dir.write("base.jsonl", &short_baseline(40)).unwrap();
    let (_primary, upstream) = start_sim(fast_sim(1.0, 0.0)).await;
    let candidate = FakeUpstream::start(primary_script().0).await;
    let toml = format!(
        r#"{}
[drift]
baseline = "{}"
every = "100ms"
min_samples = 20
fire_after = 1
shadow_on_trigger = "30m"
"#,
        shadow_config(&candidate.url(), "enabled = false"),
        baseline.display()
    );
    let proxy = proxy_with(&upstream, &toml).await;
    // Long answers where the baseline had short ones: output length drifts.
    let long = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 200,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    // Exactly min_samples requests, one after the other: drift can only fire once the last
    // has finished, so none of them can have been mirrored.
    for _ in 0..20 {
        let (status, _) = post_collect(
            &client(),
            &format!("http://{}/v1/chat/completions", proxy.proxy_addr),
            long.clone(),
        )
        .await;
        assert_eq!(status, 200);
    }
    assert_eq!(shadow_report(&proxy).await["configured"], true);
    let report = report_when(&proxy, |r| r["enabled"] == true).await;
    assert!(report["switched_on_for_s"].as_f64().unwrap() > 60.0);
    // Disabled until then: the candidate saw nothing; from now on it gets copies.
    assert!(candidate.requests().await.is_empty());
    let (status, _, _) = chat(&proxy, "after-trigger").await;
    assert_eq!(status, 200);
    let copies = candidate.wait_requests(1, T).await;
    assert_eq!(copies[0].header("x-request-id"), Some("after-trigger"));
    // The snapshot written when the trigger fired records the shadow's verdicts.
    // (written off the aggregator's task, so it may land a moment after the switch-on).
    let snapshot = poll_until!("a snapshot to be written", T, {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .find(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("goodput-snapshot-") && e.metadata().is_ok_and(|m| m.len() > 0)
            })
            .map(|entry| entry.path())
    });
    let text = std::fs::read_to_string(snapshot).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["shadow"]["window_s"], 3600.0, "{header}");
    assert!(header["shadow"]["classes"].is_object());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_requests_matching_the_model_and_class_globs_are_mirrored() {
    let (script, _) = primary_script();
    let primary = FakeUpstream::start(script.clone()).await;
    let candidate = FakeUpstream::start(script).await;
    let toml = format!(
        r#"
[[slo.class]]
name = "batch"
match = {{ model = "batch-*" }}
ttft_ms = 5000
[[slo.class]]
name = "interactive"
match = {{ api = "chat" }}
ttft_ms = 300
[shadow]
url = "{}"
share = 1.0
models = ["test-*", "batch-*"]
classes = ["inter*"]
"#,
        candidate.url()
    );
    let proxy = proxy_with(&primary.url(), &toml).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let with_model = |model: &str| chat_body(true, 8, true).replace("test-model", model);
    // Not mirrored: another model; a matching model in another class. Sent first, so a
    // copy taken by mistake would reach the candidate before the right one.
    post_collect(&client(), &url, with_model("other-model")).await;
    post_collect(&client(), &url, with_model("batch-model")).await;
    // Mirrored: model and class both match.
    post_collect(&client(), &url, with_model("test-model")).await;
    let recs = wait_records(proxy.admin_addr, 4, T).await;
    let shadows: Vec<&Value> = recs.iter().filter(|r| r["target"] == "shadow").collect();
    assert_eq!(shadows.len(), 1, "{recs:#?}");
    assert_eq!(shadows[0]["model"], "test-model");
    let copies = candidate.requests().await;
    assert_eq!(copies.len(), 1);
    assert!(copies[0].body_text().contains("test-model"));
    proxy.shutdown().await;
}

mod answers;
mod budget;
