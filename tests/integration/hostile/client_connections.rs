//! Client connections: `server.max_connections`, the open-files limit.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn connections_past_the_limit_are_closed_at_once_and_admin_still_answers() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.max_connections = 4;
    let proxy = start_proxy_with(cfg).await;
    let gauge = "goodput_client_connections";
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(proxy.proxy_addr).await.unwrap());
    }
    assert_eq!(wait_metric(proxy.admin_addr, gauge, 4.0).await, 4.0);
    // The fifth is closed without a word, long before any header timeout.
    let mut fifth = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, fifth.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "closed at once, with nothing said: {read:?}"
    );
    let series = "goodput_limit_rejections_total{limit=\"server.max_connections\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    assert!(up.requests().await.is_empty());
    // A place comes free: the next client is served.
    drop(silent.pop());
    poll_loop!(deadline = tokio::time::Instant::now() + WAIT, {
        if metric(proxy.admin_addr, gauge).await <= 3.0 || tokio::time::Instant::now() >= deadline {
            break;
        }
    });
    let (status, _) = raw_status(proxy.proxy_addr, &raw_post(CHAT, "{}")).await;
    assert_eq!(status, 200);
    // The silent ones have nothing to finish: they do not hold the drain (30 s) back.
    let shut = tokio::time::timeout(Duration::from_secs(5), proxy.shutdown()).await;
    assert!(shut.is_ok(), "silent connections held the drain");
    drop(silent);
}

/// A `goodput serve` child process, killed when dropped.
struct ServeProcess {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    /// The log lines up to "goodput serving".
    start_up: Vec<String>,
    lines: mpsc::Receiver<String>,
}

impl ServeProcess {
    /// Every log line so far.
    fn log(&self) -> Vec<String> {
        let mut all = self.start_up.clone();
        all.extend(self.lines.try_iter());
        all
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `goodput serve` in front of `upstream` after `ulimit {ulimit}` (e.g. `-Sn 1024`
/// for the soft open-files limit alone), and waits until it serves.
fn serve_with_ulimit(upstream: &str, ulimit: &str) -> ServeProcess {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {ulimit} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_goodput"))
        .args(["serve", "--upstream", upstream])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Read to the end, so that the child never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr = |line: &str, key: &str| -> Option<SocketAddr> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|a| a.parse().ok())
    };
    let started = std::time::Instant::now();
    let mut start_up = Vec::new();
    while started.elapsed() < WAIT {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        start_up.push(line.clone());
        if line.contains("goodput serving")
            && let (Some(proxy), Some(admin)) = (addr(&line, "proxy="), addr(&line, "admin="))
        {
            return ServeProcess {
                child,
                proxy,
                admin,
                start_up,
                lines: rx,
            };
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("goodput serve never said it was serving");
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_connections_under_a_low_soft_fd_limit_do_not_lock_out_a_new_client() {
    const SILENT: usize = 1_100;
    // This process needs the descriptors too: raise (never lower) its own soft limit.
    let have = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0);
    let (_, hard) = rlimit::Resource::NOFILE.get().unwrap_or((0, 0));
    if have < 3 * SILENT as u64 || hard < 3 * SILENT as u64 {
        eprintln!("skipped: the hard open-files limit ({hard}) is too low for this test");
        return;
    }
    let up = FakeUpstream::start(ok_json()).await;
    let serve = serve_with_ulimit(&up.url(), "-Sn 1024");
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(serve.proxy).await.unwrap());
    }
    // A new client is answered at once, not after the silent ones' header timeout.
    let (status, _) = raw_status(serve.proxy, &raw_post(CHAT, "{}")).await;
    assert_eq!(status, 200);
    let (status, _) = admin_get(serve.admin, "/healthz").await;
    assert_eq!(status, 200);
    // Both limits are logged.
    let log = serve.log();
    assert!(
        log.iter()
            .any(|l| l.contains("open-files limit") && l.contains("soft_was=1024")),
        "{log:#?}"
    );
    drop(silent);
}

#[tokio::test(flavor = "multi_thread")]
async fn under_a_low_hard_fd_limit_excess_connections_are_closed_and_admin_answers() {
    const SILENT: usize = 1_100;
    let have = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0);
    if have < 3 * SILENT as u64 {
        eprintln!("skipped: the open-files limit ({have}) is too low for this test");
        return;
    }
    let up = FakeUpstream::start(ok_json()).await;
    // Soft and hard: nothing to raise, so max_connections is held to 512.
    let serve = serve_with_ulimit(&up.url(), "-n 1024");
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(serve.proxy).await.unwrap());
    }
    let series = "goodput_limit_rejections_total{limit=\"server.max_connections\"}";
    let rejected = wait_metric(serve.admin, series, (SILENT - 512) as f64).await;
    assert_eq!(rejected, (SILENT - 512) as f64);
    // A new client is told at once (closed), not left in the listen queue.
    let mut late = TcpStream::connect(serve.proxy).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, late.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    let (status, _) = admin_get(serve.admin, "/healthz").await;
    assert_eq!(status, 200);
    // The log says why, once; no storm of accept failures.
    let lines = serve.log();
    let said = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(said("using the lower number"), 1, "{lines:#?}");
    assert!(said("accept failed") <= 1, "{lines:#?}");
    drop(silent);
}
