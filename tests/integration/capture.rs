//! Profiles captured through the running proxy: anonymized lines (no canaries anywhere),
//! shared prompt prefixes as shared `hash_ids`, files readable by `goodput profile`, and
//! live drift against a baseline firing on a shifted output length with a snapshot.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::{path::Path, time::Duration};

use crate::common::{binary::Serving, harness::*, temp::TempDir};
use bytes::Bytes;
use goodput::run::Running;
use http::{Request, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

const CANARIES: [&str; 4] = [
    "CANARY-PROMPT-TEXT",
    "CANARY-API-KEY",
    "CANARY-TENANT",
    "CANARY-COOKIE",
];

async fn proxy_with(upstream: &str, toml: &str) -> Running {
    start_proxy_toml(upstream, toml).await
}

/// A chat request whose prompt starts with a long shared system text (several blocks).
async fn send(proxy: &Running, user: &str, max_tokens: u32) {
    let system = "You are a careful assistant. CANARY-PROMPT-TEXT ".repeat(120);
    let body = serde_json::json!({
        "model": "capture-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req = Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .header(CONTENT_TYPE, "application/json")
        .header("authorization", "Bearer CANARY-API-KEY")
        .header("x-tenant", "CANARY-TENANT")
        .header("cookie", "session=CANARY-COOKIE")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
}

fn profile_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
}

fn goodput(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn captured_profiles_are_anonymous_and_keep_prefix_sharing() {
    let (_sim, upstream) = start_sim(fast_sim(2.0, 0.5)).await;
    let tmp = TempDir::new("record");
    let dir = tmp.path();
    let toml = format!(
        "[slo]\ntenant_header = \"x-tenant\"\n[profile]\ndir = \"{}\"\n[profile.contract]\nengine = \"sim\"\n",
        dir.display()
    );
    let proxy = proxy_with(&upstream, &toml).await;
    for i in 0..30 {
        send(&proxy, &format!("question {i}"), 8).await;
    }
    let admin = proxy.admin_addr;
    let api = admin_get(admin, "/api/v1/requests").await.1;
    let metrics_text = metrics(admin).await;
    proxy.shutdown().await;

    let files = profile_files(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    for canary in CANARIES {
        assert!(!text.contains(canary), "{canary} in the profile");
        assert!(
            !api.contains(canary) && !metrics_text.contains(canary),
            "{canary} exposed"
        );
    }
    assert!(!text.contains("127.0.0.1"), "client address in the profile");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines[0]["contract"]["engine"], "sim");
    let entries: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("type").is_none_or(|t| t == "request"))
        .filter(|l| l.get("t_ms").is_some())
        .collect();
    assert_eq!(entries.len(), 30, "{text}");
    let first = entries[0]["hash_ids"].as_array().unwrap();
    let second = entries[1]["hash_ids"].as_array().unwrap();
    assert!(first.len() >= 3, "{first:?}");
    // The shared system prompt fills the leading blocks: same ids; the tail differs.
    assert_eq!(first[..first.len() - 1], second[..second.len() - 1]);
    assert!(
        entries
            .iter()
            .all(|e| e["tenant"].as_str().is_some_and(|t| !t.is_empty()))
    );
    assert!(
        entries
            .iter()
            .all(|e| e["output_tokens"] == 8 && e["max_tokens"] == 8)
    );

    let path = files[0].to_str().unwrap();
    let (code, out) = goodput(&["profile", "summarize", "--json", path]);
    assert_eq!(code, 0, "{out}");
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["requests"], 30, "{summary}");
    let (code, out) = goodput(&["profile", "export", "--format", "mooncake", path]);
    assert_eq!(code, 0);
    for line in out.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let input = v["input_length"].as_u64().unwrap();
        assert_eq!(
            v["hash_ids"].as_array().unwrap().len() as u64,
            input.div_ceil(512),
            "{v}"
        );
    }
    // Parquet, named with --out: every request, readable by the parquet crate's reader.
    let pq = tmp.path().join("out.parquet");
    let (code, out) = goodput(&[
        "profile",
        "export",
        "--format",
        "parquet",
        "--out",
        pq.to_str().unwrap(),
        path,
    ]);
    assert_eq!((code, out.as_str()), (0, ""));
    let reader =
        parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&pq).unwrap())
            .unwrap();
    use parquet::file::reader::FileReader as _;
    assert_eq!(reader.metadata().file_metadata().num_rows(), 30);
    let unwritable = tmp.path().join("no/such/dir/out.parquet");
    let (code, _) = goodput(&[
        "profile",
        "export",
        "--format",
        "parquet",
        "--out",
        unwritable.to_str().unwrap(),
        path,
    ]);
    assert_eq!(code, 2, "an output that cannot be created is an error");
    let (code, _) = goodput(&["profile", "diff", path, path]);
    assert_eq!(code, 0, "a profile does not drift from itself");
}

