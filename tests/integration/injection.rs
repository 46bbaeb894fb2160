//! Usage injection through the real proxy: the upstream is asked for usage with a correct
//! `Content-Length`, the client receives exactly the bytes it would have received without
//! the proxy (whatever the chunking of the usage chunk), and the record has exact counts.
//! Clients that asked for usage, bodies over the inspection limit and other dialects are
//! never touched.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::time::Duration;

use crate::common::fake::{FakeUpstream, Received, Script, WritePlan, openai_chat_events};
use crate::common::harness::*;
use bytes::Bytes;
use goodput::config::Config;
use goodput::run::Running;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

const T: Duration = Duration::from_secs(10);
const CHAT: &str = "/v1/chat/completions";

fn injecting(upstream: &str) -> Config {
    let mut cfg = test_config(upstream);
    cfg.usage_injection.enabled = true;
    cfg
}

/// POSTs `body` with an id; returns the status and the body bytes the client received.
async fn send(proxy: &Running, path: &str, id: &str, body: &str) -> (u16, Bytes) {
    let req = http::Request::post(format!("http://{}{path}", proxy.proxy_addr))
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

async fn record(proxy: &Running, id: &str) -> Value {
    record_of(proxy.admin_addr, id, T).await
}

async fn last_request(fake: &FakeUpstream) -> Received {
    fake.wait_requests(1, T).await.pop().unwrap()
}

/// The events with the usage chunk and `[DONE]` in one write, every other event its own.
fn coalesced_tail(events: &[Vec<u8>]) -> WritePlan {
    let before: usize = events[..events.len() - 2].iter().map(Vec::len).sum();
    let mut cuts: Vec<usize> = Vec::new();
    let mut at = 0;
    for e in &events[..events.len() - 2] {
        at += e.len();
        cuts.push(at);
    }
    assert_eq!(at, before);
    WritePlan::SplitAt(cuts)
}

#[tokio::test]
async fn the_client_gets_the_same_bytes_with_injection_on_and_off() {
    // Without injection the upstream sends no usage: this is what the client must get.
    let plain = openai_chat_events(5, false);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &plain,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let body = chat_body(true, 5, false);
    let (status, expected) = send(&proxy, CHAT, "off", &body).await;
    assert_eq!(status, 200);
    assert!(!expected.windows(7).any(|w| w == b"\"usage\""));
    assert_eq!(
        last_request(&fake).await.body,
        body.as_bytes(),
        "off: body untouched"
    );
    proxy.shutdown().await;

    // With injection the upstream adds the usage chunk, however it is written.
    let with_usage = openai_chat_events(5, true);
    let usage_at: usize = with_usage[..with_usage.len() - 2]
        .iter()
        .map(Vec::len)
        .sum();
    let plans = [
        ("whole", WritePlan::Whole),
        ("one-byte writes", WritePlan::Bytes1),
        ("usage coalesced with [DONE]", coalesced_tail(&with_usage)),
        (
            "usage split",
            WritePlan::SplitAt(vec![usage_at + 1, usage_at + 40, usage_at + 90]),
        ),
        ("everything in one write", WritePlan::Coalesced(100)),
    ];
    for (name, plan) in plans {
        let fake =
            FakeUpstream::start(Script::sse_chunked(&with_usage, plan, Duration::ZERO)).await;
        let proxy = start_proxy_with(injecting(&fake.url())).await;
        let (status, got) = send(&proxy, CHAT, "on", &body).await;
        assert_eq!(status, 200, "{name}");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected),
            "{name}: the client sees exactly the stream without the usage chunk"
        );

        let sent = last_request(&fake).await;
        let v: Value = serde_json::from_slice(&sent.body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true, "{name}");
        assert_eq!(
            sent.header("content-length"),
            Some(sent.body.len().to_string().as_str())
        );
        // Every byte the client sent is still there, in order, before the added key.
        let original = body.trim_end_matches('}');
        assert!(
            sent.body.starts_with(original.as_bytes()),
            "{name}: {}",
            sent.body_text()
        );

        let r = record(&proxy, "on").await;
        assert_eq!(r["output_tokens_source"], "usage", "{name}: {r}");
        assert_eq!(r["output_tokens"], 5, "{name}: {r}");
        assert_eq!(
            (
                r["input_tokens"].as_u64(),
                r["input_tokens_source"].as_str()
            ),
            (Some(7), Some("usage"))
        );
        assert_eq!(r["outcome"], "ok", "{name}: {r}");
        assert_eq!(r["events"], 5, "{name}: {r}");
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn a_client_that_asked_for_usage_gets_it_untouched() {
    let events = openai_chat_events(4, true);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Bytes1,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy_with(injecting(&fake.url())).await;
    let body = chat_body(true, 4, true);
    let (status, got) = send(&proxy, CHAT, "asked", &body).await;
    assert_eq!(status, 200);
    assert_eq!(
        got.as_ref(),
        events.concat().as_slice(),
        "usage chunk included"
    );
    assert_eq!(last_request(&fake).await.body, body.as_bytes());
    let r = record(&proxy, "asked").await;
    assert_eq!(
        (
            r["output_tokens"].as_u64(),
            r["output_tokens_source"].as_str()
        ),
        (Some(4), Some("usage"))
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_body_over_the_inspection_limit_passes_untouched() {
    let events = openai_chat_events(3, false);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let mut cfg = injecting(&fake.url());
    cfg.measure.request_inspect_limit = 40;
    let proxy = start_proxy_with(cfg).await;
    let body = chat_body(true, 3, false);
    assert!(body.len() > 40);
    let (status, got) = send(&proxy, CHAT, "big", &body).await;
    assert_eq!((status, got.as_ref()), (200, events.concat().as_slice()));
    let sent = last_request(&fake).await;
    assert_eq!(sent.body, body.as_bytes());
    assert_eq!(
        sent.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn other_dialects_non_streaming_and_unlisted_models_are_never_modified() {
    let anthropic = r#"{"model":"claude","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let cases: [(&str, &str, String); 4] = [
        ("anthropic", "/v1/messages", anthropic.to_owned()),
        ("non-streaming", CHAT, chat_body(false, 3, false)),
        (
            "other path",
            "/v2/chat/completions",
            chat_body(true, 3, false),
        ),
        (
            "legacy completions",
            "/v1/completions",
            r#"{"model":"m","prompt":"x","stream":true}"#.to_owned(),
        ),
    ];
    for (name, path, body) in cases {
        let fake = FakeUpstream::start(Script::response(
            200,
            &[("content-type", "application/json")],
            b"{}",
        ))
        .await;
        let mut cfg = injecting(&fake.url());
        if name == "legacy completions" {
            // Listed path, but the model is not one the operator opted in.
            cfg.usage_injection.models = vec!["llama-*".into()];
        }
        let proxy = start_proxy_with(cfg).await;
        let (status, _) = send(&proxy, path, name, &body).await;
        assert_eq!(status, 200, "{name}");
        let sent = last_request(&fake).await;
        assert_eq!(sent.body_text(), body, "{name}");
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn with_the_simulator_counts_are_exact_and_no_usage_reaches_the_client() {
    let (sim, upstream) = start_sim(fast_sim(2.0, 1.0)).await;
    let proxy = start_proxy_with(injecting(&upstream)).await;
    let (status, got) = send(&proxy, CHAT, "sim", &chat_body(true, 9, false)).await;
    assert_eq!(status, 200);
    assert!(
        !got.windows(7).any(|w| w == b"\"usage\""),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(got.ends_with(b"data: [DONE]\n\n"));
    let truth = sim.truth();
    let t = truth
        .iter()
        .find(|t| t.request_id.as_deref() == Some("sim"))
        .unwrap();
    let r = record(&proxy, "sim").await;
    assert_eq!(r["output_tokens_source"], "usage", "{r}");
    assert_eq!(
        r["output_tokens"].as_u64(),
        Some(t.completion_tokens),
        "{r}"
    );
    assert_eq!(r["input_tokens"].as_u64(), Some(t.prompt_tokens), "{r}");
    proxy.shutdown().await;
}
