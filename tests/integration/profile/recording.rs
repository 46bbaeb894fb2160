//! Recording through the real writer thread into temporary directories, read back with
//! the reader the commands use.

use std::{path::Path, time::Duration};

use goodput::{
    config::{self, Config, Overrides},
    profile::{Anonymizer, Clock, Profile, ProfileLine, ProfileMetrics, ProfileRecorder},
};
use prometheus_client::registry::Registry;

use super::support::{CANARIES, sample_value, scrape, synthetic};
use crate::common::temp::TempDir;

fn config(dir: &Path, extra: &str) -> Config {
    let text = format!(
        "[profile]\ndir = \"{}\"\ninstance = \"t1\"\nsalt = \"integration-test-salt\"\n{extra}\n[profile.contract]\nengine = \"sim\"\nhardware = \"2 cores\"\n",
        dir.display()
    );
    let o = Overrides {
        upstream: Some("http://127.0.0.1:9".into()),
        ..Default::default()
    };
    config::load_str(&text, "test", &o).unwrap()
}

struct Rig {
    registry: Registry,
    anon: Anonymizer,
    recorder: ProfileRecorder,
}

fn start(cfg: &Config) -> Rig {
    let mut registry = Registry::default();
    let metrics = ProfileMetrics::register(&mut registry);
    let anon = Anonymizer::new(&cfg.profile);
    let recorder =
        ProfileRecorder::start(&cfg.profile, anon.clone(), &metrics, Clock::of_runtime()).unwrap();
    Rig {
        registry,
        anon,
        recorder,
    }
}

