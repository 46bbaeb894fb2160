//! The binary: exit code 64 with every problem listed, 0 on SIGTERM.

use super::*;

/// `text` as the file `name` in a directory of its own, returned with the file's path: the
/// directory goes when the test drops it.
#[expect(
    clippy::unwrap_used,
    reason = "a test that cannot write its config cannot run"
)]
fn temp_config(name: &str, text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new("config");
    let path = dir.write(name, text).unwrap();
    (dir, path)
}

const BAD_CONFIG: &str = r#"
[server]
listen = "not-an-address"
header_read_timeout = "0s"

[admin]
listen = "also-not-an-address"

[upstream]
url = "ftp://example"

[measure]
channel_capacity = 0

[log]
format = "xml"
"#;

const BAD_KEYS: [&str; 6] = [
    "server.listen",
    "admin.listen",
    "server.header_read_timeout",
    "upstream.url",
    "measure.channel_capacity",
    "log.format",
];

#[test]
fn bad_config_exits_64_and_lists_every_problem() {
    let (_dir, bad) = temp_config("bad.toml", BAD_CONFIG);
    let bin = env!("CARGO_BIN_EXE_goodput");
    let runs = [
        vec![
            "serve".to_owned(),
            "--config".to_owned(),
            bad.display().to_string(),
        ],
        vec!["check-config".to_owned(), bad.display().to_string()],
        vec![
            "serve".to_owned(),
            "--check-config".to_owned(),
            bad.display().to_string(),
        ],
    ];
    for args in runs {
        let out = Command::new(bin).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        for key in BAD_KEYS {
            assert!(
                stderr.contains(key),
                "{args:?}: `{key}` not listed in:\n{stderr}"
            );
        }
        assert!(stderr.contains("6 problem(s)"), "{args:?}: {stderr}");
    }
    let missing = Command::new(bin)
        .args(["serve", "--config", "/nonexistent/goodput.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
}

#[test]
fn good_config_checks_clean() {
    let (_dir, good) = temp_config("good.toml", "[upstream]\nurl = \"http://127.0.0.1:8000\"\n");
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["check-config", &good.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_stops_serve_with_exit_code_0() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["serve", "--upstream", "http://127.0.0.1:1"])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = Instant::now();
    let mut serving = false;
    while !serving && started.elapsed() < Duration::from_secs(10) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            serving = line.contains("goodput serving");
        }
    }
    if !serving {
        let _ = child.kill();
        panic!("goodput serve never said it was serving");
    }
    // The signal handlers are installed before the start-up line.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status =
        crate::common::wait::blocking(Duration::from_secs(5), || child.try_wait().unwrap());
    let Some(status) = status else {
        let _ = child.kill();
        panic!("goodput serve did not exit within 5 s of SIGTERM");
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(
        rest.iter().any(|l| l.contains("goodput stopped")),
        "{rest:?}"
    );
}
