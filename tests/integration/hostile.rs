//! Hostile clients and exhausted resources, over real loopback sockets: every bound the
//! proxy enforces (client connections, HTTP/2 streams, upstream connections and the wait
//! for one, request head size, request body deadline, the open-files limit) holds and
//! answers as documented, and what the client caused is recorded as `client_error`, not
//! blamed on the upstream. Each fault test checks what the client received, what the
//! record says, and that they agree.
//!
//! Nothing here waits on luck: readiness is signalled (requests seen upstream, gauges on
//! `/metrics`), timers that must fire are short and nothing races them, and every wait
//! is bounded.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers: a failed set-up or exchange must stop the test"
)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use crate::common::{fake::*, harness::*};
use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinSet,
};

const CHAT: &str = "/v1/chat/completions";
const WAIT: Duration = Duration::from_secs(10);

fn ok_json() -> Script {
    Script::response(200, &[("content-type", "application/json")], b"{}")
}

/// The JSON error code of a proxy-made response body.
fn error_code(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// The only record, once it is there.
async fn one_record(admin: SocketAddr) -> Value {
    let records = wait_records(admin, 1, WAIT).await;
    assert_eq!(records.len(), 1, "{records:?}");
    records[0].clone()
}

/// The value of `name{labels}` on `/metrics` (0 when absent).
async fn metric(admin: SocketAddr, series: &str) -> f64 {
    metric_value(&metrics(admin).await, series).unwrap_or(0.0)
}

/// Waits (bounded) until `series` reaches `at_least`, and returns its last value.
async fn wait_metric(admin: SocketAddr, series: &str, at_least: f64) -> f64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = metric(admin, series).await;
        if v >= at_least || tokio::time::Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A raw HTTP/1.1 exchange: status code and body of the response (0 and empty if none).
async fn raw_status(addr: SocketAddr, request: &[u8]) -> (u16, Vec<u8>) {
    let (raw, _) = raw_exchange(addr, request, WAIT).await;
    if raw.is_empty() {
        return (0, Vec::new());
    }
    let (head, body) = split_head(&raw);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_vec())
}

/// Checks that the client saw a proxy-made `status` with `code` and that the record
/// says the same, with `outcome`.
async fn assert_answered(
    admin: SocketAddr,
    (status, body): (u16, Vec<u8>),
    want: (u16, &str, &str),
) {
    let (want_status, want_code, want_outcome) = want;
    assert_eq!(status, want_status, "{}", String::from_utf8_lossy(&body));
    assert_eq!(error_code(&body), want_code);
    let r = one_record(admin).await;
    assert_eq!(r["outcome"], want_outcome, "{r}");
    assert_eq!(r["status"], u64::from(want_status), "{r}");
}

