//! `goodput profile filter` (the binary, on a file with `blocks` lines) and a replay of
//! long and short requests mixed as recorded: short requests' TTFT is split by whether a
//! long request was in flight.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::Cli;
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use clap::Parser;
use goodput::replay::{self};
use serde_json::Value;

/// 40 requests 20 ms apart; every fourth is long (20 000 input tokens, ~80 KB of prompt),
/// each with a `blocks` line before its first use of an id.
fn write_profile(dir: &Path) -> PathBuf {
    let mut lines = vec![
        r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"5a1700000000beef","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#.to_owned(),
    ];
    for i in 0..40u32 {
        lines.push(format!(
            r#"{{"type":"blocks","first_id":{i},"keys":["{:016x}"]}}"#,
            u64::from(i) + 0xab00
        ));
        let input = if i % 4 == 0 { 20_000 } else { 300 };
        lines.push(format!(
            r#"{{"t_ms":{},"model":"sim-model","api":"chat_completions","stream":true,"input_tokens":{input},"input_tokens_source":"usage","output_tokens":40,"output_tokens_source":"usage","max_tokens":null,"outcome":"ok","status":200,"slo_class":"default","slo_met":true,"ttft_ms":20.0,"tpot_ms":2.0,"e2e_ms":100.0,"hash_ids":[{i}]}}"#,
            i * 20
        ));
    }
    let path = dir.join("profile.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn goodput(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn filter_writes_a_profile_of_the_kept_requests_and_their_blocks() {
    let tmp = TempDir::new("filter");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let long = dir.join("long.jsonl");
    let out = goodput(&[
        "profile",
        "filter",
        "--input-tokens",
        "4096..",
        "--model",
        "sim-model",
        "-o",
        long.to_str().unwrap(),
        profile.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("kept 10 of 40 requests (10 blocks lines)"),
        "{err}"
    );
    let text = std::fs::read_to_string(&long).unwrap();
    assert_eq!(text.lines().count(), 1 + 10 + 10);
    // The filtered file reads back cleanly: 10 requests, no notes about skipped lines.
    let out = goodput(&["profile", "summarize", "--json", long.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["requests"], 10, "{s}");
    assert_eq!(s["input_tokens"]["p50"], 20_000.0, "{s}");
    // Bad input: a range the wrong way round, a file that is not a profile.
    let out = goodput(&[
        "profile",
        "filter",
        "--input-tokens",
        "9..1",
        profile.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let not = dir.join("not.jsonl");
    std::fs::write(&not, "{\"t_ms\":1}\n").unwrap();
    let out = goodput(&["profile", "filter", not.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("header"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_requests_are_split_by_long_ones_in_flight() {
    let (_sim, url) = start_sim(fast_sim(20.0, 2.0)).await;
    let tmp = TempDir::new("short-long");
    let dir = tmp.path();
    let profile = write_profile(dir);
    let out = dir.join("report");
    let a = Cli::try_parse_from([
        "replay",
        "--quiet",
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--mode",
        "trace",
        "--warmup",
        "0s",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let s = &r["overall"]["short_ttft_ms"];
    eprintln!("short TTFT: {s}");
    assert_eq!(s["short_max_input_tokens"], 1024);
    let (with, without) = (
        s["with_long_in_flight"]["count"].as_u64().unwrap(),
        s["without"]["count"].as_u64().unwrap(),
    );
    // A long request runs ~100 ms and one starts every 80 ms: most short ones see one.
    assert!(with > 0, "{s}");
    assert_eq!(with + without, 30, "{s}");
    assert!(r["steps"][0]["short_ttft_ms"]["with_long_in_flight"]["p50"].is_number());
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Short requests beside long ones"), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Short requests beside long ones</h2>"));
}
