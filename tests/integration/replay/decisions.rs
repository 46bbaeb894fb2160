//! Decisions that cannot mislead, against the in-process simulator: a run whose probes
//! fail reads FAILED in every comparison and is never ranked; the terminal's last line
//! agrees with the exit code; and no gate passes blind (an exporter that never answers
//! leaves `resources` unjudged, an XID latched before the run and clock throttling fail
//! it), with purpose-built exporters over loopback serving dcgm-exporter's text format;
//! and an engine answering 5xx bodies that name out-of-memory fails `resources`.

use std::{
    convert::Infallible,
    path::Path,
    process::{Command, Output},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::{
    gates::{parsed, steps},
    read_json,
};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self, EXIT_FAIL, EXIT_PASS};

/// Two probes: `four` wants exactly four words (a simulator cut to two output tokens
/// fails it), `words` any lower-case words (every simulator passes it).
fn write_probes(dir: &Path) -> String {
    let path = dir.join("probes.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"name":"four","body":{"messages":[{"role":"user","content":"Four words"}],"max_tokens":4},"expect":{"regex":"^([a-z]+ ){4}$"}}"#,
            "\n",
            r#"{"name":"words","body":{"messages":[{"role":"user","content":"Say words"}],"max_tokens":4},"expect":{"regex":"^([a-z]+ )+$"}}"#,
            "\n"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

fn goodput(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(args)
        .output()
        .unwrap()
}

fn last_line(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_failed_its_probes_reads_failed_in_every_comparison() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_good, good_url) = start_sim(fast_sim(5.0, 1.0)).await;
    let mut cut = fast_sim(5.0, 1.0);
    cut.output_tokens = Some("fixed:2".parse().unwrap());
    let (_cut, cut_url) = start_sim(cut).await;
    let tmp = TempDir::new("decisions-compare");
    let dir = tmp.path();
    let probes = write_probes(dir);
    for (out, url) in [("a", &good_url), ("b", &cut_url), ("c", &good_url)] {
        let list = steps(
            dir,
            url,
            out,
            &[
                "--probes",
                &probes,
                "--probe-share",
                "0.5",
                "--no-engine-metrics",
            ],
        );
        let done = replay::execute(&parsed(&list), std::future::pending())
            .await
            .unwrap();
        let want = if out == "b" { EXIT_FAIL } else { EXIT_PASS };
        let r = read_json(&done.dir.join("report.json"));
        assert_eq!(done.exit_code(), want, "{out}: {}", r["gates"]);
    }
    let report = |run: &str| dir.join(run).join("report.json").display().to_string();
    let cmp = dir.join("cmp").display().to_string();
    let o = goodput(&[
        "replay",
        "--compare",
        &report("a"),
        &report("b"),
        "--out",
        &cmp,
    ]);
    let md = String::from_utf8_lossy(&o.stdout);
    eprintln!("{md}");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(md.contains("## Verdicts"), "opens with the verdicts");
    assert!(md.find("## Verdicts") < md.find("## Summary"));
    assert!(md.contains("|  | A | B — FAILED |"), "{md}");
    assert!(md.contains("| passed | **yes** | **NO** |"), "{md}");
    assert!(md.contains("| gate quality | **pass"), "{md}");
    assert!(
        md.contains("| A | B — FAILED | change |"),
        "every table's header"
    );
    // A failed run is never called better than its rival.
    let better: Vec<&str> = md.lines().filter(|l| l.contains("**better**")).collect();
    assert!(better.is_empty(), "a failed run marked better: {better:?}");
    assert!(
        last_line(&o).starts_with("Verdicts: A passed; B FAILED: quality ("),
        "{}",
        last_line(&o)
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cmp/compare.json")).unwrap())
            .unwrap();
    let v = &json["verdicts"];
    assert_eq!(
        (v[0]["run"].as_str(), v[0]["passed"].as_bool()),
        (Some("A"), Some(true))
    );
    assert_eq!(v[1]["passed"], false);
    let quality = v[1]["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == "quality")
        .unwrap();
    assert_eq!(quality["state"], "fail", "{quality}");
    // Quality against A: `four` flipped, the words probe did not; B is about half down
    // (the probes alternate, so each run answers each about as often).
    assert!(md.contains("## Quality against A"), "{md}");
    assert!(md.contains("| four | "), "{md}");
    assert!(md.contains("**pass → FAIL**"), "{md}");
    let q = &json["quality"];
    assert_eq!(q["flips"].as_array().unwrap().len(), 1, "{q}");
    assert_eq!(q["flips"][0]["probe"], "four");
    assert_eq!(q["flips"][0]["direction"], "pass_to_fail");
    let delta = q["pass_rate_delta"].as_f64().unwrap();
    eprintln!("pass rate delta {delta} points, ci95 {}", q["ci95"]);
    assert!((-75.0..-25.0).contains(&delta), "{q}");
    let ci: Vec<f64> = q["ci95"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(ci[0] < delta && delta < ci[1] && ci[1] < 0.0, "{q}");
    assert_eq!(json["failure"], Value::Null, "no --quality-max-drop");

    // With a limit, a drop beyond it fails the comparison, naming the probe; the last
    // line says so.
    let o = goodput(&[
        "replay",
        "--compare",
        &report("a"),
        &report("b"),
        "--out",
        &cmp,
        "--quality-max-drop",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(i32::from(EXIT_FAIL)));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.contains("|  | A | B — FAILED |"), "{md}");
    let last = last_line(&o);
    assert!(
        last.starts_with("Comparison FAILED: quality dropped ")
            && last.contains("points (100.0% to ")
            && last.contains("beyond --quality-max-drop 5;")
            && last.ends_with("probes that flipped from pass to fail: four."),
        "{last}"
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cmp/compare.json")).unwrap())
            .unwrap();
    assert!(json["failure"].as_str().unwrap().contains("four"));
    // Two runs against the same simulator are within it.
    let o = goodput(&[
        "replay",
        "--compare",
        &report("a"),
        &report("c"),
        "--out",
        &cmp,
        "--quality-max-drop",
        "5",
    ]);
    assert!(o.status.success(), "{}", last_line(&o));

    // The matrix of three ranks the two that passed and lists the failed one apart.
    let o = goodput(&[
        "replay",
        "--compare",
        &report("a"),
        &report("b"),
        &report("c"),
        "--out",
        &cmp,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cmp/compare.json")).unwrap())
            .unwrap();
    let ranking: Vec<&str> = m["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(ranking.len(), 2, "{ranking:?}");
    assert!(ranking.contains(&report("a").as_str()) && ranking.contains(&report("c").as_str()));
    assert_eq!(m["failed"], serde_json::json!([report("b")]));
    assert_eq!(m["verdicts"][1]["passed"], false);
    let md = std::fs::read_to_string(dir.join("cmp/compare.md")).unwrap();
    assert!(md.contains("## Runs that FAILED (not ranked)"), "{md}");
    assert!(
        md.contains("sim-model × - × - — FAILED") || md.contains("— FAILED"),
        "{md}"
    );
    let ranked = md
        .split("## Ranking of the runs that passed")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    assert!(!ranked.contains(&report("b")), "{ranked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_line_on_screen_agrees_with_the_exit_code() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_cut, cut_url) = start_sim({
        let mut c = fast_sim(5.0, 1.0);
        c.output_tokens = Some("fixed:2".parse().unwrap());
        c
    })
    .await;
    let (_good, good_url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("decisions-screen");
    let dir = tmp.path();
    let probes = write_probes(dir);
    for (url, out) in [(&cut_url, "bad"), (&good_url, "good")] {
        let mut list = vec!["replay".to_owned(), "--quiet".to_owned()];
        list.extend(steps(
            dir,
            url,
            out,
            &[
                "--probes",
                &probes,
                "--probe-share",
                "0.5",
                "--no-engine-metrics",
            ],
        ));
        let strs: Vec<&str> = list.iter().map(String::as_str).collect();
        let o = goodput(&strs);
        let stdout = String::from_utf8_lossy(&o.stdout);
        eprintln!("{out}: {stdout}");
        let line = last_line(&o);
        assert!(
            stdout.contains("slo gate, class interactive: pass"),
            "{stdout}"
        );
        match o.status.code() {
            Some(0) => assert_eq!(line, "PASSED", "{out}"),
            Some(1) => assert!(line.starts_with("FAILED: quality ("), "{line}"),
            other => panic!("{out}: exit {other:?}: {stdout}"),
        }
        assert_eq!(o.status.code(), Some(if out == "bad" { 1 } else { 0 }));
    }
}

/// A dcgm-exporter stand-in with one GPU: XID `xid` from the first scrape on, and clock
/// throttle reasons 0x8 (hardware slowdown, with idle 0x1) on every fifth scrape when
/// `throttle`; the others hold idle only, which is no throttling.
async fn exporter(xid: u32, throttle: bool) -> String {
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
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    let reasons = if throttle && n.is_multiple_of(5) {
                        0x9
                    } else {
                        0x1
                    };
                    let labels = r#"gpu="0",UUID="GPU-5a1f3c2e-7d4b-4e8a-9b1c-0e2d3f4a5b60",pci_bus_id="00000000:01:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="550.54.15""#;
                    let text = format!(
                        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{{{labels}}} 50\n\
                         # HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}\n\
                         # HELP DCGM_FI_DEV_CLOCK_THROTTLE_REASONS Current clock throttle reasons.\n# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge\nDCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{labels}}} {reasons}\n"
                    );
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
async fn an_exporter_that_never_answers_leaves_resources_unjudged() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    // A port nothing listens on: bound, then released.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/metrics", l.local_addr().unwrap())
    };
    let tmp = TempDir::new("decisions-blind");
    let dir = tmp.path();
    let base = ["--gpu-metrics", dead.as_str(), "--no-engine-metrics"];
    let done = replay::execute(
        &parsed(&steps(dir, &url, "blind", &base)),
        std::future::pending(),
    )
    .await
    .unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let g = &r["gates"]["resources"];
    eprintln!("{g:#}");
    assert_eq!(done.exit_code(), EXIT_FAIL);
    assert_eq!(
        (g["judged"].as_bool(), g["pass"].as_bool()),
        (Some(false), Some(false))
    );
    assert_eq!(g["state"], "unjudged");
    assert!(
        g["reason"]
            .as_str()
            .unwrap()
            .contains("gpu exporter unreachable"),
        "{g}"
    );
    assert!(
        done.verdict_line()
            .starts_with("FAILED: resources (unjudged: gpu exporter unreachable")
    );
    let mut allowed = base.to_vec();
    allowed.extend(["--allow-unjudged", "resources"]);
    let done = replay::execute(
        &parsed(&steps(dir, &url, "allowed", &allowed)),
        std::future::pending(),
    )
    .await
    .unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let g = &r["gates"]["resources"];
    assert_eq!(done.exit_code(), EXIT_PASS, "{g}");
    assert_eq!(
        (g["state"].as_str(), g["allowed_unjudged"].as_bool()),
        (Some("unjudged"), Some(true))
    );
    assert_eq!(done.verdict_line(), "PASSED (unjudged, allowed: resources)");
    let md = std::fs::read_to_string(done.dir.join("report.md")).unwrap();
    assert!(
        md.contains("| resources | **unjudged (allowed)** |"),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_before_the_run_and_clock_throttling_fail_resources() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("decisions-gpu");
    let dir = tmp.path();
    let latched = exporter(3, false).await;
    let done = replay::execute(
        &parsed(&steps(
            dir,
            &url,
            "xid",
            &["--gpu-metrics", &latched, "--no-engine-metrics"],
        )),
        std::future::pending(),
    )
    .await
    .unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let g = &r["gates"]["resources"];
    eprintln!("{g:#}\n{:#}", r["resources"]);
    assert_eq!(done.exit_code(), EXIT_FAIL);
    assert!(
        g["reason"]
            .as_str()
            .unwrap()
            .contains("present before the run"),
        "{g}"
    );
    assert_eq!(r["resources"]["gpu_xid_before_run"], 1);
    // The same value all along: no new error during the run.
    assert_eq!(r["resources"]["gpu_xid_errors"], 0);

    let throttled = exporter(0, true).await;
    let mut list = steps(
        dir,
        &url,
        "throttle",
        &["--gpu-metrics", &throttled, "--no-engine-metrics"],
    );
    // At least five consecutive one-second samples in the window: one or two of them
    // throttled, never none.
    let d = list.iter().position(|s| s == "--step-duration").unwrap();
    list[d + 1] = "6s".into();
    let done = replay::execute(&parsed(&list), std::future::pending())
        .await
        .unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let g = &r["gates"]["resources"];
    eprintln!("{g:#}\n{:#}", r["resources"]);
    assert_eq!(done.exit_code(), EXIT_FAIL);
    let share = r["resources"]["throttle_share"].as_f64().unwrap();
    assert!((0.14..=0.34).contains(&share), "{share}");
    assert!(
        g["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("clocks throttled in {:.1}%", share * 100.0)),
        "{g}"
    );
}

/// An engine out of memory: every request answered 500 with vLLM's error body naming
/// CUDA out of memory.
async fn out_of_memory_upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = service_fn(|_req: Request<Incoming>| async {
                    let body = r#"{"object":"error","message":"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB is free.","type":"InternalServerError","param":null,"code":500}"#;
                    let mut resp = Response::new(Full::new(Bytes::from(body)));
                    *resp.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                    resp.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(resp)
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
async fn a_5xx_naming_out_of_memory_fails_resources() {
    let _serial = crate::common::SERIAL.lock().await;
    let url = out_of_memory_upstream().await;
    let tmp = TempDir::new("decisions-oom");
    let dir = tmp.path();
    let done = replay::execute(
        &parsed(&steps(dir, &url, "oom", &["--no-engine-metrics"])),
        std::future::pending(),
    )
    .await
    .unwrap();
    let r = read_json(&done.dir.join("report.json"));
    let g = &r["gates"]["resources"];
    eprintln!("{g:#}");
    assert_eq!(done.exit_code(), EXIT_FAIL);
    assert_eq!(
        (g["state"].as_str(), g["judged"].as_bool()),
        (Some("fail"), Some(true))
    );
    assert!(
        g["reason"]
            .as_str()
            .unwrap()
            .starts_with("the engine ran out of memory: "),
        "{g}"
    );
    assert!(
        done.verdict_line()
            .contains("resources (the engine ran out of memory")
    );
}
