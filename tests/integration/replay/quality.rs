//! `goodput replay --probes`: quality probes mixed into the load against the in-process
//! simulator (whose answers are English words): a probe expecting its words passes, one
//! expecting "Paris" or JSON fails, and the report says so per step, with finish reasons.

use std::path::{Path, PathBuf};

use super::args;
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self};
use serde_json::Value;

fn write_profile(dir: &Path) -> PathBuf {
    super::twenty_requests(dir, 8, "interactive", true)
}

const PROBES: &str = r#"{"name":"words","body":{"messages":[{"role":"user","content":"Say some words, PROBE-SECRET-1"}],"max_tokens":5,"stream":true},"expect":{"regex":"^([a-z]+ )+$"}}
{"name":"capital","api":"completions","body":{"prompt":"The capital of France is PROBE-SECRET-2","max_tokens":5},"expect":{"contains":"Paris"}}
{"name":"json","body":{"messages":[{"role":"user","content":"Answer in JSON"}],"max_tokens":5},"expect":{"json_schema":{"type":"object"}}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_pass_and_fail_per_step() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("probes");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let probes = dir.join("probes.jsonl");
    std::fs::write(&probes, PROBES).unwrap();
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--mode",
        "steps",
        "--concurrency",
        "1,2",
        "--warmup",
        "100ms",
        "--step-duration",
        "1s",
        "--probes",
        probes.to_str().unwrap(),
        "--probe-share",
        "0.25",
        "--out",
        out.to_str().unwrap(),
    ]);
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let q = &r["quality"];
    let (probes_n, passed) = (q["probes"].as_u64().unwrap(), q["passed"].as_u64().unwrap());
    eprintln!("quality: {probes_n} probes, {passed} passed");
    // A third of the probes expect the simulator's words; the others cannot pass.
    assert!(probes_n >= 6, "{q}");
    assert!(passed >= 1 && passed < probes_n, "{q}");
    assert_eq!(
        q["pass_rate"].as_f64().unwrap(),
        passed as f64 / probes_n as f64
    );
    let failures = q["failures"].as_array().unwrap();
    assert_eq!(failures.len() as u64, probes_n - passed);
    for f in failures {
        let name = f["name"].as_str().unwrap();
        let reason = f["reason"].as_str().unwrap();
        match name {
            "capital" => assert_eq!(reason, "does not contain \"Paris\""),
            "json" => assert!(reason.starts_with("not JSON"), "{reason}"),
            other => panic!("probe {other} failed: {f}"),
        }
        assert!(!f["answer"].as_str().unwrap().is_empty(), "{f}");
        assert!(f["step"].as_str().unwrap().starts_with("c="));
    }
    let mut step_probes = 0;
    for s in r["steps"].as_array().unwrap() {
        step_probes += s["quality"]["probes"].as_u64().unwrap();
        // Every answer stopped at max_tokens: the simulator reports `length`.
        assert!(s["finish_reasons"]["length"].as_u64().unwrap() > 0, "{s}");
        assert!(s["length_share"].as_f64().unwrap() > 0.5);
    }
    assert_eq!(step_probes, probes_n);
    // Probe prompts are not in the request log; answers stay in the report directory.
    let requests = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    assert!(!requests.contains("PROBE-SECRET"));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Quality and finish reasons"), "{md}");
    assert!(md.contains("capital (c="), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Quality and finish reasons</h2>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_probe_file_stops_the_run_before_any_load() {
    let _serial = crate::common::SERIAL.lock().await;
    let (sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("bad-probes");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let probes = dir.join("probes.jsonl");
    std::fs::write(&probes, "{\"body\":{},\"expect\":{\"regex\":\"(\"}}\n").unwrap();
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--probes",
        probes.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = replay::execute(&a, std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("line 1: expect.regex"), "{err}");
    assert!(sim.truth().is_empty());
    assert!(!out.join("report.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_give_mean_and_confidence_interval_per_level() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("repeat");
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
        "1,2",
        "--repeat",
        "3",
        "--inject",
        "empty=0.2",
        "--warmup",
        "50ms",
        "--step-duration",
        "300ms",
        "--out",
        out.to_str().unwrap(),
    ]);
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let labels: Vec<&str> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["c=1 #1", "c=1 #2", "c=1 #3", "c=2 #1", "c=2 #2", "c=2 #3"]
    );
    let reps = r["repeats"].as_array().unwrap();
    assert_eq!(reps.len(), 2);
    for (rep, c) in reps.iter().zip([1, 2]) {
        assert_eq!(rep["concurrency"], c);
        assert_eq!(rep["runs"], 3);
        let g = &rep["effective_goodput_tokens_per_s"];
        let values: Vec<f64> = g["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(values.len(), 3);
        let mean = g["mean"].as_f64().unwrap();
        assert!((mean - values.iter().sum::<f64>() / 3.0).abs() < 1e-9);
        assert!(
            g["ci95_low"].as_f64().unwrap() <= mean && mean <= g["ci95_high"].as_f64().unwrap()
        );
    }
    // The SLO gate is judged on each repeat of the judged level (c=1 here).
    let g = &r["gates"]["slo"]["repeats"];
    assert_eq!(g["values"].as_array().unwrap().len(), 3, "{g}");
    assert_eq!(g["passed"].as_array().unwrap().len(), 3, "{g}");
    assert_eq!(g["ci"]["n"].as_u64().unwrap(), 3, "{g}");
    assert_eq!(r["contract"]["load"]["repeat"], 3);
    // So is the abnormal_input gate: the simulator answers every empty request with a 400.
    let g = &r["gates"]["abnormal_input"];
    assert_eq!(g["repeats"]["values"].as_array().unwrap().len(), 3, "{g}");
    assert_eq!(g["repeats"]["worst"], 1.0, "{g}");
    // A 300 ms step holds far fewer than the 100 requests a P99 needs.
    assert!(
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("too few for its percentiles")),
        "{}",
        r["notes"]
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("## Repeats: mean [95% confidence interval]"),
        "{md}"
    );
    assert!(md.contains("| c=2 | 3 | "), "{md}");
}
