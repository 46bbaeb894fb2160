//! Client connections: `server.max_connections`, the open-files limit and its division,
//! connections closed to make room.

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

/// Raises (never lowers) this process's own soft open-files limit; false (the test is
/// skipped) if it cannot hold `needed`.
fn room_for(needed: usize) -> bool {
    let have = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0);
    if have < needed as u64 {
        eprintln!("skipped: the open-files limit ({have}) is too low for this test");
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn under_a_low_hard_fd_limit_silent_connections_make_room_for_a_new_client() {
    const SILENT: usize = 1_100;
    if !room_for(3 * SILENT) {
        return;
    }
    let up = FakeUpstream::start(ok_json()).await;
    // Soft and hard: nothing to raise. 1,024 descriptors: 128 kept, 448 for client
    // connections, 448 for upstream ones.
    let serve = serve_with_ulimit(&up.url(), "-n 1024");
    let budget = metrics(serve.admin).await;
    for (share, n) in [
        ("open_files", 1024.0),
        ("client_connections", 448.0),
        ("upstream_connections", 448.0),
        ("reserve", 128.0),
    ] {
        let series = format!("goodput_file_budget{{share=\"{share}\"}}");
        assert_eq!(metric_value(&budget, &series), Some(n), "{budget}");
    }
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(serve.proxy).await.unwrap());
    }
    // The excess is told at once (closed), not left in the listen queue.
    let gauge = "goodput_client_connections";
    assert_eq!(wait_metric(serve.admin, gauge, 448.0).await, 448.0);
    // A new client is served once the oldest silent connection is older than
    // server.min_connection_age (3 s): retried as it is closed, within 5 s in all.
    let started = std::time::Instant::now();
    let mut attempts = 0;
    let status = poll_until!("a new client to be served", Duration::from_secs(5), {
        attempts += 1;
        let (status, _) = raw_status(serve.proxy, &raw_post(CHAT, "{}")).await;
        // Closed at once, unanswered (0): the next attempt after a moment.
        (status != 0).then_some(status)
    });
    assert_eq!(
        status,
        200,
        "after {attempts} attempts in {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let series = "goodput_client_connections_closed_for_room_total{waiting=\"first_request\"}";
    assert!(metric(serve.admin, series).await >= 1.0);
    assert!(metric(serve.admin, gauge).await <= 448.0);
    let (status, _) = admin_get(serve.admin, "/healthz").await;
    assert_eq!(status, 200);
    // The log says why, once; no storm of accept failures.
    let lines = serve.log();
    let said = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(said("open-files budget open_files="), 1, "{lines:#?}");
    assert_eq!(said("server.max_connections is more than"), 1, "{lines:#?}");
    assert!(said("accept failed") <= 1, "{lines:#?}");
    drop(silent);
}

#[tokio::test(flavor = "multi_thread")]
async fn under_a_low_hard_fd_limit_five_thousand_http2_streams_are_all_answered() {
    const STREAMS: usize = 5_000;
    if !room_for(2_048) {
        return;
    }
    let up = FakeUpstream::start(ok_json()).await;
    let serve = serve_with_ulimit(&up.url(), "-n 1024");
    let send = h2_connect(serve.proxy).await;
    let mut set = JoinSet::new();
    for _ in 0..STREAMS {
        let mut send = send.clone();
        let req = h2_post(serve.proxy, "{}");
        set.spawn(async move {
            let resp = send.send_request(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        });
    }
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    while let Some(answer) = set.join_next().await {
        let (status, body) = answer.unwrap();
        *statuses.entry(status).or_default() += 1;
        if status != 200 {
            eprintln!("{status}: {}", String::from_utf8_lossy(&body));
        }
    }
    assert_eq!(statuses.get(&200), Some(&STREAMS), "{statuses:?}");
    assert!(
        up.connections() <= 448,
        "{} upstream connections",
        up.connections()
    );
    let lines = serve.log();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("upstream.max_connections is more than")),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_cap_a_keep_alive_connection_idle_between_requests_makes_room_first() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.max_connections = 2;
    cfg.server.limits.min_connection_age = Duration::ZERO;
    let proxy = start_proxy_with(cfg).await;
    let gauge = "goodput_client_connections";
    // One silent connection, then one that was served and stays open between requests.
    let mut silent = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    assert_eq!(wait_metric(proxy.admin_addr, gauge, 1.0).await, 1.0);
    let mut kept = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    kept.write_all(&keep_alive_post()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    let _ = wait_records(proxy.admin_addr, 1, WAIT).await;
    // A third client: the idle keep-alive connection goes, though the silent one is older.
    let (status, _) = raw_status(proxy.proxy_addr, &raw_post(CHAT, "{}")).await;
    assert_eq!(status, 200);
    let closed = tokio::time::timeout(WAIT, kept.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
    let series = |waiting: &str| {
        format!("goodput_client_connections_closed_for_room_total{{waiting=\"{waiting}\"}}")
    };
    assert_eq!(metric(proxy.admin_addr, &series("next_request")).await, 1.0);
    assert_eq!(
        metric(proxy.admin_addr, &series("first_request")).await,
        0.0
    );
    // The silent one is still open: a request on it is answered.
    silent.write_all(&raw_post(CHAT, "{}")).await.unwrap();
    let n = tokio::time::timeout(WAIT, silent.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_with_a_request_in_flight_is_never_closed_for_room() {
    // The upstream never answers: the request stays in flight.
    let up = FakeUpstream::start(Script::no_response()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.max_connections = 1;
    cfg.server.limits.min_connection_age = Duration::ZERO;
    let proxy = start_proxy_with(cfg).await;
    let mut busy = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    busy.write_all(&raw_post(CHAT, "{}")).await.unwrap();
    assert_eq!(up.wait_requests(1, WAIT).await.len(), 1);
    // The newcomer is turned away at once; the busy one keeps its place.
    let (status, _) = raw_status(proxy.proxy_addr, &raw_post(CHAT, "{}")).await;
    assert_eq!(status, 0, "closed unanswered");
    let series = "goodput_limit_rejections_total{limit=\"server.max_connections\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    let closed = "goodput_client_connections_closed_for_room_total{waiting=\"first_request\"}";
    assert_eq!(metric(proxy.admin_addr, closed).await, 0.0);
    assert_eq!(
        metric(proxy.admin_addr, "goodput_client_connections").await,
        1.0
    );
    drop(busy);
    proxy.shutdown().await;
}

/// A request that keeps its connection open.
fn keep_alive_post() -> Vec<u8> {
    format!("POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-length: 2\r\n\r\n{{}}").into_bytes()
}
