//! The engine's own per-request timings through the real proxy: vLLM's `metrics` object on
//! the final usage chunk (injected or asked for) and in a non-streamed body, TGI's timing
//! headers; the client's bytes stay what they would be without the proxy, and the record's
//! parts add up to its TTFT. Per-request objective headers in `tighten` and `override` mode.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::time::Duration;

use crate::common::fake::{FakeUpstream, Script, WritePlan, openai_chat_events};
use crate::common::harness::*;
use bytes::Bytes;
use goodput::config::{self, Overrides};
use goodput::run::Running;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

const T: Duration = Duration::from_secs(10);
const CHAT: &str = "/v1/chat/completions";
/// What the fake engine says of every request: 40 ms queued, 75 ms of prefill.
const METRICS: &str = r#""metrics":{"time_to_first_token_ms":75.0,"generation_time_ms":20.0,"queue_time_ms":40.0,"mean_itl_ms":5.0,"tokens_per_second":200.0}"#;

/// vLLM's stream with `--enable-per-request-metrics`: the usage chunk carries `metrics`.
fn vllm_events(n: usize) -> Vec<Vec<u8>> {
    let mut events = openai_chat_events(n, true);
    let usage = events.len() - 2;
    let chunk = String::from_utf8(events[usage].clone()).unwrap();
    let with = chunk.replacen(r#""usage":"#, &format!("{METRICS},\"usage\":"), 1);
    events[usage] = with.into_bytes();
    events
}

async fn proxy_with(upstream: &str, toml: &str) -> Running {
    start_proxy_toml(upstream, toml).await
}

async fn send(
    proxy: &Running,
    path: &str,
    id: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, Bytes) {
    let mut req = http::Request::post(format!("http://{}{path}", proxy.proxy_addr))
        .header("content-type", "application/json")
        .header("x-request-id", id);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

async fn record(proxy: &Running, id: &str) -> Value {
    record_of(proxy.admin_addr, id, T).await
}

fn f(r: &Value, key: &str) -> f64 {
    let v = r[key].as_f64();
    assert!(v.is_some(), "{key} in {r}");
    v.unwrap_or_default()
}

/// Queue and prefill as the engine said; outside the engine is the rest of the TTFT.
fn assert_split(r: &Value) {
    assert_eq!(r["engine_timing_source"], "response", "{r}");
    assert_eq!(f(r, "engine_queue_ms"), 40.0);
    assert_eq!(f(r, "engine_prefill_ms"), 75.0);
    assert_eq!(f(r, "engine_decode_ms"), 20.0);
    assert_eq!(f(r, "engine_inference_ms"), 95.0);
    let outside = f(r, "outside_engine_ms");
    assert!((outside - (f(r, "ttft_ms") - 115.0)).abs() < 1.0, "{r}");
}

#[tokio::test]
async fn vllm_timings_are_recorded_and_the_injected_chunk_stays_stripped() {
    let events = vllm_events(5);
    // What the client gets without goodput: it asked for no usage, so vLLM sent none.
    let mut expected = events.clone();
    expected.remove(events.len() - 2);
    let body = chat_body(true, 5, false);
    for (name, plan) in [
        ("whole", WritePlan::Whole),
        ("one-byte writes", WritePlan::Bytes1),
    ] {
        let script =
            Script::sse_chunked(&events, plan, Duration::ZERO).delayed(Duration::from_millis(130));
        let fake = FakeUpstream::start(script).await;
        let mut toml = String::from("[usage_injection]\nenabled = true\n");
        toml.push('\n');
        let proxy = proxy_with(&fake.url(), &toml).await;
        let (status, got) = send(&proxy, CHAT, "injected", &body, &[]).await;
        assert_eq!(status, 200, "{name}");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected.concat()),
            "{name}: the client sees the stream without the usage chunk"
        );
        assert!(!got.windows(7).any(|w| w == b"metrics"), "{name}");
        let r = record(&proxy, "injected").await;
        assert_split(&r);
        assert!(f(&r, "ttft_ms") >= 130.0, "{r}");
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn a_client_that_asked_for_usage_gets_the_metrics_untouched() {
    let events = vllm_events(4);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = proxy_with(&fake.url(), "").await;
    let (status, got) = send(&proxy, CHAT, "asked", &chat_body(true, 4, true), &[]).await;
    assert_eq!((status, got.as_ref()), (200, events.concat().as_slice()));
    assert_split(&record(&proxy, "asked").await);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_non_streamed_body_and_tgi_headers_split_the_e2e() {
    let body = format!(
        r#"{{"id":"c","object":"chat.completion","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}},{METRICS}}}"#
    );
    let script = Script::response(
        200,
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
    let fake = FakeUpstream::start(script).await;
    let proxy = proxy_with(&fake.url(), "").await;
    let (status, got) = send(&proxy, CHAT, "json", &chat_body(false, 1, false), &[]).await;
    assert_eq!((status, got.as_ref()), (200, body.as_bytes()));
    let r = record(&proxy, "json").await;
    assert_eq!(r["engine_timing_source"], "response", "{r}");
    assert!(r["ttft_ms"].is_null());
    let outside = f(&r, "outside_engine_ms");
    assert!((outside - (f(&r, "e2e_ms") - 135.0)).abs() < 1.0, "{r}");
    proxy.shutdown().await;

    // TGI answers `/generate` with its timings in headers.
    let tgi = br#"{"generated_text":"hi there"}"#;
    let script = Script::response(
        200,
        &[
            ("content-type", "application/json"),
            ("x-queue-time", "12"),
            ("x-inference-time", "88"),
            ("x-time-per-token", "44"),
        ],
        tgi,
    );
    let fake = FakeUpstream::start(script).await;
    let proxy = proxy_with(&fake.url(), "").await;
    let req = r#"{"inputs":"hello","parameters":{"max_new_tokens":2}}"#;
    let (status, got) = send(&proxy, "/generate", "tgi", req, &[]).await;
    assert_eq!((status, got.as_ref()), (200, &tgi[..]));
    let r = record(&proxy, "tgi").await;
    assert_eq!(r["engine_timing_source"], "headers", "{r}");
    assert_eq!(
        (f(&r, "engine_queue_ms"), f(&r, "engine_inference_ms")),
        (12.0, 88.0)
    );
    assert!(r["engine_prefill_ms"].is_null() && r["engine_decode_ms"].is_null());
    assert!((f(&r, "outside_engine_ms") - (f(&r, "e2e_ms") - 100.0)).abs() < 1.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn misses_name_the_part_that_took_the_time_and_the_summary_splits_them() {
    let events = vllm_events(3);
    let script = Script::sse_chunked(&events, WritePlan::Whole, Duration::ZERO)
        .delayed(Duration::from_millis(200));
    let fake = FakeUpstream::start(script).await;
    // 115 ms of the engine against at least 85 ms outside it: prefill is the largest part.
    let proxy = proxy_with(&fake.url(), "[slo.default]\nttft_ms = 50\n").await;
    let (status, _) = send(&proxy, CHAT, "slow", &chat_body(true, 3, true), &[]).await;
    assert_eq!(status, 200);
    let r = record(&proxy, "slow").await;
    assert_eq!(
        (r["slo_met"].as_bool(), r["slo_miss_reason"].as_str()),
        (Some(false), Some("ttft"))
    );
    let outside = f(&r, "outside_engine_ms");
    let expected = if outside > 75.0 {
        "outside_engine"
    } else {
        "prefill"
    };
    assert_eq!(r["slo_miss_component"], expected, "{r}");
    assert_eq!(r["slo_source"], "class");

    let (_, text) = admin_get(proxy.admin_addr, "/api/v1/summary?window=1m").await;
    let s: Value = serde_json::from_str(&text).unwrap();
    let a = s["attribution"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["source"] == "requests");
    assert!(a.is_some(), "{s}");
    let a = a.unwrap();
    assert_eq!(
        (a["class"].as_str(), a["model"].as_str()),
        (Some("default"), Some("test-model"))
    );
    assert_eq!(
        (a["requests"].as_u64(), a["misses"].as_u64()),
        (Some(1), Some(1))
    );
    let queue_p50 = a["queue_ms"]["p50"].as_f64().unwrap();
    assert!((queue_p50 - 40.0).abs() <= 0.4, "{a}");
    assert_eq!(a["miss_share"][expected], 1.0, "{a}");
    let m = metrics(proxy.admin_addr).await;
    let count = metric_value(
        &m,
        r#"goodput_request_phase_seconds_count{model="test-model",phase="prefill"}"#,
    );
    assert_eq!(count, Some(1.0), "{m}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn objective_headers_tighten_but_never_loosen() {
    let events = openai_chat_events(3, true);
    let script = Script::sse_chunked(&events, WritePlan::Whole, Duration::ZERO)
        .delayed(Duration::from_millis(150));
    let fake = FakeUpstream::start(script).await;
    let toml = "[slo]\nheader_objectives = \"tighten\"\n[slo.default]\nttft_ms = 100000\n";
    let proxy = proxy_with(&fake.url(), toml).await;
    let body = chat_body(true, 3, true);
    // A header stricter than the class applies: TTFT ≥ 150 ms against 50 ms.
    send(
        &proxy,
        CHAT,
        "strict",
        &body,
        &[("x-llm-d-slo-ttft-ms", "50")],
    )
    .await;
    let r = record(&proxy, "strict").await;
    assert_eq!(
        (r["slo_met"].as_bool(), r["slo_source"].as_str()),
        (Some(false), Some("header"))
    );
    // The deprecated alias too; a bad value is ignored and counted.
    send(&proxy, CHAT, "alias", &body, &[("x-slo-ttft-ms", "60")]).await;
    assert_eq!(record(&proxy, "alias").await["slo_met"], false);
    send(&proxy, CHAT, "bad", &body, &[("x-llm-d-slo-ttft-ms", "-3")]).await;
    let r = record(&proxy, "bad").await;
    assert_eq!(
        (r["slo_met"].as_bool(), r["slo_source"].as_str()),
        (Some(true), Some("class"))
    );
    let m = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_value(&m, "goodput_slo_header_objectives_invalid_total"),
        Some(1.0),
        "{m}"
    );
    proxy.shutdown().await;

    // A looser header never loosens in `tighten`: the class's 100 ms holds against ≥ 150 ms.
    let script = Script::sse_chunked(&events, WritePlan::Whole, Duration::ZERO)
        .delayed(Duration::from_millis(150));
    let fake = FakeUpstream::start(script).await;
    let toml = "[slo]\nheader_objectives = \"tighten\"\n[slo.default]\nttft_ms = 100\n";
    let proxy = proxy_with(&fake.url(), toml).await;
    send(
        &proxy,
        CHAT,
        "loose",
        &body,
        &[("x-llm-d-slo-ttft-ms", "5000")],
    )
    .await;
    let r = record(&proxy, "loose").await;
    assert_eq!(
        (r["slo_met"].as_bool(), r["slo_source"].as_str()),
        (Some(false), Some("class"))
    );
    proxy.shutdown().await;

    // `override` trusts the client: the same header loosens the target.
    let script = Script::sse_chunked(&events, WritePlan::Whole, Duration::ZERO)
        .delayed(Duration::from_millis(150));
    let fake = FakeUpstream::start(script).await;
    let toml = "[slo]\nheader_objectives = \"override\"\n[slo.default]\nttft_ms = 100\n";
    let proxy = proxy_with(&fake.url(), toml).await;
    send(
        &proxy,
        CHAT,
        "trusted",
        &body,
        &[("x-llm-d-slo-ttft-ms", "60000")],
    )
    .await;
    let r = record(&proxy, "trusted").await;
    assert_eq!(
        (r["slo_met"].as_bool(), r["slo_source"].as_str()),
        (Some(true), Some("header"))
    );
    proxy.shutdown().await;
}

#[test]
fn override_headers_and_a_different_mode_are_refused() {
    let toml = "[slo]\noverride_headers = true\nheader_objectives = \"tighten\"\n";
    let err = config::load_str(toml, "test", &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("slo.override_headers"), "{err}");
}

/// With `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` the real binary exports
/// the latest client-inference names beside today's; without it, only today's.
#[tokio::test(flavor = "multi_thread")]
async fn the_latest_genai_names_are_exported_when_opted_in() {
    use crate::common::binary::Serving;
    let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
    for opt_in in [true, false] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            &upstream,
        ]);
        cmd.env_remove("OTEL_SEMCONV_STABILITY_OPT_IN");
        if opt_in {
            cmd.env(
                "OTEL_SEMCONV_STABILITY_OPT_IN",
                "http,gen_ai_latest_experimental",
            );
        }
        let mut served = Serving::start(cmd, Duration::from_secs(20)).unwrap();
        let url = format!("http://{}/v1/chat/completions", served.proxy);
        let (status, _) = post_collect(&client(), &url, chat_body(true, 4, true)).await;
        assert_eq!(status, 200);
        wait_records(served.admin, 1, T).await;
        let m = metrics(served.admin).await;
        let series = |name: &str| metric_value(&m, name);
        let ttfc = series(
            r#"gen_ai_client_inference_time_to_first_chunk_seconds_count{model="test-model",api="chat_completions"}"#,
        );
        let tokens = series(
            r#"gen_ai_client_inference_usage_output_tokens_total{model="test-model",api="chat_completions"}"#,
        );
        if opt_in {
            assert_eq!((ttfc, tokens), (Some(1.0), Some(4.0)), "{m}");
        } else {
            assert!(!m.contains("gen_ai_client_inference"), "{m}");
        }
        assert!(
            m.contains("gen_ai_server_time_to_first_token_seconds_count"),
            "{m}"
        );
        served.signal("-TERM");
        served.exited(T).unwrap();
    }
}