/// An HTTP/2 (prior knowledge) connection to the proxy.
async fn h2_connect(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

fn h2_post(addr: SocketAddr, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{CHAT}"))
        .version(Version::HTTP_2)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// Upstream connections: `upstream.max_connections`, `upstream.pool_wait_timeout`.

#[tokio::test(flavor = "multi_thread")]
async fn five_thousand_http2_streams_share_a_bounded_number_of_upstream_connections() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.max_connections = 8;
    cfg.upstream.pool_wait_timeout = Duration::from_secs(60);
    let proxy = start_proxy_with(cfg).await;
    let send = h2_connect(proxy.proxy_addr).await;
    let streams = 5_000;
    let mut set = JoinSet::new();
    for _ in 0..streams {
        let mut send = send.clone();
        let req = h2_post(proxy.proxy_addr, "{}");
        set.spawn(async move {
            let resp = send.send_request(req).await.unwrap();
            let status = resp.status().as_u16();
            // Read to the end: a response dropped half-read cancels (and closes) its
            // upstream connection.
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        });
    }
    while let Some(answer) = set.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!((status, &body[..]), (200, &b"{}"[..]));
    }
    assert!(
        up.connections() <= 8,
        "{} upstream connections for one client connection",
        up.connections()
    );
    let ok = "goodput_requests_total{model=\"unknown\",api=\"chat_completions\",\
              outcome=\"ok\",class=\"default\",slo=\"met\",status_class=\"2xx\"}";
    let recorded = wait_metric(proxy.admin_addr, ok, streams as f64).await;
    assert_eq!(
        recorded,
        streams as f64,
        "{}",
        metrics(proxy.admin_addr).await
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_finds_no_free_upstream_connection_gets_503_after_the_wait() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.max_connections = 1;
    cfg.upstream.pool_wait_timeout = Duration::from_millis(200);
    let proxy = start_proxy_with(cfg).await;
    // The first request holds the only connection (the upstream never answers it).
    let mut holder = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    holder.write_all(&raw_post(CHAT, "{}")).await.unwrap();
    assert_eq!(up.wait_requests(1, WAIT).await.len(), 1);
    let answer = raw_status(proxy.proxy_addr, &raw_post(CHAT, "{}")).await;
    assert_answered(proxy.admin_addr, answer, (503, "upstream_busy", "rejected")).await;
    assert_eq!(up.connections(), 1);
    let series = "goodput_limit_rejections_total{limit=\"upstream.max_connections\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    drop(holder);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_upstream_is_bounded_by_requests_in_flight() {
    // hyper's pooled client (h2c): the budget counts requests, each held until its
    // response body ends. The first token is far off next to the pool wait, so whichever
    // request comes third finds both slots taken.
    let (_sim, url) = start_sim(fast_sim(1_000.0, 1.0)).await;
    let mut cfg = test_config(&url);
    cfg.upstream.http2 = true;
    cfg.upstream.max_connections = 2;
    cfg.upstream.pool_wait_timeout = Duration::from_millis(100);
    let proxy = start_proxy_with(cfg).await;
    let target = format!("http://{}{CHAT}", proxy.proxy_addr);
    let mut set = JoinSet::new();
    for _ in 0..3 {
        let target = target.clone();
        set.spawn(async move { post_collect(&client(), &target, chat_body(true, 3, false)).await });
    }
    let mut answers = Vec::new();
    while let Some(answer) = set.join_next().await {
        answers.push(answer.unwrap());
    }
    answers.sort_by_key(|(status, _)| *status);
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 503]);
    assert_eq!(error_code(&answers[2].1), "upstream_busy");
    // Both slots came back with their response bodies' ends.
    let (status, _) = post_collect(&client(), &target, chat_body(true, 3, false)).await;
    assert_eq!(status, 200);
    let records = wait_records(proxy.admin_addr, 4, WAIT).await;
    let mut outcomes: Vec<&str> = records
        .iter()
        .filter_map(|r| r["outcome"].as_str())
        .collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["ok", "ok", "ok", "rejected"]);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// HTTP/2 settings: `server.http2_max_concurrent_streams`, `server.max_request_header_bytes`.

