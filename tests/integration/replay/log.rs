//! `requests.jsonl` is written as requests finish: lines are on disk while the run is
//! still going (the run below is stopped only once they are), and the log agrees with the
//! report: one line per request sent, and per step as many `measured` lines as the step
//! counted requests, the step cut short by the stop included.

use std::{collections::BTreeMap, path::Path, time::Duration};

use super::args;
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self};
use serde_json::Value;

fn write_profile(dir: &Path) -> std::path::PathBuf {
    super::twenty_requests(dir, 8, "default", false)
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_grows_during_the_run_and_agrees_with_the_report() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("log");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--concurrency",
        "2,4",
        "--warmup",
        "100ms",
        "--step-duration",
        "60s",
        "--no-engine-metrics",
        "--out",
        out.to_str().unwrap(),
    ]);
    // Stop the run once the log on disk holds 200 lines: the first step has a minute of
    // window left, so only a streamed log can get there.
    let log = out.join("requests.jsonl");
    let watched = log.clone();
    let stop = async move {
        poll_until!("200 lines in the log", Duration::from_secs(120), {
            (lines(&watched) >= 200).then_some(())
        });
    };
    let done = replay::execute(&a, stop).await.unwrap();
    let r = &done.report;
    assert!(r.interrupted);
    let text = std::fs::read_to_string(&log).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(records.len() >= 200);
    assert_eq!(records.len() as u64, r.generator.requests_sent);
    let mut measured: BTreeMap<u64, u64> = BTreeMap::new();
    for rec in &records {
        if rec["measured"] == true {
            *measured.entry(rec["step"].as_u64().unwrap()).or_default() += 1;
        }
    }
    assert_eq!(r.steps.len(), 1, "stopped in the first step");
    let step = &r.steps[0];
    assert!(step.cut_short);
    assert!(step.stats.requests >= 150, "{}", step.stats.requests);
    assert_eq!(measured.get(&0).copied().unwrap_or(0), step.stats.requests);
    assert_eq!(measured.len(), 1);
    // Cancelled at the stop: in the log, never measured.
    for rec in records.iter().filter(|r| r["outcome"] == "client_abort") {
        assert_eq!(rec["measured"], false, "{rec}");
    }
    assert_eq!(step.stats.client_aborts, 0);
}
