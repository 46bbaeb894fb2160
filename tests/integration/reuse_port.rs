//! Restart without refusing a connection: two `goodput serve --reuse-port` processes share
//! the proxy port, the old one gets SIGTERM while clients keep connecting and streaming.
//! No connection may be refused or reset, every stream must arrive complete and
//! byte-identical, and the profiles the two processes record must account for every
//! request. The procedure is the one docs/RESTART.md gives.
//!
//! The kernel hands a closing listener's queued connections to the rest of its
//! `SO_REUSEPORT` group only with `net.ipv4.tcp_migrate_req = 1`. When the test's network
//! namespace does not have it, the test runs itself again in a private one (`unshare
//! --net`, root) where it sets it, so the machine's own setting is left alone.
#![expect(
    clippy::unwrap_used,
    reason = "test: a failed set-up must stop the test"
)]

use std::{
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::common::{
    binary::Serving,
    fake::{FakeUpstream, Script, WritePlan, decode_chunked, openai_chat_events},
    temp::TempDir,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Set in the re-run inside the private network namespace.
const INNER: &str = "GOODPUT_TEST_PRIVATE_NETNS";
const TEST_NAME: &str = "restart_with_reuse_port_refuses_no_connection_and_cuts_no_stream";

/// The test's full name as the test binary lists it (its module path without the crate).
fn full_test_name() -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{TEST_NAME}"),
        None => TEST_NAME.to_owned(),
    }
}

/// Clients connecting and streaming in a loop throughout the restart.
const CLIENTS: usize = 32;
/// Events per stream and the upstream's pause before each: a stream lasts ~200 ms, so
/// the old process has streams in flight when it is told to stop.
const EVENTS: usize = 10;
const GAP: Duration = Duration::from_millis(2);

#[test]
fn restart_with_reuse_port_refuses_no_connection_and_cuts_no_stream() {
    if std::env::var_os(INNER).is_none() && goodput::run::tcp_migrate_req() != Some(true) {
        let exe = std::env::current_exe().unwrap();
        let out = Command::new("unshare")
            .args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && echo 1 > /proc/sys/net/ipv4/tcp_migrate_req && \
                 exec \"$0\" \"$1\" --exact --nocapture --test-threads=1",
            ])
            .arg(exe)
            .arg(full_test_name())
            .env(INNER, "1")
            .output();
        match out {
            Ok(out) => {
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "the restart scenario failed in a private network namespace ({}):\n{stdout}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                // A name that matches nothing runs no test and still succeeds.
                assert!(
                    stdout.contains("test result: ok. 1 passed"),
                    "the re-run did not run the scenario:\n{stdout}"
                );
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
            }
            Err(e) => panic!(
                "net.ipv4.tcp_migrate_req is 0 here and `unshare --net` could not run ({e}): \
                 run as root, or set the sysctl to 1"
            ),
        }
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(restart_under_load());
}

/// `goodput serve --reuse-port` on `proxy` (`127.0.0.1:0` for the first process, the port
/// it got for the second) with an admin port of its own and its own profile directory;
/// returns once its admin server says it is ready.
async fn serve(dir: &Path, name: &str, proxy: &str, upstream: &str) -> Serving {
    let profiles = dir.join(name);
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[server]\ndrain_timeout = \"20s\"\n[log]\naccess_log = false\n\
             [profile]\ndir = \"{}\"\ninstance = \"{name}\"\n",
            profiles.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_goodput"));
    cmd.args(["serve", "--reuse-port", "--config"])
        .arg(&cfg)
        .args(["--listen", proxy, "--admin", "127.0.0.1:0"])
        .args(["--upstream", upstream]);
    let mut served = Serving::start(cmd, Duration::from_secs(20)).unwrap();
    ready(&mut served).await;
    served
}

/// Waits until the process's admin server answers `/readyz` with 200.
async fn ready(served: &mut Serving) {
    poll_until!("goodput to be ready", Duration::from_secs(20), {
        assert!(
            served.child.try_wait().unwrap().is_none(),
            "goodput exited before it was ready:\n{}",
            served.stderr()
        );
        let mut ready = None;
        if let Ok(mut s) = TcpStream::connect(served.admin).await {
            let _ = s
                .write_all(b"GET /readyz HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
                .await;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            ready = out.starts_with(b"HTTP/1.1 200").then_some(());
        }
        ready
    });
}

async fn wait_exit(mut served: Serving) {
    let status = tokio::task::spawn_blocking(move || served.exited(Duration::from_secs(60)))
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "goodput exited with {status}");
}

