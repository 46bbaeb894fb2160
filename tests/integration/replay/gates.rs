//! The verdict cannot pass a bad candidate: `gates` against the in-process simulator — a
//! run whose probes all answer wrongly exits 1 on `gates.quality` (and its wrong answers
//! leave effective goodput), a right one exits 0; two runs differing only in warm-up are
//! refused by `--compare`, naming the warm-up; `reproducibility` holds the command line
//! (the API key redacted), the files' SHA-256 and what the target said; and a
//! dcgm-exporter endpoint serving the exporter's own text format reaches
//! `steps[].resources` and `resources`.

use std::{
    convert::Infallible,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;

use super::{Cli, args, read_json};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use clap::Parser;
use goodput::replay::{self, EXIT_FAIL, EXIT_PASS};

fn write_profile(dir: &Path) -> PathBuf {
    super::twenty_requests(dir, 8, "interactive", true)
}

fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("slo.toml");
    std::fs::write(
        &path,
        "[slo]\nmin_samples = 3\n\n[[slo.class]]\nname = \"interactive\"\nmatch = { api = \"chat\" }\n\
         ttft_ms = 2000\nattainment = 0.5\n",
    )
    .unwrap();
    path
}

/// A steps run at concurrency 2 with `extra` flags, into `dir/out`.
pub(super) fn steps(dir: &Path, url: &str, out: &str, extra: &[&str]) -> Vec<String> {
    let (profile, config) = (write_profile(dir), write_config(dir));
    let mut a: Vec<String> = [
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        url,
        "--config",
        config.to_str().unwrap(),
        "--mode",
        "steps",
        "--concurrency",
        "2",
        "--required-concurrency",
        "2",
        "--warmup",
        "100ms",
        "--step-duration",
        "1s",
        "--out",
        dir.join(out).to_str().unwrap(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    a.extend(extra.iter().map(|s| (*s).to_owned()));
    a
}

pub(super) fn parsed(list: &[String]) -> replay::ReplayArgs {
    let strs: Vec<&str> = list.iter().map(String::as_str).collect();
    args(&strs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_that_all_answer_wrongly_fail_the_run() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("gate-quality");
    let dir = tmp.path();
    let probes = dir.join("probes.jsonl");
    // The simulator answers English words: never "Paris", always lower-case words.
    std::fs::write(
        &probes,
        r#"{"name":"capital","body":{"messages":[{"role":"user","content":"Capital of France?"}],"max_tokens":5,"stream":true},"expect":{"contains":"Paris"}}
"#,
    )
    .unwrap();
    let p = probes.to_str().unwrap();
    let a = parsed(&steps(
        dir,
        &url,
        "bad",
        &["--probes", p, "--probe-share", "0.5"],
    ));
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let g = &r["gates"];
    eprintln!("gates: {g:#}");
    assert_eq!(done.exit_code(), EXIT_FAIL);
    assert_eq!(r["passed"], false);
    assert_eq!(g["quality"]["pass"], false);
    assert_eq!(g["quality"]["actual"], 0.0);
    assert_eq!(g["quality"]["target"], 1.0);
    // Fast enough: the SLO itself holds, so only the wrong answers fail the run.
    assert_eq!(g["slo"]["pass"], true, "{g}");
    assert_eq!(r["verdict"]["interactive"], "pass");
    for gate in ["recovery", "abnormal_input"] {
        assert_eq!(g[gate]["pass"], true, "{gate}");
        assert_eq!(g[gate]["judged"], false, "{gate}");
        assert_eq!(g[gate]["state"], "not requested", "{gate}");
    }
    // The simulator's engine metrics are read: no restart, no preemption.
    assert_eq!(g["resources"]["state"], "pass", "{g}");
    // Wrong answers are no effective output: half the requests are probes.
    let s = &r["steps"][0];
    let (effective, met) = (
        s["effective_output_tokens"].as_u64().unwrap(),
        s["output_tokens"].as_u64().unwrap(),
    );
    let probes_n = s["quality"]["probes"].as_u64().unwrap();
    assert!(probes_n >= 4, "{s}");
    assert!(effective < met, "{effective} < {met}");
    // Nor effective requests: every probe answered wrongly, so the effective requests
    // are at most the profile's, and their tokens are wasted.
    let requests = s["requests"].as_u64().unwrap();
    assert_eq!(
        s["effective_requests"].as_u64().unwrap(),
        s["slo_met"].as_u64().unwrap() - probes_n,
        "{s}"
    );
    assert!(s["effective_requests"].as_u64().unwrap() < requests);
    let md = std::fs::read_to_string(done.dir.join("report.md")).unwrap();
    assert!(
        md.contains("## Gates") && md.contains("| quality | **fail** |"),
        "{md}"
    );
    let html = std::fs::read_to_string(done.dir.join("report.html")).unwrap();
    assert!(html.contains("<h2>Gates</h2>"));

    // The same run with probes the simulator answers right passes every gate.
    std::fs::write(
        &probes,
        r#"{"name":"words","body":{"messages":[{"role":"user","content":"Say words"}],"max_tokens":5},"expect":{"regex":"^([a-z]+ )+$"}}
"#,
    )
    .unwrap();
    let a = parsed(&steps(
        dir,
        &url,
        "good",
        &["--probes", p, "--probe-share", "0.5"],
    ));
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&done.dir.join("report.json"));
    assert_eq!(r["gates"]["quality"]["pass"], true, "{}", r["gates"]);
    assert_eq!(r["passed"], true);
    assert_eq!(done.exit_code(), EXIT_PASS);
    // --quality-min lowers the bar; it needs --probes.
    assert!(
        Cli::try_parse_from([
            "replay",
            "--profile",
            "p",
            "--target",
            "t",
            "--quality-min",
            "0.5"
        ])
        .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_differing_in_warm_up_are_refused_by_compare() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("gate-compare");
    let dir = tmp.path();
    for (out, warmup) in [("a", "100ms"), ("b", "300ms")] {
        let mut a = steps(dir, &url, out, &[]);
        let w = a.iter().position(|s| s == "--warmup").unwrap();
        a[w + 1] = warmup.to_owned();
        replay::execute(&parsed(&a), std::future::pending())
            .await
            .unwrap();
    }
    let reports = [dir.join("a/report.json"), dir.join("b/report.json")];
    let cmp = dir.join("cmp");
    let strict = replay::CompareOptions::default();
    let err = replay::compare_reports(&reports, &cmp, &strict).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("load.warmup_s (0.1 vs 0.3)"), "{msg}");
    // Nothing else differs: the same profile, SLO, durations, repeats and gates.
    assert_eq!(msg.matches(" vs ").count(), 1, "{msg}");
    let allow = replay::CompareOptions {
        allow_different: true,
        ..strict
    };
    let md = replay::compare_reports(&reports, &cmp, &allow).unwrap().md;
    assert!(
        md.contains("measured under different conditions") && md.contains("load.warmup_s"),
        "{md}"
    );
    assert!(cmp.join("compare.html").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_says_how_to_reproduce_the_run() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("gate-repro");
    let dir = tmp.path();
    // The "API key" is $PATH's value: set in every environment, and no other part of the
    // run writes it.
    let secret = std::env::var("PATH").unwrap();
    let mut list = steps(
        dir,
        &url,
        "out",
        &[
            "--api-key-env",
            "PATH",
            "--describe-cmd",
            "echo model card; echo \"key=$PATH\"",
            "--contract",
            "notes=token=abc123",
        ],
    );
    list.insert(0, "goodput".into());
    list.insert(1, "replay".into());
    let mut a = parsed(&list[2..]);
    a.command_line = list.clone();
    let done = replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let x = &r["reproducibility"];
    eprintln!("reproducibility: {x:#}");
    let command = x["command"].as_str().unwrap();
    assert!(
        command.starts_with("goodput replay --profile "),
        "{command}"
    );
    assert!(command.contains("--warmup 100ms"), "{command}");
    assert!(command.contains("--api-key-env PATH"));
    assert!(command.contains("notes=token=***"), "{command}");
    let json = std::fs::read_to_string(done.dir.join("report.json")).unwrap();
    assert!(!json.contains(&secret));
    let sha = |p: &Path| {
        let out = std::process::Command::new("sha256sum")
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    };
    assert_eq!(x["profile_sha256"], sha(&dir.join("profile.jsonl")));
    assert_eq!(x["config_sha256"], sha(&dir.join("slo.toml")));
    assert_eq!(x["probes_sha256"], serde_json::Value::Null);
    assert_eq!(x["goodput_version"], env!("CARGO_PKG_VERSION"));
    // The simulator lists its model and serves no version endpoint.
    assert_eq!(x["target"]["models"]["data"][0]["id"], "sim-model", "{x}");
    assert_eq!(x["target"]["version"], serde_json::Value::Null);
    let d = &x["describe"];
    assert_eq!(d["exit_code"], 0);
    assert_eq!(d["file"], "describe.txt");
    let kept = std::fs::read_to_string(done.dir.join("describe.txt")).unwrap();
    // The kept output has the key's value redacted too.
    assert_eq!(kept, "model card\nkey=***\n");
    assert_eq!(d["output_sha256"], sha(&done.dir.join("describe.txt")));
    assert!(d["command"].as_str().unwrap().contains("key=***"));
    let md = std::fs::read_to_string(done.dir.join("report.md")).unwrap();
    assert!(md.contains("## Reproducibility") && md.contains("| command | goodput replay"));
}

/// A dcgm-exporter stand-in: the exporter's exact text format for two GPUs, utilization
/// rising by 10 points a scrape, GPU 1 reporting XID 79 from its second scrape; counts
/// scrapes.
async fn dcgm_exporter() -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let scrapes = Arc::new(AtomicU64::new(0));
    let count = scrapes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    async move { Ok::<_, Infallible>(Response::new(Full::new(exposition(n)))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (url, scrapes)
}

fn exposition(n: u64) -> Bytes {
    let mut t = String::new();
    let util = (10 + 10 * n).min(100);
    for (name, help, values) in [
        (
            "DCGM_FI_DEV_SM_CLOCK",
            "SM clock frequency (in MHz).",
            ["1980", "1755"],
        ),
        (
            "DCGM_FI_DEV_MEM_CLOCK",
            "Memory clock frequency (in MHz).",
            ["2619", "2619"],
        ),
        (
            "DCGM_FI_DEV_MEMORY_TEMP",
            "Memory temperature (in C).",
            ["9223372036854775794"; 2],
        ),
        (
            "DCGM_FI_DEV_GPU_TEMP",
            "GPU temperature (in C).",
            ["61", "66"],
        ),
        (
            "DCGM_FI_DEV_POWER_USAGE",
            "Power draw (in W).",
            ["412.345", "398.5"],
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %).",
            ["U", "U"],
        ),
        (
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            ["0", "X"],
        ),
        (
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
            ["11000", "12000"],
        ),
        (
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB).",
            ["70559", "69559"],
        ),
        (
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "Current clock throttle reasons.",
            ["1", "1"],
        ),
    ] {
        t.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (gpu, v) in values.iter().enumerate() {
            let v = match *v {
                "U" => util.to_string(),
                "X" if n >= 1 => "79".into(),
                "X" => "0".into(),
                other => other.into(),
            };
            t.push_str(&format!(
                "{name}{{gpu=\"{gpu}\",UUID=\"GPU-5a1f3c2e-7d4b-4e8a-9b1c-0e2d3f4a5b6{gpu}\",pci_bus_id=\"00000000:0{gpu}:00.0\",device=\"nvidia{gpu}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"}} {v}\n"
            ));
        }
    }
    Bytes::from(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dcgm_exporter_reaches_the_steps_resources() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let (gpu_url, scrapes) = dcgm_exporter().await;
    let tmp = TempDir::new("gate-gpu");
    let dir = tmp.path();
    let mut list = steps(dir, &url, "out", &["--gpu-metrics", &gpu_url]);
    let d = list.iter().position(|s| s == "--step-duration").unwrap();
    list[d + 1] = "3s".into();
    let done = replay::execute(&parsed(&list), std::future::pending())
        .await
        .unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let res = &r["steps"][0]["resources"];
    eprintln!(
        "steps[0].resources: {res:#}\nresources: {:#}",
        r["resources"]
    );
    let n = scrapes.load(Ordering::SeqCst);
    assert!(n >= 4, "scraped {n} times");
    assert_eq!(res["gpus"], 2);
    assert!(res["scrapes"].as_u64().unwrap() >= 2, "{res}");
    assert!(
        res["gpu_utilization_mean"].as_f64().unwrap() > 10.0,
        "{res}"
    );
    assert!(
        res["gpu_utilization_p95"].as_f64().unwrap()
            >= res["gpu_utilization_mean"].as_f64().unwrap()
    );
    assert_eq!(res["gpu_memory_used_max_mib"], 70559.0);
    assert_eq!(res["gpu_power_mean_w"], (412.345 + 398.5) / 2.0);
    assert_eq!(res["gpu_temperature_max_c"], 66.0);
    assert_eq!(res["gpu_sm_clock_min_mhz"], 1755.0);
    assert_eq!(res["absent"], serde_json::json!([]));
    let all = &r["resources"];
    assert_eq!(all["urls"][0], gpu_url);
    assert_eq!(all["failed_scrapes"], 0);
    assert!(all["scrape_attempts"].as_u64().unwrap() >= 4, "{all}");
    // GPU 1 reported XID 79 from the second scrape on: one error, and the run fails.
    assert_eq!(all["gpu_xid_errors"], 1, "{all}");
    assert_eq!(r["gates"]["resources"]["pass"], false);
    assert_eq!(r["gates"]["resources"]["actual"], 1.0);
    assert_eq!(done.exit_code(), EXIT_FAIL);
    let html = std::fs::read_to_string(done.dir.join("report.html")).unwrap();
    assert!(
        html.contains("<h2>GPUs</h2>") && html.contains("1755"),
        "GPU table"
    );
    assert!(
        html.contains("GPU utilization and KV cache per step"),
        "GPU chart"
    );
}
