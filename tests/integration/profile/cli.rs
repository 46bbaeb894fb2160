//! The `goodput profile` commands as a user runs them: the real binary on files written
//! from synthetic traffic (the simulator's distributions), checking outputs, formats and
//! exit codes.

use std::{
    collections::{BTreeSet, HashMap},
    path::Path,
    process::{Command, Output},
};

use goodput::profile::Profile;
use serde_json::Value;

use super::support::{anonymizer, synthetic, write_file};
use crate::common::temp::TempDir;

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

fn goodput(args: &[&str], files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_goodput"))
        .arg("profile")
        .args(args)
        .args(files)
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed = serde_json::from_str(&text);
    assert!(
        parsed.is_ok(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parsed.unwrap()
}

#[test]
fn diff_flags_an_output_shift_and_stays_quiet_on_a_resample() {
    let dir = TempDir::new("diff");
    let a = anonymizer("diff-salt-0123456789");
    let base = write_file(
        dir.path(),
        "base.jsonl",
        &synthetic(10, 2000, 180.0, T0, 250, &a),
        &a,
    );
    let same = write_file(
        dir.path(),
        "same.jsonl",
        &synthetic(11, 2000, 180.0, T0, 250, &a),
        &a,
    );
    let moved = write_file(
        dir.path(),
        "moved.jsonl",
        &synthetic(12, 2000, 410.0, T0, 250, &a),
        &a,
    );

    let quiet = goodput(&["diff", "--json"], &[&base, &same]);
    assert_eq!(
        quiet.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&quiet.stdout)
    );
    let report = json(&quiet);
    assert_eq!(report["drifted"], false);
    let dims = report["dimensions"].as_array().unwrap();
    assert_eq!(dims.len(), 10);
    for d in dims {
        for key in ["name", "statistic", "value", "threshold", "drifted"] {
            assert!(d.get(key).is_some(), "{key} missing in {d}");
        }
        assert!(d["value"].is_number(), "{d}");
    }

    let flagged = goodput(&["diff", "--json"], &[&base, &moved]);
    assert_eq!(flagged.status.code(), Some(1));
    let report = json(&flagged);
    assert_eq!(report["drifted"], true);
    let drifted: BTreeSet<String> = report["dimensions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["drifted"] == true)
        .map(|d| {
            format!(
                "{}/{}",
                d["name"].as_str().unwrap(),
                d["statistic"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        drifted.contains("output_length/psi") && drifted.contains("output_length/ks"),
        "{drifted:?}"
    );
    assert!(
        drifted
            .iter()
            .all(|d| d.starts_with("output_length") || d.starts_with("concurrency")),
        "{drifted:?}"
    );

    let text = goodput(&["diff"], &[&base, &moved]);
    assert_eq!(text.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.starts_with("DRIFTED"), "{stdout}");
    assert!(stdout.contains("output length P50 "), "{stdout}");
}

#[test]
fn errors_exit_2_and_say_why() {
    let dir = TempDir::new("errors");
    let a = anonymizer("err-salt-0123456789");
    let good = write_file(
        dir.path(),
        "good.jsonl",
        &synthetic(1, 10, 100.0, T0, 100, &a),
        &a,
    );
    let text =
        std::fs::read_to_string(&good)
            .unwrap()
            .replacen("\"version\":1", "\"version\":2", 1);
    let v2 = dir.path().join("v2.jsonl");
    std::fs::write(&v2, text).unwrap();
    let missing = dir.path().join("missing.jsonl");
    for (args, files, needle) in [
        (
            vec!["diff"],
            vec![good.as_path(), missing.as_path()],
            "missing.jsonl",
        ),
        (vec!["summarize"], vec![v2.as_path()], "version 2"),
        (
            vec!["export", "--format", "mooncake"],
            vec![v2.as_path()],
            "upgrade goodput",
        ),
        (vec!["summarize"], vec![], "FILE"),
    ] {
        let out = goodput(&args, &files);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn summarize_reports_the_shape() {
    let dir = TempDir::new("summary");
    let a = anonymizer("sum-salt-0123456789");
    let file = write_file(
        dir.path(),
        "p.jsonl",
        &synthetic(20, 1000, 180.0, T0, 250, &a),
        &a,
    );
    let out = goodput(&["summarize", "--json"], &[&file]);
    assert!(out.status.success());
    let s = json(&out);
    assert_eq!(s["requests"], 1000);
    let rate = s["arrival_rate"]["mean_per_s"].as_f64().unwrap();
    assert!((rate - 4.0).abs() < 0.01, "{rate}");
    assert!(s["arrival_rate"]["burstiness_cv"].as_f64().unwrap() < 0.01);
    assert!(s["models"]["llama"].as_u64().unwrap() > 700);
    let p50 = s["input_tokens"]["p50"].as_f64().unwrap();
    assert!((450.0..800.0).contains(&p50), "{p50}");
    for q in ["p90", "p95", "p99", "max"] {
        assert!(
            s["output_tokens"][q].as_f64().unwrap() >= s["output_tokens"]["p50"].as_f64().unwrap()
        );
    }
    let reuse = s["prefix_reuse"].as_f64().unwrap();
    assert!(reuse > 0.3 && reuse < 1.0, "{reuse}");
    assert_eq!(s["stream_share"], 1.0);
    assert!(s["slo"]["attainment"].as_f64().unwrap() > 0.9);
    let text = goodput(&["summarize"], &[&file]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("burstiness (CV)") && text.contains("######"),
        "{text}"
    );
}

#[test]
fn export_mooncake_obeys_the_format_rules() {
    let dir = TempDir::new("export");
    let a = anonymizer("exp-salt-0123456789");
    let file = write_file(
        dir.path(),
        "p.jsonl",
        &synthetic(30, 500, 180.0, T0, 250, &a),
        &a,
    );
    let out_path = dir.path().join("trace.jsonl");
    let out = goodput(
        &[
            "export",
            "--format",
            "mooncake",
            "-o",
            out_path.to_str().unwrap(),
        ],
        &[&file],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exported 500 requests"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--input-file {} --custom-dataset-type mooncake_trace --fixed-schedule",
            out_path.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("kind=mooncake") && stderr.contains("time_scale=0.001"),
        "{stderr}"
    );
    assert!(
        stderr.contains("vllm bench serve --backend openai --endpoint /v1/completions ")
            && stderr.contains("--timed-trace-chunk-hash-size 512"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&out_path).unwrap();
    let mut last = 0;
    let mut parent: HashMap<u64, Option<u64>> = HashMap::new();
    let mut reused = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["timestamp", "input_length", "output_length", "hash_ids"])
        );
        let ts = v["timestamp"].as_i64().unwrap();
        assert!(ts >= last, "sorted");
        last = ts;
        let input = v["input_length"].as_u64().unwrap();
        assert!(input > 0 && v["output_length"].as_u64().unwrap() > 0);
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap())
            .collect();
        assert_eq!(ids.len() as u64, input.div_ceil(512), "{line}");
        // Mooncake semantics: an id always follows the same id (it names a prefix).
        for (i, id) in ids.iter().enumerate() {
            let before = i.checked_sub(1).map(|j| ids[j]);
            if let Some(p) = parent.insert(*id, before) {
                assert_eq!(p, before, "id {id} with two parents");
                reused += 1;
            }
        }
    }
    assert_eq!(
        text.lines()
            .next()
            .map(|l| l.starts_with("{\"timestamp\":0,")),
        Some(true)
    );
    assert!(reused > 100, "shared system prompts are reused: {reused}");

    let cmds = goodput(
        &[
            "export",
            "--format",
            "mooncake",
            "--commands",
            "--model",
            "m",
        ],
        &[&file],
    );
    let cmds = String::from_utf8_lossy(&cmds.stdout);
    assert_eq!(cmds.lines().count(), 3, "{cmds}");
    assert!(cmds.lines().all(|l| l.contains("out.jsonl")));

    let azure = goodput(&["export", "--format", "azure-csv"], &[&file]);
    let azure = String::from_utf8_lossy(&azure.stdout);
    let mut rows = azure.lines();
    assert_eq!(rows.next(), Some("TIMESTAMP,ContextTokens,GeneratedTokens"));
    assert!(
        rows.next()
            .unwrap()
            .starts_with("2026-01-01 00:00:00.0000000,")
    );
    let burst = goodput(&["export", "--format", "burstgpt-csv"], &[&file]);
    let burst = String::from_utf8_lossy(&burst.stdout);
    let mut rows = burst.lines();
    assert_eq!(
        rows.next(),
        Some("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type")
    );
    let first: Vec<&str> = rows.next().unwrap().split(',').collect();
    assert_eq!((first[0], first[5]), ("0.000", "API log"));
    let (i, o, t): (u64, u64, u64) = (
        first[2].parse().unwrap(),
        first[3].parse().unwrap(),
        first[4].parse().unwrap(),
    );
    assert_eq!(i + o, t);
}

#[test]
fn merge_links_blocks_of_one_salt_and_refuses_mixed_salts() {
    let dir = TempDir::new("merge");
    let a = anonymizer("merge-salt-0123456789");
    // Two instances of the same fleet (one salt), interleaved in time.
    let one = write_file(
        dir.path(),
        "gw1.jsonl",
        &synthetic(40, 100, 180.0, T0, 200, &a),
        &a,
    );
    let two = write_file(
        dir.path(),
        "gw2.jsonl",
        &synthetic(41, 100, 180.0, T0 + 100, 200, &a),
        &a,
    );
    let merged = dir.path().join("merged.jsonl");
    let out = goodput(&["merge", "-o", merged.to_str().unwrap()], &[&one, &two]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("linked across files"));
    let m = Profile::read(std::slice::from_ref(&merged)).unwrap();
    assert_eq!(m.entries.len(), 200);
    assert_eq!(
        m.entries[1].at_ms - m.entries[0].at_ms,
        100,
        "aligned on absolute time"
    );
    assert_eq!(m.files[0].header.salt_id, a.salt_id());
    // The four system prompts are shared by both instances: once linked there are far
    // fewer distinct blocks than the two files have together.
    let distinct = |p: &Profile| {
        p.entries
            .iter()
            .flat_map(|e| e.entry.hash_ids.clone().unwrap_or_default())
            .collect::<BTreeSet<_>>()
            .len()
    };
    let separate = distinct(&Profile::read(std::slice::from_ref(&one)).unwrap())
        + distinct(&Profile::read(std::slice::from_ref(&two)).unwrap());
    assert!(
        distinct(&m) + 8 <= separate,
        "{} vs {separate}",
        distinct(&m)
    );

    let b = anonymizer("another-salt-987654321");
    let other = write_file(
        dir.path(),
        "gw3.jsonl",
        &synthetic(42, 50, 180.0, T0, 200, &b),
        &b,
    );
    let refused = goodput(&["merge"], &[&one, &other]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("different salts"));
    let kept = goodput(&["merge", "--keep-separate"], &[&one, &other]);
    assert!(kept.status.success());
    let header: Value = serde_json::from_str(
        String::from_utf8_lossy(&kept.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["salt_id"], "mixed");
}

#[test]
fn sample_makes_every_group_k_anonymous() {
    let dir = TempDir::new("sample");
    let a = anonymizer("sample-salt-0123456789");
    let file = write_file(
        dir.path(),
        "p.jsonl",
        &synthetic(50, 600, 180.0, T0, 250, &a),
        &a,
    );
    let out_path = dir.path().join("k.jsonl");
    let out = goodput(
        &["sample", "--k", "5", "-o", out_path.to_str().unwrap()],
        &[&file],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("k=5: lengths coarsened to"), "{stderr}");
    let p = Profile::read(std::slice::from_ref(&out_path)).unwrap();
    let anon = p.files[0].header.anonymized.clone().unwrap();
    assert_eq!(anon.k, 5);
    assert!(p.entries.len() as f64 >= 600.0 * 0.99);
    type Group = (Option<String>, Option<u64>, Option<u64>, i64);
    let mut groups: HashMap<Group, usize> = HashMap::new();
    for e in &p.entries {
        assert!(e.entry.hash_ids.is_none() && e.entry.tenant.is_none());
        *groups
            .entry((
                e.entry.model.clone(),
                e.entry.input_tokens,
                e.entry.output_tokens,
                e.at_ms,
            ))
            .or_default() += 1;
    }
    assert!(groups.values().all(|n| *n >= 5), "{groups:?}");
    assert!(groups.len() > 1, "some shape survives");
}

#[test]
fn merge_may_write_over_one_of_its_inputs() {
    // Every command reads all of its input (into the sort runs) before it opens `-o`.
    let dir = TempDir::new("merge-over");
    let a = anonymizer("merge-over-salt-0123456789");
    let one = write_file(
        dir.path(),
        "gw1.jsonl",
        &synthetic(50, 60, 180.0, T0, 200, &a),
        &a,
    );
    let two = write_file(
        dir.path(),
        "gw2.jsonl",
        &synthetic(51, 40, 180.0, T0 + 50, 200, &a),
        &a,
    );
    let expected = goodput(&["merge"], &[&one, &two]);
    assert!(expected.status.success());
    let out = goodput(&["merge", "-o", one.to_str().unwrap()], &[&one, &two]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&one).unwrap(), expected.stdout);
    assert_eq!(
        Profile::read(std::slice::from_ref(&one))
            .unwrap()
            .entries
            .len(),
        100
    );
}