fn now_ms() -> i64 {
    goodput::profile::unix_ms(std::time::SystemTime::now())
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn lines_round_trip_through_the_writer() {
    let dir = TempDir::new("rt");
    let cfg = config(dir.path(), "");
    let rig = start(&cfg);
    let lines = synthetic(1, 50, 200.0, now_ms(), 10, &rig.anon);
    for l in &lines {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    let written = files(dir.path());
    assert_eq!(written.len(), 1, "{written:?}");
    let name = written[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.starts_with("goodput-2") && name.ends_with("Z-t1.jsonl"),
        "{name}"
    );
    let p = Profile::read(&written).unwrap();
    let h = &p.files[0].header;
    assert_eq!((h.format.as_str(), h.version), ("goodput-profile", 1));
    assert_eq!(h.salt_id, rig.anon.salt_id());
    assert_eq!(h.contract.engine.as_deref(), Some("sim"));
    assert_eq!(h.block.size, 2048);
    assert_eq!(p.entries.len(), 50);
    for (e, l) in p.entries.iter().zip(&lines) {
        assert_eq!(e.at_ms, l.arrival_ms);
        assert_eq!(e.entry.input_tokens, l.input_tokens);
        assert_eq!(e.entry.output_tokens, l.output_tokens);
        assert_eq!(e.entry.tenant, l.tenant);
        assert_eq!(
            e.entry.hash_ids.as_ref().unwrap().len(),
            l.block_hashes.len()
        );
    }
    // Four shared system prompts: blocks repeat, so ids are small and reused.
    let max_id = p
        .entries
        .iter()
        .flat_map(|e| e.entry.hash_ids.clone().unwrap())
        .max()
        .unwrap();
    let total: usize = lines.iter().map(|l| l.block_hashes.len()).sum();
    assert!((max_id as usize) < total / 2, "{max_id} of {total}");
    assert!(p.notes().is_empty(), "{:?}", p.notes());
    let text = scrape(&rig.registry);
    assert_eq!(
        sample_value(&text, "goodput_profile_records_total"),
        50.0,
        "{text}"
    );
}

#[tokio::test]
async fn rotation_by_size_restarts_ids_and_retention_keeps_the_newest() {
    let dir = TempDir::new("size");
    let rig = start(&config(dir.path(), "rotate_bytes = 6000\nmax_files = 0"));
    let lines = synthetic(2, 60, 200.0, now_ms(), 10, &rig.anon);
    for l in &lines {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    let written = files(dir.path());
    assert!(written.len() >= 3, "{written:?}");
    let mut total = 0;
    for f in &written {
        let p = Profile::read(std::slice::from_ref(f)).unwrap();
        total += p.entries.len();
        // Ids restart in every file, and every id has its key in the same file.
        let ids: Vec<u32> = p
            .entries
            .iter()
            .flat_map(|e| e.entry.hash_ids.clone().unwrap())
            .collect();
        assert_eq!(ids.iter().min(), Some(&0), "{f:?}");
        assert!(ids.iter().all(|id| p.files[0].keys.get(*id).is_some()));
    }
    assert_eq!(total, 60);
    // The same traffic with `max_files = 2`: only the two newest files are left.
    let dir2 = TempDir::new("retention");
    let rig = start(&config(dir2.path(), "rotate_bytes = 6000\nmax_files = 2"));
    for l in &lines {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    let kept = files(dir2.path());
    assert_eq!(kept.len(), 2, "{kept:?}");
    let p = Profile::read(&kept).unwrap();
    assert_eq!(
        p.entries.last().unwrap().at_ms,
        lines.last().unwrap().arrival_ms
    );
}

// The writer reads the runtime's clock: paused, it moves only when the test advances it.
#[tokio::test(start_paused = true)]
async fn rotation_by_time_without_traffic() {
    let dir = TempDir::new("time");
    let rig = start(&config(dir.path(), "rotate_every = \"300ms\""));
    let lines = synthetic(3, 10, 200.0, now_ms(), 10, &rig.anon);
    for l in &lines[..5] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.flush().await;
    tokio::time::advance(Duration::from_millis(800)).await;
    rig.recorder.flush().await;
    // The idle file was closed on its own: the directory holds one finished file.
    assert_eq!(files(dir.path()).len(), 1);
    for l in &lines[5..] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    let written = files(dir.path());
    assert_eq!(written.len(), 2, "{written:?}");
    assert_eq!(Profile::read(&written).unwrap().entries.len(), 10);
}

#[tokio::test]
async fn a_torn_last_line_is_skipped_and_reported() {
    let dir = TempDir::new("torn");
    let rig = start(&config(dir.path(), ""));
    for l in synthetic(4, 20, 200.0, now_ms(), 10, &rig.anon) {
        rig.recorder.record(l);
    }
    rig.recorder.clone().shutdown().await;
    let path = files(dir.path()).remove(0);
    // What a crash mid-write leaves: the last line cut short, no newline.
    let text = std::fs::read(&path).unwrap();
    std::fs::write(&path, &text[..text.len() - 25]).unwrap();
    let p = Profile::read(std::slice::from_ref(&path)).unwrap();
    assert_eq!(p.entries.len(), 19);
    assert!(p.files[0].report.torn_last_line);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["profile", "summarize"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("torn last line"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("requests       19"));
}

#[tokio::test(start_paused = true)]
async fn an_unwritable_directory_drops_and_recording_resumes() {
    let dir = TempDir::new("disk");
    let target = dir.path().join("profiles");
    // A file where the directory should be: every open fails (whoever runs the test).
    std::fs::write(&target, b"in the way").unwrap();
    let rig = start(&config(&target, ""));
    let lines = synthetic(5, 10, 200.0, now_ms(), 10, &rig.anon);
    for l in &lines[..5] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.flush().await;
    let text = scrape(&rig.registry);
    let dropped = "goodput_profile_records_dropped_total{reason=\"disk\"}";
    assert_eq!(sample_value(&text, dropped), 5.0, "{text}");
    assert_eq!(sample_value(&text, "goodput_profile_records_total"), 0.0);
    std::fs::remove_file(&target).unwrap();
    // Past the first retry (1 s after the error).
    tokio::time::advance(Duration::from_millis(1200)).await;
    for l in &lines[5..] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    let text = scrape(&rig.registry);
    assert_eq!(
        sample_value(&text, "goodput_profile_records_total"),
        5.0,
        "{text}"
    );
    assert_eq!(sample_value(&text, dropped), 5.0);
    assert_eq!(Profile::read(&files(&target)).unwrap().entries.len(), 5);
}

/// A small tmpfs filled up, then made read-only: needs root (mount); skipped otherwise.
#[tokio::test(start_paused = true)]
async fn a_full_then_read_only_disk_drops_and_resumes() {
    let dir = TempDir::new("tmpfs");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = |args: &[&str]| {
        std::process::Command::new("mount")
            .args(args)
            .arg(&mnt)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !mount(&["-t", "tmpfs", "-o", "size=64k", "tmpfs"]) {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _guard = Unmount(&mnt);
    let filler = mnt.join("filler");
    let mut chunk = 0;
    while std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&filler)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &[0u8; 4096]))
        .is_ok()
    {
        chunk += 1;
        assert!(chunk < 100, "the tmpfs did not fill up");
    }
    let cfg = config(&mnt, "");
    let rig = start(&cfg);
    let lines = synthetic(6, 12, 200.0, now_ms(), 10, &rig.anon);
    for l in &lines[..4] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.flush().await;
    let dropped = "goodput_profile_records_dropped_total{reason=\"disk\"}";
    assert_eq!(sample_value(&scrape(&rig.registry), dropped), 4.0);
    std::fs::remove_file(&filler).unwrap();
    // Past the first retry (1 s after the error).
    tokio::time::advance(Duration::from_millis(1200)).await;
    for l in &lines[4..8] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    let text = scrape(&rig.registry);
    assert_eq!(
        sample_value(&text, "goodput_profile_records_total"),
        4.0,
        "{text}"
    );
    // Read-only (EROFS): a new recorder cannot open a file; back to writable, it resumes.
    assert!(mount(&["-o", "remount,ro"]));
    let rig = start(&cfg);
    for l in &lines[8..10] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.flush().await;
    assert_eq!(sample_value(&scrape(&rig.registry), dropped), 2.0);
    assert!(mount(&["-o", "remount,rw"]));
    // Past the first retry (1 s after the error).
    tokio::time::advance(Duration::from_millis(1200)).await;
    for l in &lines[10..] {
        rig.recorder.record(l.clone());
    }
    rig.recorder.clone().shutdown().await;
    assert_eq!(
        sample_value(&scrape(&rig.registry), "goodput_profile_records_total"),
        2.0
    );
    assert_eq!(Profile::read(&files(&mnt)).unwrap().entries.len(), 6);
}

#[tokio::test]
async fn a_full_queue_drops_without_blocking() {
    let dir = TempDir::new("queue");
    let rig = start(&config(dir.path(), "queue = 1"));
    let lines = synthetic(7, 200, 200.0, now_ms(), 10, &rig.anon);
    for _ in 0..20 {
        for l in &lines {
            rig.recorder.record(l.clone());
        }
    }
    rig.recorder.clone().shutdown().await;
    let text = scrape(&rig.registry);
    let written = sample_value(&text, "goodput_profile_records_total");
    let dropped = sample_value(
        &text,
        "goodput_profile_records_dropped_total{reason=\"queue_full\"}",
    );
    assert_eq!(written + dropped, 4000.0, "{text}");
    assert_eq!(
        Profile::read(&files(dir.path())).unwrap().entries.len() as f64,
        written
    );
}

#[tokio::test]
async fn no_content_header_value_or_id_reaches_a_profile() {
    let dir = TempDir::new("canary");
    let cfg = config(dir.path(), "block_bytes = 64");
    let rig = start(&cfg);
    let body = serde_json::json!({
        "model": "llama",
        "messages": [{"role": "user", "content": format!("{} please", CANARIES[0]).repeat(40)}],
    })
    .to_string();
    let mut record = super::support::record(CANARIES[2]);
    let tenant = goodput::slo::tenant_hash(&cfg.slo.tenant_salt, CANARIES[1].as_bytes());
    record.tenant = Some(tenant);
    let blocks = rig.anon.blocks(
        goodput::decode::Api::ChatCompletions,
        Some("llama"),
        body.as_bytes(),
    );
    assert!(blocks.len() > 10);
    let line = ProfileLine::from_record(
        &record,
        Some(64),
        record.tenant.map(|t| rig.anon.tenant(t)),
        blocks,
    );
    rig.recorder.record(line);
    rig.recorder.clone().shutdown().await;
    let written = files(dir.path());
    let mut everything = String::new();
    for f in &written {
        everything.push_str(&std::fs::read_to_string(f).unwrap());
    }
    for args in [
        vec!["summarize", "--json"],
        vec!["export", "--format", "mooncake"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"))
            .arg("profile")
            .args(&args)
            .args(&written)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        everything.push_str(&String::from_utf8_lossy(&out.stdout));
        everything.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    for canary in CANARIES.iter().chain(&["integration-test-salt", "please"]) {
        assert!(
            !everything.contains(canary),
            "{canary} leaked:\n{everything}"
        );
    }
    assert!(
        everything.contains("\"tenant\":\""),
        "the tenant is kept as a salted id"
    );
}
