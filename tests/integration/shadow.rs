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
    // (`timeout` and `too_large` copies leave one, `in_flight` ones were never taken).
    let unwritten: u64 = drops
        .iter()
        .filter(|(r, _)| !["in_flight", "timeout", "too_large"].contains(r))
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

#[tokio::test(flavor = "multi_thread")]
async fn a_secondary_answers_every_copy_and_stays_out_of_the_primarys_numbers() {
    let (_primary, upstream) = start_sim(fast_sim(1.0, 0.0)).await;
    let (_candidate, candidate_url) = start_sim(fast_sim(1.0, 0.0)).await;
    let (secondary, secondary_url) = start_sim(fast_sim(1.0, 0.0)).await;
    let extra = format!("secondary_url = \"{secondary_url}\"\nauth_header = \"Bearer CAND\"");
    let proxy = proxy_with(&upstream, &shadow_config(&candidate_url, &extra)).await;
    let n = 6;
    for i in 0..n {
        let (status, body, _) = chat(&proxy, &format!("req-{i}")).await;
        assert_eq!(status, 200);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
    let report = report_when(&proxy, |r| {
        r["classes"][0]["secondary"]["requests"].as_u64() == Some(n)
    })
    .await;
    assert_eq!(pairs(&report), n, "{report:#}");
    let recs = poll_until!("every secondary record", T, {
        let recs = records(proxy.admin_addr).await;
        let n_sec = recs.iter().filter(|r| r["target"] == "secondary").count();
        (n_sec == n as usize).then_some(recs)
    });
    for i in 0..n {
        let id = format!("req-{i}:secondary");
        let rec = recs.iter().find(|r| r["id"] == id.as_str()).unwrap();
        assert_eq!(rec["pair_id"], format!("req-{i}"));
    }
    assert_eq!(
        recs.iter().filter(|r| r["target"] == "primary").count(),
        n as usize
    );
    // The secondary gets the client's body, without the candidate's credential.
    assert_eq!(secondary.truth().len(), n as usize);
    // Only the candidate's answers count as the shadow's.
    metric_reaches(
        &proxy,
        r#"goodput_shadow_requests_total{outcome="ok"}"#,
        n as f64,
    )
    .await;
    proxy.shutdown().await;
}

/// A greedy (temperature 0) streamed chat request whose prompt carries a canary; returns
/// the words the client received.
async fn greedy_chat(addr: std::net::SocketAddr, id: &str, prompt: &str) -> String {
    let body = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": format!("CANARY-PROMPT-{prompt}")}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(CONTENT_TYPE, "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));
    words_of(&bytes)
}

/// The content deltas of an SSE chat stream, joined.
fn words_of(sse: &[u8]) -> String {
    String::from_utf8_lossy(sse)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

fn varying_sim(seed: u64, vary_share: f64) -> goodput::sim::SimConfig {
    goodput::sim::SimConfig {
        seed,
        vary_share,
        ..fast_sim(1.0, 0.0)
    }
}

/// Sends `n` greedy requests through a proxy mirroring to a candidate and a secondary,
/// and returns the class's `answers` once every pair is compared, with the proxy.
async fn answers_of(
    candidate: goodput::sim::SimConfig,
    secondary: goodput::sim::SimConfig,
    n: u64,
) -> (Value, Running) {
    let (_primary, upstream) = start_sim(varying_sim(1, 0.0)).await;
    let (direct, direct_url) = start_sim(varying_sim(1, 0.0)).await;
    let (_candidate, candidate_url) = start_sim(candidate).await;
    let (_secondary, secondary_url) = start_sim(secondary).await;
    let extra = format!("secondary_url = \"{secondary_url}\"");
    let proxy = proxy_with(&upstream, &shadow_config(&candidate_url, &extra)).await;
    let direct_addr: std::net::SocketAddr =
        direct_url.trim_start_matches("http://").parse().unwrap();
    for i in 0..n {
        let words = greedy_chat(proxy.proxy_addr, &format!("req-{i}"), &i.to_string()).await;
        // The client gets the primary's own words, as a direct request would.
        let expected = greedy_chat(direct_addr, &format!("direct-{i}"), &i.to_string()).await;
        assert_eq!(words, expected);
    }
    drop(direct);
    let report = report_when(&proxy, |r| {
        let a = &r["classes"][0]["answers"];
        a["pairs"].as_u64() == Some(n) && a["noise_pairs"].as_u64() == Some(n)
    })
    .await;
    (report["classes"][0]["answers"].clone(), proxy)
}

/// No content of a prompt or an answer anywhere: records, metrics, the report.
async fn assert_no_content(proxy: &Running) {
    let recs = serde_json::to_string(&records(proxy.admin_addr).await).unwrap();
    let text = metrics(proxy.admin_addr).await;
    let report = shadow_report(proxy).await.to_string();
    for (what, s) in [("records", &recs), ("metrics", &text), ("report", &report)] {
        assert!(!s.contains("CANARY"), "a prompt in the {what}");
        // Every answer is made of the simulator's words ("the ", "model ", ...).
        assert!(!s.contains("model is"), "an answer in the {what}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_with_the_same_words_passes_and_one_with_others_fails() {
    let (answers, proxy) = answers_of(varying_sim(1, 0.0), varying_sim(1, 0.0), 6).await;
    assert_eq!(answers["verdict"], "pass", "{answers:#}");
    assert_eq!(answers["exact_match"], 1.0);
    assert_eq!(answers["noise_exact_match"], 1.0);
    assert!(
        answers["rule"]
            .as_str()
            .unwrap()
            .contains("answers_relative")
    );
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="same"}"#,
        6.0,
    )
    .await;
    assert_no_content(&proxy).await;
    proxy.shutdown().await;

    let (answers, proxy) = answers_of(varying_sim(2, 0.0), varying_sim(1, 0.0), 6).await;
    assert_eq!(answers["verdict"], "fail", "{answers:#}");
    assert_eq!(answers["exact_match"], 0.0);
    assert!(answers["first_divergence_tokens"]["p50"].as_f64().is_some());
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="differs"}"#,
        6.0,
    )
    .await;
    assert_no_content(&proxy).await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_noisy_secondary_lets_a_little_difference_pass_but_not_a_lot() {
    let n = 50;
    let (answers, proxy) = answers_of(varying_sim(1, 0.32), varying_sim(1, 0.3), n).await;
    assert_eq!(answers["noise_exact_match"], 0.7, "{answers:#}");
    assert_eq!(answers["exact_match"], 0.68, "{answers:#}");
    assert_eq!(answers["verdict"], "pass", "{answers:#}");
    proxy.shutdown().await;
    let (answers, proxy) = answers_of(varying_sim(1, 0.8), varying_sim(1, 0.3), n).await;
    assert_eq!(answers["verdict"], "fail", "{answers:#}");
    assert_no_content(&proxy).await;
    proxy.shutdown().await;
}