/// The server's first SETTINGS frame, as (identifier, value) pairs.
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // An empty SETTINGS frame of our own.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut head = [0u8; 9];
    tokio::time::timeout(WAIT, s.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head[3], 4, "the server opens with SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    payload
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_clients_are_told_the_stream_and_header_limits() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let settings = server_settings(proxy.proxy_addr).await;
    const MAX_CONCURRENT_STREAMS: u16 = 3;
    const MAX_HEADER_LIST_SIZE: u16 = 6;
    assert!(
        settings.contains(&(MAX_CONCURRENT_STREAMS, 128)),
        "{settings:?}"
    );
    assert!(
        settings.contains(&(MAX_HEADER_LIST_SIZE, 65536)),
        "{settings:?}"
    );
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Client connections: `server.max_connections`, the open-files limit.

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
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(proxy.admin_addr, gauge).await > 3.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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

// ---------------------------------------------------------------------------------------
// Request heads: `Host`, `server.max_request_header_bytes`.

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_or_doubled_host_is_a_400_before_anything_is_forwarded() {
    let up = FakeUpstream::start(ok_json()).await;
    let heads: [&[u8]; 2] = [
        b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\nhost: b\r\ncontent-length: 2\r\n\
          connection: close\r\n\r\n{}",
    ];
    for head in heads {
        let proxy = start_proxy(&up.url()).await;
        let answer = raw_status(proxy.proxy_addr, head).await;
        assert_answered(proxy.admin_addr, answer, (400, "bad_host", "client_error")).await;
        proxy.shutdown().await;
    }
    assert_eq!(up.connections(), 0, "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_request_head_is_a_431() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let big = "x".repeat(100 << 10);
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\nx-big: {big}\r\ncontent-length: 2\r\n\
         connection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_eq!(status, 431);
    let series = "goodput_limit_rejections_total{limit=\"server.max_request_header_bytes\"}";
    assert_eq!(wait_metric(proxy.admin_addr, series, 1.0).await, 1.0);
    assert_eq!(up.connections(), 0);
    // Just under the limit still goes through.
    let fits = "x".repeat(60 << 10);
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\nx-big: {fits}\r\ncontent-length: 2\r\n\
         connection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_eq!(status, 200);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_http2_header_list_is_a_431() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut send = h2_connect(proxy.proxy_addr).await;
    let mut req = h2_post(proxy.proxy_addr, "{}");
    let big = http::HeaderValue::from_str(&"x".repeat(100 << 10)).unwrap();
    req.headers_mut().insert("x-big", big);
    let answer = send.send_request(req).await;
    let status = answer.as_ref().map(|r| r.status().as_u16());
    assert!(matches!(status, Ok(431)), "{answer:?}");
    assert_eq!(up.connections(), 0);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Request bodies: the client's failures are `client_error`; `server.request_body_timeout`.

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_chunked_body_is_a_400_client_error() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\
         connection: close\r\n\r\n2\r\n{{}}\r\nzz\r\nnot a chunk\r\n\r\n"
    );
    let answer = raw_status(proxy.proxy_addr, request.as_bytes()).await;
    assert_answered(
        proxy.admin_addr,
        answer,
        (400, "bad_request_body", "client_error"),
    )
    .await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_gone_mid_upload_is_a_client_error_not_an_upstream_one() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    s.write_all(
        format!("POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n{{\"model\"")
            .as_bytes(),
    )
    .await
    .unwrap();
    // The proxy has the head once the measurement counts the request in flight.
    assert_eq!(
        wait_metric(proxy.admin_addr, "goodput_in_flight_requests", 1.0).await,
        1.0
    );
    drop(s);
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_error", "{r}");
    assert!(
        up.requests().await.is_empty(),
        "no complete request went upstream"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_body_shorter_than_its_content_length_is_a_client_error() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let mut send = h2_connect(proxy.proxy_addr).await;
    let mut req = h2_post(proxy.proxy_addr, "{}");
    req.headers_mut()
        .insert("content-length", http::HeaderValue::from_static("100"));
    // h2 finds the mismatch itself and resets the stream; whether the proxy's 400 gets
    // out first depends on who looks first. Either way it is the client's doing.
    let answered = match send.send_request(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            Some((status, body.unwrap_or_default()))
        }
        Err(_) => None,
    };
    let r = one_record(proxy.admin_addr).await;
    match &answered {
        Some((status, body)) => {
            assert_eq!(*status, 400);
            assert_eq!(error_code(body), "bad_request_body");
            assert_eq!(r["outcome"], "client_error", "{r}");
        }
        // A reset stream before any answer: still the client's broken body.
        None => assert_eq!(r["outcome"], "client_error", "{r}"),
    }
    assert!(
        up.requests().await.is_empty(),
        "no complete request went upstream"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_body_gets_408_at_the_deadline_and_frees_the_upstream() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.request_body_timeout = Duration::from_millis(300);
    let proxy = start_proxy_with(cfg).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    s.write_all(
        format!("POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n{{\"model\"")
            .as_bytes(),
    )
    .await
    .unwrap();
    // ... and nothing more, ever.
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut raw)).await;
    let (head, body) = split_head(&raw);
    let status = head.split(' ').nth(1).unwrap_or_default().to_owned();
    assert_answered(
        proxy.admin_addr,
        (status.parse().unwrap_or(0), body.to_vec()),
        (408, "request_body_timeout", "client_error"),
    )
    .await;
    let series = "goodput_limit_rejections_total{limit=\"server.request_body_timeout\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    assert!(up.requests().await.is_empty());
    // Excluded from SLO attainment, like a client abort.
    let text = metrics(proxy.admin_addr).await;
    assert!(
        text.lines().any(|l| l.starts_with("goodput_requests_total")
            && l.contains("outcome=\"client_error\"")
            && l.contains("slo=\"excluded\"")),
        "{text}"
    );
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// HTTP/2 control frame floods: `server.http2_max_control_frames_per_second`.

const FLOOD_LIMIT: &str =
    "goodput_limit_rejections_total{limit=\"server.http2_max_control_frames_per_second\"}";

/// Opens a raw HTTP/2 connection, sends the preface, an empty SETTINGS and `pings` PING
/// frames in one write, then reads frames until the server closes (bounded). Returns the
/// (type, flags) of every frame read, and whether the connection ended (closed or reset).
async fn ping_burst(addr: SocketAddr, pings: usize) -> (Vec<(u8, u8)>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    for i in 0..pings {
        out.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&(i as u64).to_be_bytes());
    }
    s.write_all(&out).await.unwrap();
    let mut frames = Vec::new();
    let read = async {
        let mut head = [0u8; 9];
        loop {
            if s.read_exact(&mut head).await.is_err() {
                return true;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if s.read_exact(&mut payload).await.is_err() {
                return true;
            }
            frames.push((head[3], head[4]));
            // Every PING answered: the connection was left open.
            if frames.iter().filter(|f| **f == (6, 1)).count() == pings {
                return false;
            }
        }
    };
    let ended = tokio::time::timeout(WAIT, read).await.unwrap_or(false);
    (frames, ended)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_ping_flood_closes_the_connection_and_counts() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.http2_max_control_frames_per_second = 20;
    let proxy = start_proxy_with(cfg).await;
    assert_eq!(metric(proxy.admin_addr, FLOOD_LIMIT).await, 0.0);

    // Within the limit (one SETTINGS and 19 PINGs at once): every PING answered.
    let (frames, ended) = ping_burst(proxy.proxy_addr, 19).await;
    assert!(!ended);
    assert_eq!(frames.iter().filter(|f| **f == (6, 1)).count(), 19);
    assert_eq!(metric(proxy.admin_addr, FLOOD_LIMIT).await, 0.0);

    // 500 at once: closed before the flood is answered, counted once.
    let (frames, ended) = ping_burst(proxy.proxy_addr, 500).await;
    assert!(ended, "the connection was closed");
    // 19 at once, and a few more if the bucket refilled (20 a second) while the flood
    // was being read on a slow machine: never the flood.
    let answered = frames.iter().filter(|f| **f == (6, 1)).count();
    assert!(answered < 100, "{answered} PINGs answered");
    assert_eq!(wait_metric(proxy.admin_addr, FLOOD_LIMIT, 1.0).await, 1.0);

    // Other clients are served as before.
    let mut send = h2_connect(proxy.proxy_addr).await;
    let resp = send
        .send_request(h2_post(proxy.proxy_addr, "{}"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Half-closing HTTP/1 clients: `server.http1_half_close`.

/// Sends `request`, waits until the upstream has it, half-closes (`shutdown(SHUT_WR)`), and
/// reads until the proxy closes.
async fn half_closed_exchange(addr: SocketAddr, up: &FakeUpstream, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    assert_eq!(up.wait_requests(1, WAIT).await.len(), 1);
    s.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await;
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_half_closing_client_is_answered_when_configured() {
    let up = FakeUpstream::start(ok_json().delayed(Duration::from_millis(200))).await;
    let mut cfg = test_config(&up.url());
    cfg.server.http1_half_close = true;
    let proxy = start_proxy_with(cfg).await;
    let raw = half_closed_exchange(proxy.proxy_addr, &up, &raw_post(CHAT, "{}")).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(text.ends_with("\r\n\r\n{}"), "{text}");
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["bytes_out"], 2, "{r}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_half_closing_client_is_taken_to_have_left() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let proxy = start_proxy(&up.url()).await;
    let raw = half_closed_exchange(proxy.proxy_addr, &up, &raw_post(CHAT, "{}")).await;
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));
    // The upstream request is cancelled...
    assert!(up.wait_client_close(WAIT).await.is_some());
    // ...and recorded as the client's leaving.
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    proxy.shutdown().await;
}
