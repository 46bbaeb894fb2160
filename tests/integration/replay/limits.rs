//! `goodput replay --mode limits` against the in-process simulator with a context limit:
//! the largest input it takes, the longest output it gives, and the concurrency ceiling
//! of the steps that follow.

use super::{args, read_json};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_limit_and_output_cap_are_found_in_few_probes() {
    let _serial = crate::common::SERIAL.lock().await;
    let mut cfg = fast_sim(5.0, 0.2);
    cfg.max_input_tokens = Some(3000);
    cfg.max_output_tokens = 700;
    let (_sim, url) = start_sim(cfg).await;
    let tmp = TempDir::new("limits");
    let dir = tmp.path();
    let profile = super::twenty_requests(dir, 8, "interactive", false);
    let out = dir.join("report");
    let a = args(&[
        "--profile",
        profile.to_str().unwrap(),
        "--target",
        &url,
        "--mode",
        "limits",
        "--concurrency",
        "1,2",
        "--warmup",
        "200ms",
        "--step-duration",
        "1s",
        "--out",
        out.to_str().unwrap(),
    ]);
    replay::execute(&a, std::future::pending()).await.unwrap();
    let r = read_json(&out.join("report.json"));
    let l = &r["limits"];
    eprintln!("limits: {l:#}");
    let max = l["max_input_tokens"].as_u64().unwrap();
    assert!(
        (2940..=3000).contains(&max),
        "within 2% of the 3,000-token limit, never above it: {l}"
    );
    let refused = l["refused_input_tokens"].as_u64().unwrap();
    assert!(refused > 3000, "{l}");
    assert_eq!(l["refused_with"], "HTTP 400", "{l}");
    assert!(l["probes"].as_u64().unwrap() <= 15, "{l}");
    // Asked for nearly the whole context, the simulator gives its own cap.
    assert_eq!(l["max_output_tokens"], 700, "{l}");
    assert!(l["output_asked"].as_u64().unwrap() > 700, "{l}");
    assert_eq!(l["output_finish_reason"], "length", "{l}");
    assert!(l["tokenizer"].as_str().unwrap().contains("4 bytes"), "{l}");
    // The steps ran after the probes and give the ceiling.
    assert_eq!(l["ceiling_concurrency"], r["max_stable_concurrency"], "{l}");
    assert!(r["steps"].as_array().unwrap().len() >= 2);
    // The probes are not part of the load: only the steps' requests are measured.
    assert!(r["overall"]["requests"].as_u64().unwrap() > 0);
}
