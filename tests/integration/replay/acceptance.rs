//! One replay that answers a whole acceptance: a capture of short and long requests from
//! two tenants is filtered to its long-context part (`goodput profile filter`), and that
//! profile is soaked against a `goodput sim` process that the fault command kills and
//! starts again, with quality probes, abnormal input, a burst, contract fields, the cost
//! model and a tenant class. The report must answer every question of the acceptance, in
//! report.json, report.md and report.html alike.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "integration tests: a failed step must stop the test"
)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::{SimProcess, args, read_json};
use crate::common::temp::TempDir;
use goodput::replay;
use serde_json::Value;

/// 60 requests 20 ms apart from tenants `t-gold` and `t-free`; every third is long (3,000
/// input tokens, about 12 KB of prompt), the rest 200 tokens.
fn write_capture(dir: &Path) -> PathBuf {
    let mut lines = vec![super::header(r#"{"engine":"sim"}"#)];
    for i in 0..60u64 {
        let input = if i % 3 == 0 { 3_000 } else { 200 };
        let tenant = if i % 2 == 0 { "t-gold" } else { "t-free" };
        let extra = format!(r#","tenant":"{tenant}","hash_ids":[]"#);
        lines.push(super::request(
            i * 20,
            "sim-model",
            input,
            10,
            "default",
            &extra,
        ));
    }
    let path = dir.join("capture.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Gold must see its first token within 1 s, everything else within 2 s (the simulator
/// takes 20 ms: both hold but for the fault). The guides' cost model: 4/h of hardware, 26,280
/// one-time over 12 months (3/h), 10 kW at 0.2 per kWh (2/h), a quarter idle: 12/h.
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("acceptance.toml");
    std::fs::write(
        &path,
        "[slo]\nmin_samples = 5\ntenant_header = \"x-tenant\"\n\n[[slo.class]]\nname = \"gold\"\n\
         match = { tenant = \"t-gold\" }\nttft_ms = 1000\nattainment = 0.9\n\n[slo.default]\n\
         ttft_ms = 2000\nattainment = 0.9\n\n[cost]\ncurrency = \"EUR\"\nper_hour = { hardware = 4.0 }\n\
         one_time = { migration = 20000, integration = 6280 }\namortize_months = 12\nkw = 10\n\
         energy_price_per_kwh = 0.2\nidle_share = 0.25\n",
    )
    .unwrap();
    path
}

/// One probe the simulator's words pass, one no simulator can.
const PROBES: &str = r#"{"name":"words","body":{"messages":[{"role":"user","content":"Say some words"}],"max_tokens":5,"stream":true},"expect":{"regex":"^([a-z]+ )+$"}}
{"name":"capital","body":{"messages":[{"role":"user","content":"The capital of France?"}],"max_tokens":5},"expect":{"contains":"Paris"}}
"#;

fn filter_long(capture: &Path, out: &Path) {
    let run = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["profile", "filter", "--input-tokens", "2048..", "-o"])
        .arg(out)
        .arg(capture)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("kept 20 of 60 requests"), "{err}");
}

/// The object of `list` whose `key` is `name`.
fn find<'a>(list: &'a Value, key: &str, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x[key] == name)
        .unwrap_or_else(|| panic!("no {key} = {name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replay_answers_the_whole_acceptance() {
    let _serial = crate::common::SERIAL.lock().await;
    let tmp = TempDir::new("acceptance");
    let dir = tmp.path();
    // The simulator refuses prompts past 8,000 tokens, as an engine's context would.
    let sim = SimProcess::start(dir, "--max-input-tokens 8000");
    sim.ready().await;
    let long = dir.join("long.jsonl");
    filter_long(&write_capture(dir), &long);
    let config = write_config(dir);
    let probes = dir.join("probes.jsonl");
    std::fs::write(&probes, PROBES).unwrap();
    let out = dir.join("report");
    let fault = sim.fault_cmd(true);
    let a = args(&[
        "--profile",
        long.to_str().unwrap(),
        "--target",
        &sim.url(),
        "--config",
        config.to_str().unwrap(),
        "--mode",
        "soak",
        "--soak-rate",
        "20",
        "--soak-duration",
        "9s",
        "--warmup",
        "500ms",
        "--step-duration",
        "1s",
        "--idle-timeout",
        "5s",
        "--fault-at",
        "3s",
        "--fault-cmd",
        &fault,
        "--recovery-deadline",
        "5s",
        "--engine-metrics-interval",
        "250ms",
        "--probes",
        probes.to_str().unwrap(),
        "--probe-share",
        "0.1",
        "--inject",
        "over_long=0.05,malformed=0.05",
        "--context-tokens",
        "8000",
        "--contract",
        "run_id=acceptance-1",
        "--contract",
        "hardware=2 vCPU",
        "--contract",
        "cards=1",
        "--contract",
        "rack=b7",
        "--out",
        out.to_str().unwrap(),
    ]);
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));

    // The test contract: named fields, the run id and the extras.
    let c = &r["contract"];
    assert_eq!(c["run_id"], "acceptance-1", "{c}");
    assert_eq!(c["hardware"], "2 vCPU");
    assert_eq!(c["cards"], "1");
    assert_eq!(c["extra"]["rack"], "b7", "{c}");
    assert_eq!(c["load"]["mode"], "soak", "{c}");

    // The filtered profile: only long requests were replayed.
    let requests = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    let (mut normal, mut probe_lines) = (0, 0);
    for line in requests.lines() {
        let q: Value = serde_json::from_str(line).unwrap();
        if q.get("probe").is_some() {
            probe_lines += 1;
        } else if q.get("inject").is_none() && q["outcome"] == "ok" {
            assert!(q["input_tokens"].as_u64().unwrap() >= 2048, "{q}");
            normal += 1;
        }
    }
    assert!(
        normal >= 100,
        "{normal} answered profile requests in 9 s at 20/s"
    );

    // Recovery: the second without a listener failed requests; the restart served again.
    let rec = &r["recovery"];
    assert!(rec["fault_at_s"].as_f64().unwrap() >= 3.0, "{rec}");
    assert!(rec["failed_requests"].as_u64().unwrap() >= 5, "{rec}");
    let t = rec["recovery_time_s"].as_f64().unwrap();
    assert!(t >= 1.0, "{rec}");
    assert_eq!(rec["recovered"], t <= 5.0, "{rec}");

    // Quality: one probe passes, the other cannot.
    let q = &r["quality"];
    let (n, passed) = (q["probes"].as_u64().unwrap(), q["passed"].as_u64().unwrap());
    assert!(n >= 4 && passed >= 1 && passed < n, "{q}");
    assert_eq!(q["pass_rate"].as_f64().unwrap(), passed as f64 / n as f64);
    // Probes answered are judged; the log names every probe sent, answered or not.
    assert!(probe_lines >= n, "{probe_lines} probe lines, {n} judged");
    for f in q["failures"].as_array().unwrap() {
        assert_eq!(f["name"], "capital", "{f}");
    }

    // Abnormal input: over-long prompts refused by the engine's context limit, apart from
    // the profile's requests.
    let inj = &r["injection"];
    let over = find(&inj["kinds"], "kind", "over_long");
    let k = over["requests"].as_u64().unwrap();
    assert!(k >= 1, "{inj}");
    assert_eq!(over["outcomes"]["client_error"].as_u64(), Some(k), "{over}");

    // Attribution: the engine's metrics scraped, its restart seen and skipped.
    let at = &r["attribution"];
    assert_eq!(at["engine"], "vllm", "{at}");
    assert!(at["failed_scrapes"].as_u64().unwrap() >= 1, "{at}");
    assert_eq!(at["overall"]["engine_restarted"], true, "{at}");
    assert!(at["overall"]["prefill_ms"].as_f64().unwrap() > 0.0, "{at}");

    // Tenants: each tenant judged in its own class, both with a verdict; misses have
    // reasons (the fault's errors); results per model.
    let classes = &r["overall"]["classes"];
    let (gold, rest) = (
        find(classes, "name", "gold"),
        find(classes, "name", "default"),
    );
    let (g, d) = (
        gold["requests"].as_u64().unwrap(),
        rest["requests"].as_u64().unwrap(),
    );
    assert!(g > 0 && d > 0, "{classes}");
    for class in ["gold", "default"] {
        let v = r["verdict"][class].as_str().unwrap();
        assert!(v == "pass" || v == "fail", "{class}: {v}");
    }
    // A soak's steps are its intervals: the fault's shows its failed requests as misses.
    let errors: u64 = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["miss_reasons"]["error"].as_u64())
        .sum();
    assert!(
        errors >= rec["failed_requests"].as_u64().unwrap(),
        "{errors}"
    );
    assert!(r["by_model"]["sim-model"]["requests"].as_u64().unwrap() > 0);
    assert_ne!(done.exit_code(), replay::EXIT_ERROR);

    // Cost: the guides' model, per request and per million effective tokens.
    let cost = &r["cost"];
    assert!(
        (cost["per_hour"].as_f64().unwrap() - 12.0).abs() < 1e-9,
        "{cost}"
    );
    assert!(cost["cost_per_request"].as_f64().unwrap() > 0.0, "{cost}");
    assert!(
        cost["cost_per_million_effective_tokens"].is_number(),
        "{cost}"
    );
    let wasted = cost["wasted_share"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&wasted), "{cost}");

    // Each answer is in the Markdown and the HTML report too.
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for section in [
        "Verdict per SLO class",
        "Test contract",
        "Capacity and cost",
        "Recovery",
        "Quality and finish reasons",
        "Abnormal input and bursts",
        "Attribution and resources",
        "Per model",
    ] {
        assert!(
            md.contains(&format!("## {section}")),
            "{section} not in {md}"
        );
        assert!(
            html.contains(&format!("<h2>{section}</h2>")),
            "{section} not in the HTML"
        );
    }
    for text in ["acceptance-1", "rack=b7", "EUR per request"] {
        assert!(md.contains(text), "{text} not in {md}");
    }
    assert!(html.contains("acceptance-1") && html.contains("b7"));
    // The restarted simulator serves again after the run.
    sim.ready().await;
}
