//! `goodput replay --fault-at --fault-cmd`: the candidate is a `goodput sim` process that
//! the fault command kills (SIGKILL, like a crash) and, in the recovering case, starts
//! again on the same port after an outage of one second; the report's `recovery` is
//! checked against what the command did.
#![expect(
    clippy::unwrap_used,
    reason = "integration tests: a failed step must stop the test"
)]

use std::path::{Path, PathBuf};

use super::{SimProcess, args, read_json};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self, ReplayArgs};
use serde_json::Value;

/// Twenty streamed chat requests of 300 input and 10 output tokens, 50 ms apart.
fn write_profile(dir: &Path) -> PathBuf {
    super::twenty_requests(dir, 10, "interactive", true)
}

/// One class: TTFT within 500 ms (the simulator answers in 20) for 90% of requests.
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("slo.toml");
    std::fs::write(
        &path,
        "[slo]\nmin_samples = 5\n\n[[slo.class]]\nname = \"interactive\"\nmatch = { api = \"chat\" }\n\
         ttft_ms = 500\nattainment = 0.9\n",
    )
    .unwrap();
    path
}

fn soak(profile: &Path, config: &Path, url: &str, out: &Path, extra: &[&str]) -> ReplayArgs {
    let mut a = vec![
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        url,
        "--config",
        config.to_str().unwrap(),
        "--mode",
        "soak",
        "--soak-rate",
        "25",
        "--warmup",
        "500ms",
        "--step-duration",
        "1s",
        "--idle-timeout",
        "5s",
        "--out",
        out.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    args(&a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_target_is_seen_failing_and_recovering() {
    let _serial = crate::common::SERIAL.lock().await;
    let tmp = TempDir::new("recovery");
    let dir = tmp.path();
    let sim = SimProcess::start(dir, "");
    sim.ready().await;
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let fault = sim.fault_cmd(true);
    let a = soak(
        &profile,
        &config,
        &sim.url(),
        &out,
        &[
            "--soak-duration",
            "9s",
            "--fault-at",
            "3s",
            "--fault-cmd",
            &fault,
            "--recovery-deadline",
            "5s",
            "--engine-metrics-interval",
            "250ms",
        ],
    );
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    let rec = &r["recovery"];
    eprintln!("recovery: {rec:#}");
    // The engine's metrics went away for the second it was down and came back from zero:
    // failed scrapes, and the restart seen and skipped in the attribution.
    let at = &r["attribution"];
    assert!(at["failed_scrapes"].as_u64().unwrap() >= 1, "{at}");
    assert_eq!(at["overall"]["engine_restarted"], true, "{at}");
    assert!(
        at["overall"]["engine_requests"].as_u64().unwrap() > 0,
        "{at}"
    );
    assert!(rec["fault_at_s"].as_f64().unwrap() >= 3.0);
    assert_eq!(rec["planned_fault_at_s"], 3.0);
    assert_eq!(rec["fault_exit_code"], 0, "{}", rec["fault_error"]);
    // The command slept a second between the kill and the new start.
    assert!(rec["fault_finished_s"].as_f64().unwrap() >= rec["fault_at_s"].as_f64().unwrap() + 1.0);
    assert_eq!(rec["attainment_target"], 0.9);
    assert!(rec["baseline_attainment"].as_f64().unwrap() >= 0.9, "{rec}");
    // At 25/s, the second without a listener fails about 25 requests.
    assert!(rec["failed_requests"].as_u64().unwrap() >= 10, "{rec}");
    assert!(rec["min_attainment"].as_f64().unwrap() < 0.9);
    assert!(
        rec["dip_goodput_tokens_per_s"].as_f64().unwrap()
            < rec["baseline_goodput_tokens_per_s"].as_f64().unwrap()
    );
    let t = rec["recovery_time_s"].as_f64().unwrap();
    assert!(
        t >= 1.0,
        "the first second after the fault had no target: {t}"
    );
    assert_eq!(rec["recovered"], t <= 5.0);
    let outcomes = rec["failed_outcomes"].as_object().unwrap();
    assert!(!outcomes.is_empty());
    let sum: u64 = outcomes.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(sum, rec["failed_requests"].as_u64().unwrap());
    // Intervals from the baseline through the recovery.
    let bins = rec["bins"].as_array().unwrap();
    assert!(bins.iter().any(|b| b["attainment"].as_f64() == Some(0.0)));
    assert!(bins.first().unwrap()["t_s"].as_f64().unwrap() < 3.0);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Recovery"), "{md}");
    assert!(md.contains("failed requests: "), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Recovery</h2>"));
    assert!(html.contains("Attainment around the fault"));
    assert!(out.join("fault-cmd.log").exists());
    // The restarted simulator serves again after the run.
    sim.ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_stays_down_never_recovers() {
    let _serial = crate::common::SERIAL.lock().await;
    let tmp = TempDir::new("no-recovery");
    let dir = tmp.path();
    let sim = SimProcess::start(dir, "");
    sim.ready().await;
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let fault = sim.fault_cmd(false);
    let a = soak(
        &profile,
        &config,
        &sim.url(),
        &out,
        &[
            "--soak-duration",
            "5s",
            "--fault-at",
            "2s",
            "--fault-cmd",
            &fault,
        ],
    );
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    let rec = &done.report.recovery.as_ref().unwrap();
    assert!(!rec.recovered);
    assert_eq!(rec.recovery_time_s, None);
    assert_eq!(rec.fault_exit_code, Some(0));
    // Every request sent after the fault failed: about 25 a second for 3 s.
    assert!(rec.failed_requests >= 30, "{rec:?}");
    assert_eq!(rec.dip_attainment, Some(0.0));
    assert_eq!(done.report.verdict["interactive"], "fail");
    // The recovery gate fails on its own, whatever the attainment did, and the run exits 1.
    assert_eq!(done.exit_code(), replay::EXIT_FAIL);
    let r = read_json(&out.join("report.json"));
    let g = &r["gates"]["recovery"];
    assert_eq!(g["pass"], false, "{g}");
    assert_eq!(g["target"], 60.0);
    assert_eq!(g["actual"], Value::Null);
    assert!(
        g["reason"].as_str().unwrap().contains("not recovered"),
        "{g}"
    );
    assert_eq!(r["passed"], false);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("recovered: NO"), "{md}");
    assert!(md.contains("| recovery | **fail** |"), "{md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_due_after_the_run_never_runs_and_says_so() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(20.0, 2.0)).await;
    let tmp = TempDir::new("late-fault");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let marker = dir.join("ran");
    let fault = format!("touch '{}'", marker.display());
    let a = soak(
        &profile,
        &config,
        &url,
        &out,
        &[
            "--soak-duration",
            "1s",
            "--fault-at",
            "1h",
            "--fault-cmd",
            &fault,
        ],
    );
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    assert_eq!(r["recovery"]["fault_at_s"], Value::Null);
    assert_eq!(r["recovery"]["recovered"], false);
    assert!(!marker.exists());
    assert!(
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("the run ended first"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fault_command_is_reported() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(20.0, 2.0)).await;
    let tmp = TempDir::new("bad-fault");
    let dir = tmp.path();
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let a = soak(
        &profile,
        &config,
        &url,
        &out,
        &[
            "--soak-duration",
            "2s",
            "--fault-at",
            "1s",
            "--fault-cmd",
            "echo no such replica >&2; exit 7",
        ],
    );
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    assert_eq!(r["recovery"]["fault_exit_code"], 7);
    assert_eq!(r["recovery"]["failed_requests"], 0);
    assert_eq!(
        std::fs::read_to_string(out.join("fault-cmd.log")).unwrap(),
        "no such replica\n"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("exited 7 after"), "{md}");
}

/// A simulator saying `--engine-version 0.31.0`, ready, and `start2.sh` beside its
/// `start.sh` to start 0.32.0 in its place.
async fn two_versions(dir: &Path) -> SimProcess {
    let sim = SimProcess::start(dir, "--engine-version 0.31.0");
    sim.ready().await;
    let start = std::fs::read_to_string(dir.join("start.sh")).unwrap();
    std::fs::write(dir.join("start2.sh"), start.replace("0.31.0", "0.32.0")).unwrap();
    sim
}

/// The fault command swaps the target for another version of it (a rollout, a canary
/// that flipped): the run fails, naming both versions, and the report keeps what the
/// target said at the start and at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_swapped_during_the_run_fails_it_naming_both_versions() {
    let _serial = crate::common::SERIAL.lock().await;
    let tmp = TempDir::new("swapped");
    let dir = tmp.path();
    let sim = two_versions(dir).await;
    let d = dir.display();
    let fault = format!("kill -9 $(cat '{d}/sim.pid'); sleep 1; sh '{d}/start2.sh'");
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let a = soak(
        &profile,
        &config,
        &sim.url(),
        &out,
        &[
            "--soak-duration",
            "5s",
            "--fault-at",
            "1s",
            "--fault-cmd",
            &fault,
            "--recovery-deadline",
            "3s",
        ],
    );
    let finished = replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    let x = &r["reproducibility"];
    assert_eq!(x["target"]["version"]["version"], "0.31.0", "{x}");
    assert_eq!(x["target_at_end"]["version"]["version"], "0.32.0", "{x}");
    let gate = &r["gates"]["resources"];
    assert_eq!(gate["pass"], false, "{gate}");
    let reason = gate["reason"].as_str().unwrap();
    assert!(
        reason.contains("target changed during the run: version 0.31.0 → 0.32.0"),
        "{reason}"
    );
    assert_eq!(finished.exit_code(), 1);
    assert!(finished.verdict_line().starts_with("FAILED"));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("version 0.31.0 → 0.32.0"), "{md}");
}

/// Swapped and swapped back before the end (a canary rolled back): the read at a step
/// boundary saw it, and the run fails all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_swapped_and_rolled_back_during_the_run_still_fails_it() {
    let _serial = crate::common::SERIAL.lock().await;
    let tmp = TempDir::new("rolled-back");
    let dir = tmp.path();
    let sim = two_versions(dir).await;
    let d = dir.display();
    let fault = format!(
        "kill -9 $(cat '{d}/sim.pid'); sleep 1; sh '{d}/start2.sh'; sleep 4; \
         kill -9 $(cat '{d}/sim.pid'); sleep 1; sh '{d}/start.sh'"
    );
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let a = soak(
        &profile,
        &config,
        &sim.url(),
        &out,
        &[
            "--soak-duration",
            "10s",
            "--fault-at",
            "1s",
            "--fault-cmd",
            &fault,
            "--recovery-deadline",
            "3s",
        ],
    );
    let finished = replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    let x = &r["reproducibility"];
    assert_eq!(x["target_at_end"]["version"]["version"], "0.31.0", "{x}");
    let during = x["target_changes_during"].as_array().unwrap();
    assert!(
        during.iter().all(|d| d["identity"]["version"] == "0.32.0"),
        "{x}"
    );
    let reason = r["gates"]["resources"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("target changed during the run: version 0.31.0 → 0.32.0 (read at"),
        "{reason}"
    );
    assert_eq!(finished.exit_code(), 1);
}

/// The same target before and after (restarted, not swapped): nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_answers_the_same_at_the_end_is_unchanged() {
    let _serial = crate::common::SERIAL.lock().await;
    let tmp = TempDir::new("same");
    let dir = tmp.path();
    let sim = SimProcess::start(dir, "--engine-version 0.31.0");
    sim.ready().await;
    let (profile, config) = (write_profile(dir), write_config(dir));
    let out = dir.join("report");
    let a = soak(
        &profile,
        &config,
        &sim.url(),
        &out,
        &["--soak-duration", "2s"],
    );
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    let x = &r["reproducibility"];
    assert_eq!(x["target_at_end"]["version"]["version"], "0.31.0", "{x}");
    let reason = r["gates"]["resources"]["reason"].to_string();
    assert!(!reason.contains("target changed"), "{reason}");
}
