//! `goodput replay` scraping the target engine's metrics: against the in-process simulator
//! (vLLM names) each step gets its queue, prefill, decode and outside-engine time, KV-cache
//! usage and batch numbers, with miss reasons; a soak whose engine's KV usage keeps growing
//! (a purpose-built metrics endpoint) fails its verdict saying so; an unreachable endpoint
//! costs counted failures, not the run.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use super::{args, read_json};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

fn write_profile(dir: &Path) -> PathBuf {
    super::twenty_requests(dir, 8, "interactive", false)
}

fn write_config(dir: &Path, ttft_ms: u32) -> PathBuf {
    let path = dir.join("slo.toml");
    std::fs::write(
        &path,
        format!(
            "[slo]\nmin_samples = 5\n\n[[slo.class]]\nname = \"interactive\"\nmatch = {{ api = \"chat\" }}\n\
             ttft_ms = {ttft_ms}\nattainment = 0.9\n"
        ),
    )
    .unwrap();
    path
}

/// The guides' cost model: 4/h of hardware, 26,280 one-time over 12 months (3/h), 10 kW at
/// 0.2 per kWh (2/h), a quarter of the hours idle: (4 + 3 + 2) / 0.75 = 12/h; and usage
/// prices beside (a licence billed per token and per request).
const COST: &str = "\n[cost]\ncurrency = \"EUR\"\nper_hour = { hardware = 4.0 }\n\
one_time = { migration = 20000, integration = 6280 }\namortize_months = 12\nkw = 10\n\
energy_price_per_kwh = 0.2\nidle_share = 0.25\nper_million_input_tokens = 0.5\n\
per_million_output_tokens = 2.0\nper_request = 0.0001\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_get_the_engine_time_and_load_and_miss_reasons() {
    let _serial = crate::common::SERIAL.lock().await;
    // TTFT 30 ms against a 10 ms target: every request misses on TTFT. The knee makes
    // the simulator report KV-cache usage (in flight / 8).
    let (_sim, url) = start_sim(goodput::sim::SimConfig {
        concurrency_knee: Some(8),
        ..fast_sim(30.0, 2.0)
    })
    .await;
    let tmp = TempDir::new("attribution");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir, 10));
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--config",
        config.to_str().unwrap(),
        "--concurrency",
        "1,4",
        "--warmup",
        "200ms",
        "--step-duration",
        "1500ms",
        "--engine-metrics-interval",
        "100ms",
        "--out",
        out.to_str().unwrap(),
    ]);
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    let at = &r["attribution"];
    assert_eq!(at["engine"], "vllm", "{at}");
    assert_eq!(at["url"], format!("{url}/metrics"));
    assert_eq!(at["failed_scrapes"], 0, "{at}");
    let steps = at["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    for (s, label) in steps.iter().zip(["c=1", "c=4"]) {
        assert_eq!(s["label"], label);
        assert!(s["scrapes"].as_u64().unwrap() >= 5, "{s}");
        assert!(s["engine_requests"].as_u64().unwrap() >= 5, "{s}");
        // The simulator has no queue; its prefill is its TTFT and decode the rest.
        assert_eq!(s["queue_ms"].as_f64().unwrap(), 0.0, "{s}");
        let prefill = s["prefill_ms"].as_f64().unwrap();
        assert!((30.0..60.0).contains(&prefill), "{s}");
        assert!(s["decode_ms"].as_f64().unwrap() > 0.0, "{s}");
        // The client's e2e includes the engine's, plus loopback and the client itself.
        assert!(s["outside_engine_ms"].as_f64().unwrap() >= 0.0, "{s}");
        assert!(s["kv_cache_usage_peak"].as_f64().unwrap() > 0.0, "{s}");
        assert_eq!(s["preemptions"].as_f64().unwrap(), 0.0, "{s}");
        assert_eq!(s["requests_waiting_peak"].as_f64().unwrap(), 0.0, "{s}");
        assert_eq!(s["engine_restarted"], false);
    }
    let overall = &at["overall"];
    let total: u64 = steps
        .iter()
        .map(|s| s["engine_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(overall["engine_requests"].as_u64().unwrap(), total);
    assert!(at.get("soak").is_none());
    for s in r["steps"].as_array().unwrap() {
        let requests = s["requests"].as_u64().unwrap();
        assert_eq!(s["miss_reasons"]["ttft"].as_u64().unwrap(), requests, "{s}");
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Attribution and resources"), "{md}");
    assert!(md.contains("| c=4 |") && md.contains("ttft "), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Attribution and resources</h2>"));
    assert!(html.contains("<th>miss reasons</th>"));
}

/// A metrics endpoint whose KV-cache usage grows by one point per scrape, with an e2e
/// histogram so it is recognized as vLLM.
async fn growing_kv_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let scrapes = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let n = scrapes.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => seen.extend_from_slice(&buf[..k]),
                    }
                }
                let body = format!(
                    "vllm:e2e_request_latency_seconds_sum {}\nvllm:e2e_request_latency_seconds_count {n}\n\
                     vllm:kv_cache_usage_perc {}\nvllm:num_requests_waiting 0\nvllm:num_requests_running 4\n",
                    f64::from(n) * 0.05,
                    (0.2 + f64::from(n) * 0.01).min(1.0)
                );
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_whose_kv_cache_keeps_growing_fails_saying_so() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let metrics = growing_kv_endpoint().await;
    let tmp = TempDir::new("attribution-soak");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir, 500));
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}{COST}")).unwrap();
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--config",
        config.to_str().unwrap(),
        "--mode",
        "soak",
        "--soak-rate",
        "20",
        "--soak-duration",
        "3s",
        "--warmup",
        "200ms",
        "--step-duration",
        "1s",
        "--engine-metrics",
        &metrics,
        "--engine-metrics-interval",
        "100ms",
        "--soak-max-waiting-growth",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    assert_eq!(done.exit_code(), replay::EXIT_FAIL);
    let r = read_json(&out.join("report.json"));
    let soak = &r["attribution"]["soak"];
    assert_eq!(soak["holds"], false, "{soak}");
    assert_eq!(soak["max_kv_growth"].as_f64().unwrap(), 0.1);
    // Only the KV cache grew: waiting stayed at 0 (limit 0) and the batch at 4.
    let reasons = soak["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{soak}");
    assert!(
        reasons[0]
            .as_str()
            .unwrap()
            .starts_with("KV-cache usage grew"),
        "{soak}"
    );
    let v = &r["verdicts"][0];
    assert_eq!(v["verdict"], "fail");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("the engine's resources drifted: KV-cache usage grew"),
        "{v}"
    );
    // Attainment alone held: the resources are what failed it.
    assert!(r["overall"]["attainment"].as_f64().unwrap() >= 0.9);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("Soak resources FAILED"), "{html}");
    // The cost at the operating point (the whole soak).
    let c = &r["cost"];
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(close(c["per_hour"].as_f64().unwrap(), 12.0), "{c}");
    assert!(
        close(c["components"]["one_time"].as_f64().unwrap(), 3.0),
        "{c}"
    );
    assert!(
        close(c["components"]["energy"].as_f64().unwrap(), 2.0),
        "{c}"
    );
    assert!(
        close(c["components"]["idle_and_failure"].as_f64().unwrap(), 3.0),
        "{c}"
    );
    assert_eq!(c["one_time"]["migration"], 20000.0, "itemized: {c}");
    assert_eq!(c["one_time"]["integration"], 6280.0, "{c}");
    let o = &r["overall"];
    let per_s = o["requests_per_s"].as_f64().unwrap();
    // The usage the operating point runs up per hour, by hand.
    let usage = 3600.0
        * (o["input_tokens_per_s"].as_f64().unwrap() * 0.5 / 1e6
            + o["raw_output_tokens_per_s"].as_f64().unwrap() * 2.0 / 1e6
            + per_s * 0.0001);
    assert!(close(c["usage_per_hour"].as_f64().unwrap(), usage), "{c}");
    let total = 12.0 + usage;
    assert!(
        close(
            c["cost_per_request"].as_f64().unwrap(),
            total / (per_s * 3600.0)
        ),
        "{c}"
    );
    let goodput = o["effective_goodput_tokens_per_s"].as_f64().unwrap();
    assert!(close(
        c["cost_per_million_effective_tokens"].as_f64().unwrap(),
        total / (goodput * 3600.0) * 1e6
    ));
    // Wasted: every output token that was not effective (missed, failed probe, error).
    let wasted =
        1.0 - o["effective_output_tokens"].as_f64().unwrap() / o["output_tokens"].as_f64().unwrap();
    assert!(close(c["wasted_share"].as_f64().unwrap(), wasted), "{c}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("EUR per request"), "{md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_metrics_endpoint_is_counted_not_fatal() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    // A port that was bound and released: nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/metrics", l.local_addr().unwrap())
    };
    let tmp = TempDir::new("attribution-down");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir, 500));
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--config",
        config.to_str().unwrap(),
        "--concurrency",
        "2",
        "--warmup",
        "100ms",
        "--step-duration",
        "500ms",
        "--engine-metrics",
        &closed,
        "--engine-metrics-interval",
        "100ms",
        "--out",
        out.to_str().unwrap(),
    ]);
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    assert_eq!(done.exit_code(), replay::EXIT_PASS);
    let r = read_json(&out.join("report.json"));
    let at = &r["attribution"];
    assert_eq!(at["scrapes"], 0);
    assert!(at["failed_scrapes"].as_u64().unwrap() >= 2, "{at}");
    assert!(
        at["last_error"]
            .as_str()
            .unwrap()
            .starts_with("unreachable"),
        "{at}"
    );
    assert!(at["overall"]["queue_ms"].is_null());
    // Turned off: no attribution at all; a bad URL is refused before any load.
    let off = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--concurrency",
        "1",
        "--warmup",
        "0s",
        "--step-duration",
        "200ms",
        "--no-engine-metrics",
        "--out",
        dir.join("off").to_str().unwrap(),
    ]);
    replay::execute(&off, std::future::pending()).await.unwrap();
    assert!(
        read_json(&dir.join("off/report.json"))
            .get("attribution")
            .is_none()
    );
    let mut bad = off;
    bad.no_engine_metrics = false;
    bad.engine_metrics = Some("not a url".into());
    let e = replay::execute(&bad, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--engine-metrics `not a url` is not an http(s) URL with a host"
    );
}