#[tokio::test(flavor = "multi_thread")]
async fn live_drift_fires_on_shifted_output_length_and_writes_a_snapshot() {
    let (_sim, upstream) = start_sim(fast_sim(1.0, 0.2)).await;
    let tmp = TempDir::new("drift");
    let dir = tmp.path();
    // The accepted baseline: short answers.
    let proxy = proxy_with(
        &upstream,
        &format!("[profile]\ndir = \"{}\"\n", dir.display()),
    )
    .await;
    for i in 0..40 {
        send(&proxy, &format!("q{i}"), 8).await;
    }
    proxy.shutdown().await;
    let baseline = profile_files(dir).pop().unwrap();
    let snapshots = dir.join("snapshots");
    let toml = format!(
        "[drift]\nbaseline = \"{}\"\nevery = \"1s\"\nwindow = \"1m\"\nmin_samples = 20\nfire_after = 1\nsnapshot_dir = \"{}\"\n",
        baseline.display(),
        snapshots.display()
    );
    let proxy = proxy_with(&upstream, &toml).await;
    // Production now asks for much longer answers.
    for i in 0..40 {
        send(&proxy, &format!("q{i}"), 200).await;
    }
    let status = poll_loop!(
        deadline = tokio::time::Instant::now() + Duration::from_secs(8),
        {
            let (code, text) = admin_get(proxy.admin_addr, "/api/v1/drift").await;
            if code == 200 {
                let v: Value = serde_json::from_str(&text).unwrap();
                if v["drifted"] == true {
                    break v;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "drift never fired: {text}"
            );
        }
    );
    let active: Vec<&str> = status["active"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(active.iter().any(|d| d.contains("output")), "{status}");
    assert!(
        !active.iter().any(|d| d.contains("model")),
        "model mix did not change: {status}"
    );
    let text = metrics(proxy.admin_addr).await;
    assert!(
        text.lines().any(
            |l| l.starts_with("goodput_reacceptance_required{dimension=\"output")
                && l.ends_with(" 1")
        ),
        "{text}"
    );
    poll_until!("a drift snapshot", Duration::from_secs(5), {
        (std::fs::read_dir(&snapshots).map_or(0, |d| d.count()) > 0).then_some(())
    });
    proxy.shutdown().await;
}

/// `kill -9` of a recording proxy: every line handed to the OS before the crash is intact
/// and readable; the file has no header-less or corrupt lines.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_proxy_leaves_a_readable_profile() {
    let (_sim, upstream) = start_sim(fast_sim(1.0, 0.2)).await;
    let tmp = TempDir::new("kill");
    let dir = tmp.path();
    let cfg = dir.join("goodput.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [upstream]\nurl = \"{upstream}\"\n[profile]\ndir = \"{}\"\n",
            dir.join("profiles").display()
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"));
    cmd.args(["serve", "--config", cfg.to_str().unwrap()]);
    let mut served = Serving::start(cmd, Duration::from_secs(20)).unwrap();
    let proxy_url = format!("http://{}/v1/chat/completions", served.proxy);
    for i in 0..25 {
        let (status, _) = post_collect(&client(), &proxy_url, chat_body(true, 4, i % 2 == 0)).await;
        assert_eq!(status, 200);
    }
    // The records reach the writer, which writes them out when it goes idle: the kill
    // comes once the file holds all 25.
    wait_records(served.admin, 25, Duration::from_secs(10)).await;
    let summarize = |files: &[std::path::PathBuf]| {
        let (code, out) = goodput(&["profile", "summarize", "--json", files[0].to_str().unwrap()]);
        (code == 0).then(|| serde_json::from_str::<Value>(&out).unwrap())
    };
    poll_loop!(
        deadline = tokio::time::Instant::now() + Duration::from_secs(20),
        {
            let files = profile_files(&dir.join("profiles"));
            if files.len() == 1 && summarize(&files).is_some_and(|s| s["requests"] == 25) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the profile never held 25 requests: {files:?}"
            );
        }
    );
    served.signal("-KILL");
    served.exited(Duration::from_secs(10)).unwrap();

    let files = profile_files(&dir.join("profiles"));
    assert_eq!(files.len(), 1, "{files:?}");
    let summary = summarize(&files).expect("a readable profile after kill -9");
    assert_eq!(summary["requests"], 25, "{summary}");
}

/// An engine that says what it is (`/v1/models`, and vLLM's `/version` when `version`
/// holds one) and nothing else; counts the requests it answered.
async fn engine_that_says(
    version: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (version, asked) = (version.clone(), asked.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let path = String::from_utf8_lossy(&head)
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("")
                    .to_owned();
                let now = version.lock().unwrap().clone();
                let body = match (path.as_str(), now) {
                    ("/v1/models", Some(_)) => {
                        Some(r#"{"data":[{"id":"m","owned_by":"vllm"}]}"#.to_owned())
                    }
                    ("/version", Some(v)) => Some(format!(r#"{{"version":"{v}"}}"#)),
                    _ => None,
                };
                asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = match body {
                    Some(b) => format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{b}",
                        b.len()
                    ),
                    None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\
                             connection: close\r\n\r\n"
                        .to_owned(),
                };
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

/// A baseline profile of a few requests, recorded through the proxy in `dir`.
async fn baseline_in(dir: &Path) -> std::path::PathBuf {
    let (_sim, upstream) = start_sim(fast_sim(1.0, 0.2)).await;
    let proxy = proxy_with(
        &upstream,
        &format!("[profile]\ndir = \"{}\"\n", dir.display()),
    )
    .await;
    for i in 0..3 {
        send(&proxy, &format!("q{i}"), 8).await;
    }
    proxy.shutdown().await;
    profile_files(dir).pop().unwrap()
}

fn drift_toml(baseline: &Path, snapshots: &Path) -> String {
    format!(
        "[drift]\nbaseline = \"{}\"\nevery = \"1s\"\nwindow = \"1m\"\nmin_samples = 20\n\
         snapshot_dir = \"{}\"\nidentity_interval = \"200ms\"\n",
        baseline.display(),
        snapshots.display()
    )
}

/// The upstream's version changes under live traffic: `system` fires, with no traffic
/// needed, naming both identities in `/api/v1/drift`, the metrics and the snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_engine_version_fires_the_system_trigger_naming_both() {
    let tmp = TempDir::new("system");
    let baseline = baseline_in(tmp.path()).await;
    let version = std::sync::Arc::new(std::sync::Mutex::new(Some("0.31.0".to_owned())));
    let engine = engine_that_says(version.clone(), Default::default()).await;
    let snapshots = tmp.path().join("snapshots");
    let proxy = proxy_with(&engine, &drift_toml(&baseline, &snapshots)).await;
    let before = "goodput_upstream_info{engine=\"vllm\",version=\"0.31.0\",model=\"m\",\
                  revision=\"unknown\"} 1";
    poll_until!("the first identity read", Duration::from_secs(10), {
        metrics(proxy.admin_addr)
            .await
            .lines()
            .any(|l| l == before)
            .then_some(())
    });
    *version.lock().unwrap() = Some("0.32.0".to_owned());
    let status = poll_until!("the system trigger", Duration::from_secs(10), {
        let (code, text) = admin_get(proxy.admin_addr, "/api/v1/drift").await;
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        (code == 200 && v["system"].is_object()).then_some(v)
    });
    assert_eq!(status["system"]["from"]["version"], "0.31.0", "{status}");
    assert_eq!(status["system"]["to"]["version"], "0.32.0", "{status}");
    assert_eq!(
        status["system"]["explanation"],
        "upstream changed: version 0.31.0 → 0.32.0"
    );
    assert!(
        status["active"]
            .as_array()
            .unwrap()
            .contains(&"system".into())
    );
    assert_eq!(status["drifted"], true);
    let text = metrics(proxy.admin_addr).await;
    assert!(
        text.lines()
            .any(|l| l == "goodput_reacceptance_required{dimension=\"system\"} 1"),
        "{text}"
    );
    assert!(text.contains("version=\"0.32.0\""), "{text}");
    assert!(
        !text.contains("version=\"0.31.0\""),
        "the old identity's series is gone"
    );
    let snapshot = poll_until!("a snapshot", Duration::from_secs(5), {
        std::fs::read_dir(&snapshots)
            .ok()
            .and_then(|mut d| d.next())
            .map(|e| e.unwrap().path())
    });
    let header: Value = serde_json::from_str(
        std::fs::read_to_string(&snapshot)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["system_change"]["from"]["version"], "0.31.0");
    assert_eq!(header["system_change"]["to"]["version"], "0.32.0");
    proxy.shutdown().await;
}

/// An upstream that says nothing about itself, or stops answering, is unknown: never a
/// change, whatever it answered before.
#[tokio::test(flavor = "multi_thread")]
async fn an_upstream_without_identity_endpoints_never_fires_it() {
    let tmp = TempDir::new("silent");
    let baseline = baseline_in(tmp.path()).await;
    let version = std::sync::Arc::new(std::sync::Mutex::new(Some("1.0".to_owned())));
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let engine = engine_that_says(version.clone(), asked.clone()).await;
    let proxy = proxy_with(&engine, &drift_toml(&baseline, &tmp.path().join("s"))).await;
    let read = |n: usize| {
        let asked = asked.clone();
        async move {
            poll_until!("identity reads", Duration::from_secs(10), {
                (asked.load(std::sync::atomic::Ordering::SeqCst) >= n).then_some(())
            });
        }
    };
    read(2).await;
    // It stops saying anything: every endpoint 404 from now on.
    *version.lock().unwrap() = None;
    let now = asked.load(std::sync::atomic::Ordering::SeqCst);
    // Five endpoints a read: three more reads at least.
    read(now + 15).await;
    let status = poll_until!("an evaluation", Duration::from_secs(10), {
        let (code, text) = admin_get(proxy.admin_addr, "/api/v1/drift").await;
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        (code == 200 && v["evaluations"].as_u64() >= Some(1)).then_some(v)
    });
    assert!(status["system"].is_null(), "{status}");
    let text = metrics(proxy.admin_addr).await;
    assert!(
        !text
            .lines()
            .any(|l| l == "goodput_reacceptance_required{dimension=\"system\"} 1"),
        "{text}"
    );
    proxy.shutdown().await;
}
