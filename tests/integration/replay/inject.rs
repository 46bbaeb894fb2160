//! `goodput replay --inject --burst` against the in-process simulator with a context
//! limit: over-long prompts and malformed bodies are answered 400, empty ones 200, and
//! the report separates them (and the burst's requests) from the steps' numbers.

use std::path::{Path, PathBuf};

use super::{Cli, args};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use clap::Parser;
use goodput::replay::{self};
use serde_json::Value;

fn write_profile(dir: &Path) -> PathBuf {
    super::twenty_requests(dir, 8, "interactive", true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abnormal_requests_and_bursts_are_reported_apart() {
    let _serial = crate::common::SERIAL.lock().await;
    let mut cfg = fast_sim(5.0, 1.0);
    cfg.max_input_tokens = Some(1000);
    let (sim, url) = start_sim(cfg).await;
    let tmp = TempDir::new("inject");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--mode",
        "steps",
        "--concurrency",
        "2,4",
        "--warmup",
        "200ms",
        "--step-duration",
        "2s",
        "--inject",
        "over_long=0.1,empty=0.1",
        "--inject",
        "malformed=0.1",
        "--context-tokens",
        "1000",
        "--burst",
        "100:1s",
        "--out",
        out.to_str().unwrap(),
    ]);
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let inj = &r["injection"];
    eprintln!("injection: {inj:#}");
    let kind = |k: &str| {
        inj["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["kind"] == k)
            .unwrap_or_else(|| panic!("no {k} in {inj}"))
            .clone()
    };
    let long = kind("over_long");
    let n = long["requests"].as_u64().unwrap();
    assert!(n >= 3, "{long}");
    assert_eq!(long["statuses"]["400"].as_u64(), Some(n), "{long}");
    assert_eq!(long["outcomes"]["client_error"].as_u64(), Some(n));
    assert!(long["answer_ms"]["p50"].as_f64().is_some());
    let bad = kind("malformed");
    assert_eq!(
        bad["statuses"]["400"].as_u64(),
        bad["requests"].as_u64(),
        "{bad}"
    );
    let empty = kind("empty");
    assert_eq!(
        empty["statuses"]["200"].as_u64(),
        empty["requests"].as_u64()
    );
    let burst = kind("burst");
    assert!(burst["requests"].as_u64().unwrap() >= 20, "{burst}");
    // Every over-long prompt the simulator saw was refused, by its own count.
    let refused = sim.truth().iter().filter(|t| t.status == 400).count() as u64;
    assert!(refused >= n + bad["requests"].as_u64().unwrap());
    // Steps hold the profile's requests only: no 400s among them.
    let steps = r["steps"].as_array().unwrap();
    let mut normal = 0;
    for s in steps {
        assert!(s["outcomes"]["client_error"].is_null(), "{s}");
        normal += s["requests"].as_u64().unwrap();
    }
    let (beside, alone) = (
        inj["normal_beside_injected"]["requests"].as_u64().unwrap(),
        inj["normal_alone"]["requests"].as_u64().unwrap(),
    );
    assert_eq!(beside + alone, normal);
    let b = &inj["burst"];
    assert_eq!(b["windows"].as_array().unwrap().len(), 2);
    let w = &b["windows"][0];
    // Centred in the first step's 2 s window after 0.2 s of warm-up.
    assert!((w[1].as_f64().unwrap() - w[0].as_f64().unwrap() - 1.0).abs() < 1e-6);
    assert!(w[0].as_f64().unwrap() >= 0.7);
    let (during, outside) = (
        b["normal_during"]["requests"].as_u64().unwrap(),
        b["normal_outside"]["requests"].as_u64().unwrap(),
    );
    assert!(during > 0 && outside > 0);
    assert_eq!(during + outside, normal);
    let log = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    for k in ["over_long", "empty", "malformed", "burst"] {
        assert!(log.contains(&format!("\"inject\":\"{k}\"")), "{k}");
    }
    // The abnormal_input gate: every injected request got its 400 from the simulator, and
    // its isolation numbers are the injection report's.
    let g = &r["gates"]["abnormal_input"];
    assert_eq!(g["judged"], true, "{g}");
    assert_eq!(g["actual"], 1.0, "{g}");
    assert_eq!(
        g["isolation"]["attainment_alone"],
        inj["normal_alone"]["attainment"]
    );
    assert_eq!(g["isolation"]["max_drop_points"], 5.0);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Abnormal input and bursts"), "{md}");
    assert!(md.contains("| over_long | "), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Abnormal input and bursts</h2>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_without_a_context_limit_is_refused_before_any_load() {
    let _serial = crate::common::SERIAL.lock().await;
    let (sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("inject-bad");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--inject",
        "over_long=0.1",
        "--out",
        dir.join("r").to_str().unwrap(),
    ]);
    let err = replay::execute(&a, std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--context-tokens"), "{err}");
    assert!(sim.truth().is_empty());
    let cli = Cli::try_parse_from(["replay", "--profile", "p", "--target", "x", "--burst", "5"]);
    assert!(cli.is_err());
}
