//! Like compared only with like: `--compare` refuses runs measured differently (two soaks
//! at different rates, two step runs over different concurrency lists), naming the field
//! and both values in full; `--allow-different` compares them anyway.

use std::path::PathBuf;

use super::{
    gates::{parsed, steps},
    read_json,
};
use crate::common::{
    harness::{fast_sim, start_sim},
    temp::TempDir,
};
use goodput::replay::{self, CompareOptions};

/// `steps`'s command line with `flag`'s value replaced (or the flag and its value removed
/// when `value` is `None`).
fn with(mut list: Vec<String>, flag: &str, value: Option<&str>) -> Vec<String> {
    let i = list.iter().position(|s| s == flag).unwrap();
    match value {
        Some(v) => list[i + 1] = v.to_owned(),
        None => {
            list.drain(i..i + 2);
        }
    }
    list
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_measured_differently_are_refused_naming_the_field_and_both_values() {
    let _serial = crate::common::SERIAL.lock().await;
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("like");
    let dir = tmp.path();
    for (out, rate) in [("soak4", "4"), ("soak8", "8")] {
        let mut list = with(steps(dir, &url, out, &[]), "--mode", Some("soak"));
        list = with(list, "--concurrency", None);
        list = with(list, "--required-concurrency", None);
        list.extend(
            [
                "--soak-rate",
                rate,
                "--soak-duration",
                "1s",
                "--no-engine-metrics",
            ]
            .map(str::to_owned),
        );
        let done = replay::execute(&parsed(&list), std::future::pending())
            .await
            .unwrap();
        let load = &read_json(&done.dir.join("report.json"))["contract"]["load"];
        assert_eq!(load["soak_rate_source"], "flag", "{load}");
    }
    for (out, levels) in [("c12", "1,2"), ("c2", "2")] {
        let list = with(
            steps(dir, &url, out, &["--no-engine-metrics"]),
            "--concurrency",
            Some(levels),
        );
        replay::execute(&parsed(&list), std::future::pending())
            .await
            .unwrap();
    }
    let pair =
        |a: &str, b: &str| -> [PathBuf; 2] { [a, b].map(|r| dir.join(r).join("report.json")) };
    let cmp = dir.join("cmp");
    let strict = CompareOptions::default();

    let err = replay::compare_reports(&pair("soak4", "soak8"), &cmp, &strict)
        .unwrap_err()
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("load.soak_rate (4.0 vs 8.0)"), "{err}");
    assert_eq!(
        err.matches(" vs ").count(),
        1,
        "nothing else differs: {err}"
    );

    let err = replay::compare_reports(&pair("c12", "c2"), &cmp, &strict)
        .unwrap_err()
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("load.concurrency ([1,2] vs [2])"), "{err}");
    assert_eq!(
        err.matches(" vs ").count(),
        1,
        "nothing else differs: {err}"
    );

    let allow = CompareOptions {
        allow_different: true,
        ..strict
    };
    let md = replay::compare_reports(&pair("c12", "c2"), &cmp, &allow)
        .unwrap()
        .md;
    assert!(md.contains("load.concurrency ([1,2] vs [2])"), "{md}");
}
