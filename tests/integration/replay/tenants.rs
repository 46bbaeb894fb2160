//! Tenants and models in replay: each request carries its profile tenant hash in the
//! configured `[slo] tenant_header` and is judged in the tenant's class (the hash salted
//! as the proxy keeps it), and the report has results per model.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self, ReplayArgs};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

fn args(list: &[&str]) -> ReplayArgs {
    let mut all = vec!["--no-engine-metrics"];
    all.extend_from_slice(list);
    super::args(&all)
}

/// Requests alternating between tenants `t-gold` (model `big`) and `t-free` (model
/// `small`).
fn write_profile(dir: &Path) -> PathBuf {
    let mut lines = vec![super::header("{}")];
    for i in 0..40 {
        let (tenant, model) = if i % 2 == 0 {
            ("t-gold", "big")
        } else {
            ("t-free", "small")
        };
        let extra = format!(r#","tenant":"{tenant}""#);
        lines.push(super::request(i * 25, model, 300, 8, "default", &extra));
    }
    super::write_lines(dir, &lines)
}

/// Gold must answer within 1 ms (the simulator takes 5: every gold request misses), the
/// rest within 500 ms.
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("slo.toml");
    std::fs::write(
        &path,
        "[slo]\nmin_samples = 5\ntenant_header = \"x-tenant\"\n\n[[slo.class]]\nname = \"gold\"\n\
         match = { tenant = \"t-gold\" }\nttft_ms = 1\nattainment = 0.9\n\n[slo.default]\nttft_ms = 500\n\
         attainment = 0.9\n",
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_classes_are_judged_and_models_reported_apart() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("tenants");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--config",
        config.to_str().unwrap(),
        "--mode",
        "trace",
        "--warmup",
        "0s",
        "--out",
        out.to_str().unwrap(),
    ]);
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["verdict"]["gold"], "fail", "{}", r["verdicts"]);
    assert_eq!(r["verdict"]["default"], "pass", "{}", r["verdicts"]);
    let classes = r["overall"]["classes"].as_array().unwrap();
    let gold = classes.iter().find(|c| c["name"] == "gold").unwrap();
    assert_eq!(gold["requests"], 20);
    assert_eq!(gold["slo_met"], 0);
    let by_model = &r["by_model"];
    for (m, met) in [("big", 0), ("small", 20)] {
        assert_eq!(by_model[m]["requests"], 20, "{by_model}");
        assert_eq!(by_model[m]["slo_met"], met, "{by_model}");
    }
    assert_eq!(done.exit_code(), replay::EXIT_FAIL);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("## Per model") && md.contains("| small | 20 |"),
        "{md}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Per model</h2>"));
}

/// An upstream that records each request's `x-tenant` header and answers a short
/// non-streamed completion.
async fn recording_upstream() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                let mut got = Vec::new();
                loop {
                    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n");
                    if let Some(end) = head_end {
                        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if got.len() >= end + 4 + len {
                            let tenant = head
                                .lines()
                                .find_map(|l| l.strip_prefix("x-tenant:"))
                                .map(|v| v.trim().to_owned());
                            // The load's requests (the replay also GETs /v1/models and
                            // a version endpoint for its reproducibility record).
                            if head.starts_with("post ") {
                                log.lock().unwrap().push(tenant);
                            }
                            got.drain(..end + 4 + len);
                            let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
                            let resp = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if conn.write_all(resp.as_bytes()).await.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_hash_is_sent_in_the_configured_header_only() {
    let _serial = crate::common::SERIAL.lock().await;
    let (url, seen) = recording_upstream().await;
    let tmp = TempDir::new("tenant-header");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir));
    let run = |config: Option<&Path>, out: &str| -> Vec<String> {
        let mut list: Vec<String> = [
            "--profile",
            profile.to_str().unwrap(),
            "--target",
            &url,
            "--mode",
            "trace",
            "--warmup",
            "0s",
            "--out",
            dir.join(out).to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(c) = config {
            list.extend(["--config".to_owned(), c.to_str().unwrap().to_owned()]);
        }
        list
    };
    let with = run(Some(&config), "with");
    let with: Vec<&str> = with.iter().map(String::as_str).collect();
    replay::execute(&args(&with), std::future::pending())
        .await
        .unwrap();
    let tenants = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(tenants.len(), 40);
    let gold = tenants
        .iter()
        .filter(|t| t.as_deref() == Some("t-gold"))
        .count();
    let free = tenants
        .iter()
        .filter(|t| t.as_deref() == Some("t-free"))
        .count();
    assert_eq!((gold, free), (20, 20), "{tenants:?}");
    // Without a tenant header configured, none is sent.
    let without = run(None, "without");
    let without: Vec<&str> = without.iter().map(String::as_str).collect();
    replay::execute(&args(&without), std::future::pending())
        .await
        .unwrap();
    let tenants = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(tenants.len(), 40);
    assert!(tenants.iter().all(Option::is_none), "{tenants:?}");
}
