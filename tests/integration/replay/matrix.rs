//! `goodput replay --compare A B C`: three runs against the simulator (one, two and four
//! "cards" by their contracts) put in a matrix with P99 rows and scaling efficiency, from
//! the command line as a user runs it, across precisions (the system is what a matrix
//! varies); a run of other traffic is refused by name.

use std::{path::Path, process::Command};

use super::Cli;
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use clap::Parser;
use goodput::replay::{self};
use serde_json::Value;

fn write_profile(path: &Path, requests: u32) {
    let mut text = String::from(
        r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"5a1700000000beef","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#,
    );
    text.push('\n');
    for i in 0..requests {
        text.push_str(&format!(
            r#"{{"t_ms":{},"model":"sim-model","api":"chat_completions","stream":true,"input_tokens":300,"input_tokens_source":"usage","output_tokens":8,"output_tokens_source":"usage","max_tokens":null,"outcome":"ok","status":200,"slo_class":"default","slo_met":true,"ttft_ms":20.0,"tpot_ms":2.0,"e2e_ms":40.0}}"#,
            i * 50
        ));
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runs_make_a_matrix_with_scaling_efficiency() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("matrix");
    let dir = tmp.path();
    let (profile, other) = (dir.join("p.jsonl"), dir.join("other.jsonl"));
    write_profile(&profile, 20);
    write_profile(&other, 21);
    let mut reports = Vec::new();
    for (cards, p) in [
        ("1", &profile),
        ("2", &profile),
        ("4", &profile),
        ("4", &other),
    ] {
        let out = dir.join(format!("run-{cards}-{}", reports.len()));
        let list = [
            "replay",
            "--quiet",
            "--no-engine-metrics",
            "--profile",
            p.to_str().unwrap(),
            "--target",
            &url,
            // The same load for every run: how it was measured must not differ.
            "--concurrency",
            "2",
            "--warmup",
            "100ms",
            "--step-duration",
            "500ms",
            "--contract",
            &format!("cards={cards}"),
            "--contract",
            "hardware=sim",
            // What a matrix exists to vary: not refused.
            "--contract",
            if cards == "4" {
                "precision=fp8"
            } else {
                "precision=bf16"
            },
            "--out",
            out.to_str().unwrap(),
        ];
        let a = Cli::try_parse_from(list).unwrap().args;
        replay::execute(&a, std::future::pending()).await.unwrap();
        reports.push(out.join("report.json"));
    }
    let path = |i: usize| reports[i].to_str().unwrap().to_owned();
    let out = dir.join("cmp");
    let run = |files: &[String]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_goodput"));
        cmd.args(["replay", "--compare"])
            .args(files)
            .args(["--out", out.to_str().unwrap()]);
        cmd.output().unwrap()
    };
    let o = run(&[path(0), path(1), path(2)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap()).unwrap();
    let cols = m["columns"].as_array().unwrap();
    assert_eq!(cols.len(), 3);
    assert_eq!(cols[0]["scaling_efficiency"].as_f64().unwrap(), 1.0);
    let g = |i: usize| {
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(&reports[i]).unwrap()).unwrap();
        r["effective_goodput_tokens_per_s"].as_f64().unwrap()
    };
    for (i, n) in [(1usize, 2.0), (2, 4.0)] {
        let eff = cols[i]["scaling_efficiency"].as_f64().unwrap();
        assert!((eff - g(i) / (n * g(0))).abs() < 1e-9, "{eff}");
        assert_eq!(cols[i]["scaling_baseline"], path(0));
    }
    let p99 = m["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "TTFT p99 ms")
        .unwrap();
    assert!(
        p99[1].as_array().unwrap().iter().all(Value::is_number),
        "{p99}"
    );
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(md.contains("| scaling efficiency | 1.000 |"), "{md}");
    assert!(
        std::fs::read_to_string(out.join("compare.html"))
            .unwrap()
            .contains("<h2>Runs side by side</h2>")
    );
    // Other traffic: refused, naming the run and the field; accepted when allowed.
    let o = run(&[path(0), path(1), path(3)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&path(3)) && err.contains("profile.hash"),
        "{err}"
    );
    let mut files = vec![path(0), path(1), path(3)];
    files.push("--allow-different".into());
    let o = run(&files);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(md.contains("Key contract fields differ"), "{md}");
}