/// Waits until a listener on `port` has a connection waiting in its accept queue (a
/// listening socket's `rx_queue` in `/proc/net/tcp` is its accept backlog).
async fn queued(port: u16) {
    let port = format!(":{port:04X}");
    poll_until!(
        "a connection waiting in the stopped process's accept queue",
        Duration::from_secs(30),
        {
            let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
            let waiting = table.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                f.len() > 4
                    && f[1].ends_with(&port)
                    && f[3] == "0A"
                    && f[4]
                        .split_once(':')
                        .and_then(|(_, rx)| u32::from_str_radix(rx, 16).ok())
                        .is_some_and(|rx| rx > 0)
            });
            waiting.then_some(())
        }
    );
}

/// Waits until `more` further streams have completed (the clients make progress).
async fn progress(tally: &Tally, more: usize) {
    let target = tally.completed.load(Ordering::Relaxed) + more;
    poll_until!(
        format!(
            "progress of the clients (first failure: {:?})",
            tally.failures.lock().unwrap().first()
        ),
        Duration::from_secs(30),
        { (tally.completed.load(Ordering::Relaxed) >= target).then_some(()) }
    );
}

#[derive(Default)]
struct Tally {
    completed: AtomicUsize,
    failures: std::sync::Mutex<Vec<String>>,
}

/// One streamed request over a fresh connection; the decoded body must be `expected`.
async fn one_stream(port: u16, expected: &[u8]) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    s.write_all(body).await.map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .await
        .map_err(|e| format!("read: {e} after {} bytes", out.len()))?;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no response head in {} bytes", out.len()))?;
    let (head, rest) = out.split_at(split + 4);
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(format!("status: {}", String::from_utf8_lossy(head)));
    }
    let (decoded, _) = decode_chunked(rest).ok_or("incomplete chunked body (cut stream)")?;
    if decoded != expected {
        return Err(format!(
            "body differs: {} bytes, expected {}",
            decoded.len(),
            expected.len()
        ));
    }
    Ok(())
}

/// Request lines in the profile files under `dir`, and how many of them were `ok`.
fn recorded(dir: &Path) -> (usize, usize) {
    let (mut n, mut ok) = (0, 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            // The header and the prefix-block lines carry a `type`; requests do not.
            if v.get("type").is_some() {
                continue;
            }
            n += 1;
            if v["outcome"] == "ok" {
                ok += 1;
            }
        }
    }
    (n, ok)
}

async fn restart_under_load() {
    let events = openai_chat_events(EVENTS, true);
    let expected: Vec<u8> = events.concat();
    let upstream = FakeUpstream::start(Script::sse_chunked(&events, WritePlan::Whole, GAP)).await;
    let tmp = TempDir::new("reuse-port");
    let old = serve(tmp.path(), "old", "127.0.0.1:0", &upstream.url()).await;
    let port = old.proxy.port();

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let expected = Arc::new(expected);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (stop, tally, expected) = (stop.clone(), tally.clone(), expected.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match one_stream(port, &expected).await {
                        Ok(()) => {
                            tally.completed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => tally.failures.lock().unwrap().push(e),
                    }
                }
            })
        })
        .collect();

    // Some load on the old process alone, then the new one starts beside it on its port.
    progress(&tally, CLIENTS).await;
    let new = serve(tmp.path(), "new", &old.proxy.to_string(), &upstream.url()).await;
    progress(&tally, CLIENTS).await;
    let before_stop = tally.completed.load(Ordering::Relaxed);

    // The old one stops accepting and drains its streams while clients keep coming. It is
    // paused first so that connections the kernel assigned to it wait in its accept queue
    // when it closes its listener: the case a plain close loses (they are reset), made
    // certain instead of left to chance: the stop waits until a connection is queued.
    old.signal("-STOP");
    queued(port).await;
    old.signal("-TERM");
    old.signal("-CONT");
    wait_exit(old).await;
    progress(&tally, CLIENTS).await;

    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    new.signal("-TERM");
    wait_exit(new).await;

    let failures = tally.failures.lock().unwrap().clone();
    let completed = tally.completed.load(Ordering::Relaxed);
    assert!(
        failures.is_empty(),
        "{} of {} requests failed, e.g. {:?}",
        failures.len(),
        completed + failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        completed > before_stop && before_stop > 0,
        "load ran through the restart"
    );
    let (n_old, ok_old) = recorded(&tmp.path().join("old"));
    let (n_new, ok_new) = recorded(&tmp.path().join("new"));
    assert!(n_old > 0 && n_new > 0, "both served: {n_old} and {n_new}");
    assert_eq!(
        n_old + n_new,
        completed,
        "records of both processes ({n_old} + {n_new}) account for every request"
    );
    assert_eq!(ok_old + ok_new, completed, "every record is ok");
    eprintln!(
        "restart under load: {completed} streams, {n_old} through the old process, \
         {n_new} through the new one, none refused or cut"
    );
}
