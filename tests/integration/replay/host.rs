//! `--node-metrics`: a node_exporter stand-in over loopback serves the real text format
//! (`fixtures/node_exporter.prom`, node_exporter 1.x's names and layout); its figures
//! reach `steps[].resources.host` and `resources.host`, and memory available below
//! `--host-memory-min-share` fails the `resources` gate.

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;

use super::{
    gates::{parsed, steps},
    read_json,
};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self, EXIT_FAIL, EXIT_PASS};

const FIXTURE: &str = include_str!("fixtures/node_exporter.prom");
/// The fixture's `node_memory_MemTotal_bytes`: 64 GiB.
const TOTAL: f64 = 68_719_476_736.0;

/// A node_exporter stand-in: `available` of the memory available; each scrape one more
/// CPU second, a quarter of it busy.
async fn node_exporter(available: f64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let scrapes = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let count = scrapes.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let n = count.fetch_add(1, Ordering::SeqCst) as f64;
                    let text = FIXTURE
                        .replace("{IDLE}", &format!("{}", 1000.0 + 0.75 * n))
                        .replace("{USER}", &format!("{}", 200.0 + 0.25 * n))
                        .replace("{AVAILABLE}", &format!("{:e}", (available * TOTAL).round()));
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text)))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_figures_reach_the_report_and_low_memory_fails_resources() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("host");
    let dir = tmp.path();
    let (roomy, tight) = (node_exporter(0.5).await, node_exporter(0.02).await);
    let mut reports = Vec::new();
    for (out, node) in [("roomy", &roomy), ("tight", &tight)] {
        let list = steps(
            dir,
            &url,
            out,
            &["--node-metrics", node, "--no-engine-metrics"],
        );
        // Steps of 2 s: every window holds a scrape (one a second) however late one is.
        let mut list = list;
        let d = list.iter().position(|s| s == "--step-duration").unwrap();
        list[d + 1] = "2s".into();
        let done = replay::execute(&parsed(&list), std::future::pending())
            .await
            .unwrap();
        reports.push((done.exit_code(), read_json(&done.dir.join("report.json"))));
    }
    let (code, r) = &reports[0];
    let host = &r["resources"]["host"];
    eprintln!("{host:#}\n{}", r["gates"]["resources"]);
    assert_eq!(*code, EXIT_PASS, "{}", r["gates"]);
    assert_eq!(host["memory_available_min_share"], 0.5, "{host}");
    let busy = host["cpu_busy_mean"].as_f64().unwrap();
    // user 0.25 of each CPU second, system and the rest unchanged.
    assert!((busy - 0.25).abs() < 1e-6, "{busy}");
    assert_eq!(host["network_errors"], 0.0);
    assert_eq!(host["hosts"], 1);
    assert_eq!(host["failed_scrapes"], 0);
    assert_eq!(host["absent"], serde_json::json!([]));
    let step = &r["steps"][0]["resources"]["host"];
    assert_eq!(step["memory_available_min_share"], 0.5, "{step}");
    let g = &r["gates"]["resources"];
    assert_eq!(
        (g["state"].as_str(), g["judged"].as_bool()),
        (Some("pass"), Some(true))
    );
    assert_eq!(r["contract"]["gates"]["host_memory_min_share"], 0.05);
    let md = std::fs::read_to_string(dir.join("roomy/report.md")).unwrap();
    assert!(md.contains("## Hosts"), "{md}");
    assert!(md.contains("| all | 1 | 50.0 | 25.0 | 0 |"), "{md}");
    assert!(!md.contains("## GPUs"), "no --gpu-metrics: {md}");

    let (code, r) = &reports[1];
    let g = &r["gates"]["resources"];
    assert_eq!(*code, EXIT_FAIL, "{g}");
    assert_eq!(g["state"], "fail");
    assert!(
        g["reason"]
            .as_str()
            .unwrap()
            .contains("host memory available fell to 2.0% (minimum 5.0%)"),
        "{g}"
    );
}
