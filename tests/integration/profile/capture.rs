//! A profile captured from simulator traffic through the real proxy, for
//! `scripts/aiperf-check.sh` while `goodput serve` does not record profiles itself: the
//! proxy measures the requests (its `/api/v1/requests` records) and this test turns each
//! record into a [`ProfileLine`] the way the aggregator hook does (blocks from the body
//! that was sent), then records them through the real writer. Ignored by default; the
//! script runs it with `GOODPUT_CAPTURE_DIR` set.

use std::{collections::HashMap, time::Duration};

use bytes::Bytes;
use goodput::{
    config::{self, Overrides},
    decode::Api,
    profile::{Anonymizer, Clock, ProfileLine, ProfileMetrics, ProfileRecorder, unix_ms},
    sim::SimConfig,
};
use http_body_util::{BodyExt, Full};
use prometheus_client::registry::Registry;
use serde_json::Value;

use crate::common::harness::{client, start_proxy, start_sim, wait_records};

/// Labels as the record serializes them, back to the static strings lines carry.
fn label(v: &Value) -> Option<&'static str> {
    const KNOWN: [&str; 10] = [
        "usage",
        "tokenizer",
        "estimate",
        "events",
        "ok",
        "upstream_error",
        "upstream_reset",
        "client_abort",
        "timeout",
        "proxy_error",
    ];
    KNOWN.into_iter().find(|k| v.as_str() == Some(*k))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes a profile for scripts/aiperf-check.sh (GOODPUT_CAPTURE_DIR)"]
async fn capture_simulator_traffic_through_the_proxy() {
    let dir = std::env::var("GOODPUT_CAPTURE_DIR").expect("set GOODPUT_CAPTURE_DIR");
    let n: usize = std::env::var("GOODPUT_CAPTURE_REQUESTS").map_or(60, |v| v.parse().unwrap());
    let sim = SimConfig {
        ttft: "lognormal:40,0.3".parse().unwrap(),
        itl: "normal:4,1".parse().unwrap(),
        output_tokens: Some("lognormal:60,0.5".parse().unwrap()),
        ..SimConfig::default()
    };
    let (_sim, url) = start_sim(sim).await;
    let proxy = start_proxy(&url).await;
    let text = format!(
        "[profile]\ndir = \"{dir}\"\ninstance = \"capture\"\nsalt = \"aiperf-check-salt-0123\"\n[profile.contract]\nengine = \"goodput sim\"\n"
    );
    let o = Overrides {
        upstream: Some(url.clone()),
        ..Default::default()
    };
    let cfg = config::load_str(&text, "capture", &o).unwrap();
    let mut registry = Registry::default();
    let metrics = ProfileMetrics::register(&mut registry);
    let anon = Anonymizer::new(&cfg.profile);
    let recorder =
        ProfileRecorder::start(&cfg.profile, anon.clone(), &metrics, Clock::system()).unwrap();

    let http = client();
    let mut bodies = HashMap::new();
    let mut pending = Vec::new();
    for i in 0..n {
        // Three system prompts of different lengths, shared across requests (prefix
        // reuse), then a question of its own.
        let system = format!("You are assistant {}. ", i % 3).repeat(40 + 150 * (i % 3));
        let body = serde_json::json!({
            "model": "sim-model",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question number {i}: {}", "why? ".repeat(i % 7 * 30))},
            ],
            "max_tokens": 256,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string();
        let id = format!("capture-{i}");
        bodies.insert(id.clone(), body.clone());
        let req = hyper::Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
            .header("content-type", "application/json")
            .header("x-request-id", &id)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let http = http.clone();
        pending.push(tokio::spawn(async move {
            let resp = http.request(req).await.unwrap();
            resp.into_body().collect().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(20 + (i as u64 * 37) % 90)).await;
    }
    for p in pending {
        p.await.unwrap();
    }
    let records = wait_records(proxy.admin_addr, n, Duration::from_secs(10)).await;
    assert_eq!(records.len(), n);
    for r in &records {
        let body = &bodies[r["id"].as_str().unwrap()];
        let started = humantime::parse_rfc3339_weak(r["started_at"].as_str().unwrap()).unwrap();
        let model = r["model"].as_str().map(str::to_owned);
        let line = ProfileLine {
            arrival_ms: unix_ms(started),
            block_hashes: anon.blocks(Api::ChatCompletions, model.as_deref(), body.as_bytes()),
            model,
            api: r["api"].as_str().unwrap().to_owned(),
            stream: r["stream"].as_bool().unwrap(),
            input_tokens: r["input_tokens"].as_u64(),
            input_tokens_source: label(&r["input_tokens_source"]),
            output_tokens: r["output_tokens"].as_u64(),
            output_tokens_source: label(&r["output_tokens_source"]),
            max_tokens: Some(256),
            outcome: label(&r["outcome"]).unwrap(),
            status: r["status"].as_u64().map(|s| s as u16),
            slo_class: r["slo_class"].as_str().unwrap_or("default").to_owned(),
            slo_met: r["slo_met"].as_bool(),
            ttft_ms: r["ttft_ms"].as_f64(),
            tpot_ms: r["tpot_ms"].as_f64(),
            e2e_ms: r["e2e_ms"].as_f64().unwrap(),
            tenant: None,
        };
        assert!(
            line.input_tokens.is_some() && line.output_tokens.is_some(),
            "{r}"
        );
        recorder.record(line);
    }
    recorder.shutdown().await;
    proxy.shutdown().await;
    eprintln!("captured {n} requests into {dir}");
}
