//! Raw HTTP/1 bytes through the real server and upstream client, for the `http_exchange`
//! (hyper's HTTP/1 server) and `h1_server` (goodput's own, `server.http1_own`) targets:
//! the input is what a client sends and what the upstream answers (split at
//! [`crate::http1::SEPARATOR`]). One proxy and one fake upstream run per process and
//! server on 127.0.0.1:0, in a current-thread
//! runtime that only turns while an input is being run; each input opens one client
//! connection, and the upstream answers every connection it gets with the input's bytes,
//! then closes.
//!
//! Invariants (a panic is a finding):
//! - nothing panics, and every measurement ends within `SETTLE` of the client leaving
//!   (the in-flight gauge is back to zero, never below);
//! - every request the upstream saw has its record (by `x-request-id`, counted as a
//!   multiset across inputs, since a pipelined request may reach the upstream late) and no
//!   record was dropped;
//! - the proxy's responses are well-framed as far as they go;
//! - when the upstream's bytes are a well-formed HTTP/1.1 response, the body the client
//!   got for its first request is a prefix of the upstream's body.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use crate::http1::{self, Received, Sent};
use arc_swap::ArcSwap;
use goodput::{
    config::{self, Overrides},
    measure::{MeasureLayer, Pending, Recorder, Settings},
    proxy::{self, FileBudget, Forward, LimitMetrics, Proxy},
};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    runtime::Runtime,
    signal::unix::{Signal, SignalKind, signal},
    sync::mpsc,
    time::{Instant, sleep, timeout},
};

/// The proxy's own timeouts (header read, upstream connect, response head, body idle):
/// short, so a stalled exchange ends quickly, yet far above what a local exchange takes.
const PROXY_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the client reads at most, and how long it waits for a further byte.
const CLIENT_DEADLINE: Duration = Duration::from_millis(300);
const CLIENT_IDLE: Duration = Duration::from_millis(50);
/// How long the upstream waits for a request head, and for the proxy to close after its
/// answer.
const UPSTREAM_DEADLINE: Duration = Duration::from_millis(300);
/// How long every measurement may take to end once the client has gone: well past every
/// proxy timeout, so only a measurement that never ends trips it.
const SETTLE: Duration = Duration::from_secs(5);
/// A record that no upstream request matched is forgotten after this many inputs.
const KEEP_UNMATCHED: u64 = 64;

/// What the fake upstream answers with and what it saw, shared with the running input.
#[derive(Default)]
struct Upstream {
    response: Vec<u8>,
    /// `x-request-id` of each request head it read (the first on each connection).
    seen: Vec<String>,
}

struct World {
    rt: Runtime,
    proxy: SocketAddr,
    upstream: Arc<Mutex<Upstream>>,
    state: Mutex<State>,
    /// Every open measurement (tunnels and passthrough included, unlike the in-flight gauge).
    recorder: Recorder,
    dropped: Counter,
    _sigpipe: Signal,
    /// `HTTP_EXCHANGE_TRACE=1`: print what each input did (when replaying one).
    trace: bool,
}

struct State {
    records: mpsc::Receiver<Pending>,
    /// Records minus upstream requests per id, with the input that last changed it.
    balance: HashMap<String, (i64, u64)>,
    inputs: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which HTTP/1 server the proxy serves plaintext clients with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Hyper,
    /// goodput's own (`server.http1_own`).
    Own,
}

fn world(server: Server) -> &'static World {
    static HYPER: OnceLock<World> = OnceLock::new();
    static OWN: OnceLock<World> = OnceLock::new();
    match server {
        Server::Hyper => HYPER.get_or_init(|| start(server)),
        Server::Own => OWN.get_or_init(|| start(server)),
    }
}

#[expect(
    clippy::expect_used,
    reason = "set-up: without it there is nothing to fuzz"
)]
fn start(server: Server) -> World {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let upstream = Arc::new(Mutex::new(Upstream::default()));
    let in_flight = Gauge::default();
    let dropped = Counter::default();
    let (proxy, records, sigpipe, recorder) = rt.block_on(async {
        // libFuzzer's `main` is not Rust's, which would have ignored SIGPIPE: a write to a
        // connection the peer reset would kill the process. A handler of tokio's replaces
        // the default action.
        let sigpipe = signal(SignalKind::pipe()).expect("SIGPIPE handler");
        let up = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let up_addr = up.local_addr().expect("upstream address");
        tokio::spawn(serve_upstream(up, upstream.clone()));
        let overrides = Overrides {
            listen: Some("127.0.0.1:0".into()),
            upstream: Some(format!("http://{up_addr}")),
            admin: Some("127.0.0.1:0".into()),
        };
        let mut cfg = config::load(None, &overrides).expect("config");
        cfg.server.header_read_timeout = PROXY_TIMEOUT;
        cfg.server.http1_own = server == Server::Own;
        cfg.upstream.connect_timeout = PROXY_TIMEOUT;
        cfg.upstream.response_header_timeout = PROXY_TIMEOUT;
        cfg.upstream.idle_timeout = PROXY_TIMEOUT;
        cfg.server.limits.request_body_timeout = PROXY_TIMEOUT;
        let (recorder, records) = Recorder::new(1 << 16, dropped.clone(), in_flight.clone());
        let settings = Arc::new(ArcSwap::from_pointee(Settings::from_config(&cfg)));
        let layer = MeasureLayer::new(recorder.clone(), settings);
        let limits = LimitMetrics::default();
        // No open-files limit to divide: the configured bounds stand.
        let files = FileBudget::unlimited();
        let division = files.divide(
            cfg.server.limits.max_connections,
            cfg.upstream.max_connections,
        );
        let forward = Forward::new(
            &cfg.upstream,
            cfg.server.limits.request_body_timeout,
            limits.clone(),
            files,
            division,
        );
        let proxy = Proxy::new(
            &cfg.server,
            forward,
            layer,
            recorder.clone(),
            limits,
            division.clients,
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        tokio::spawn(proxy::serve(listener, proxy, std::future::pending()));
        (addr, records, sigpipe, recorder)
    });
    World {
        rt,
        proxy,
        upstream,
        state: Mutex::new(State {
            records,
            balance: HashMap::new(),
            inputs: 0,
        }),
        recorder,
        dropped,
        _sigpipe: sigpipe,
        trace: std::env::var_os("HTTP_EXCHANGE_TRACE").is_some(),
    }
}

async fn serve_upstream(listener: TcpListener, shared: Arc<Mutex<Upstream>>) {
    loop {
        if let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(answer(conn, shared.clone()));
        }
    }
}

/// Reads one request head, answers with the input's bytes, closes its sending side and
/// waits (briefly) for the proxy to close, so the answer is not cut by a reset.
async fn answer(mut conn: TcpStream, shared: Arc<Mutex<Upstream>>) {
    let mut buf = Vec::new();
    let head = timeout(UPSTREAM_DEADLINE, async {
        let mut chunk = [0u8; 4096];
        loop {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                return true;
            }
        }
    })
    .await;
    if head != Ok(true) {
        return;
    }
    let response = {
        let mut up = lock(&shared);
        up.seen.extend(request_id(&buf));
        up.response.clone()
    };
    let _ = conn.write_all(&response).await;
    let _ = conn.shutdown().await;
    let _ = timeout(UPSTREAM_DEADLINE, async {
        let mut chunk = [0u8; 4096];
        while matches!(conn.read(&mut chunk).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// The first `x-request-id` of a request head as the proxy forwarded it. The proxy always
/// sets one (a `Connection` header naming it does not remove it), so a head without one is
/// a finding.
fn request_id(head: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    assert!(
        matches!(req.parse(head), Ok(httparse::Status::Complete(_))),
        "the proxy forwarded a request head that does not parse: {:?}",
        String::from_utf8_lossy(head)
    );
    let id = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("x-request-id"))
        .map(|h| String::from_utf8_lossy(h.value).into_owned());
    assert!(
        id.is_some(),
        "the proxy forwarded a request without x-request-id: {:?}",
        String::from_utf8_lossy(head)
    );
    id
}

/// Sends the client's bytes and reads until the proxy closes, every expected response is
/// complete, nothing more comes for `CLIENT_IDLE`, or `CLIENT_DEADLINE` passes. Returns
/// what was read and whether the proxy closed.
async fn client(addr: SocketAddr, request: &[u8], sent: &Sent) -> (Vec<u8>, bool) {
    let Ok(mut conn) = TcpStream::connect(addr).await else {
        return (Vec::new(), false);
    };
    let (mut rd, mut wr) = conn.split();
    let write = async {
        let _ = wr.write_all(request).await;
        std::future::pending::<()>().await;
    };
    let mut out = Vec::new();
    let read = async {
        if sent.requests.is_empty() && sent.cut_in_head {
            // A head still to come: the server only waits (for its header-read timeout).
            return false;
        }
        let deadline = Instant::now() + CLIENT_DEADLINE;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let wait = CLIENT_IDLE.min(deadline.saturating_duration_since(Instant::now()));
            match timeout(wait, rd.read(&mut chunk)).await {
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
                Err(_) => return false,
            }
            let done = http1::received_responses(&out, &sent.requests, false);
            if !sent.requests.is_empty()
                && done.len() == sent.requests.len()
                && done.iter().all(|r| r.complete)
            {
                return false;
            }
        }
    };
    let closed = tokio::select! {
        () = write => false,
        closed = read => closed,
    };
    (out, closed)
}

/// Runs one input against the proxy on `server`; panics on a broken invariant.
pub fn run(data: &[u8], server: Server) {
    let w = world(server);
    let (request, response) = http1::split(data);
    let sent = http1::sent_requests(request);
    lock(&w.upstream).response = response.to_vec();

    let (received, closed) = w.rt.block_on(async {
        let got = client(w.proxy, request, &sent).await;
        // The client has gone: every measurement must end (the proxy's timeouts bound it).
        let deadline = Instant::now() + SETTLE;
        while w.recorder.open() > 0 {
            assert!(
                Instant::now() < deadline,
                "{} measurement(s) still open {SETTLE:?} after the client left",
                w.recorder.open()
            );
            sleep(Duration::from_millis(1)).await;
        }
        got
    });
    // Nothing runs between here and the next `block_on`: the counts are a snapshot.
    assert_eq!(w.recorder.open(), 0, "more measurements ended than started");
    assert_eq!(w.dropped.get(), 0, "records were dropped");
    let (records, seen) = check_records(w);

    let responses = http1::received_responses(&received, &sent.requests, closed);
    if w.trace {
        eprintln!(
            "requests {}, records {records}, upstream saw {seen}, responses {:?}, closed \
             {closed}, client got:\n{}",
            sent.requests.len(),
            responses
                .iter()
                .map(|r| (r.status, r.body.len(), r.complete))
                .collect::<Vec<_>>(),
            String::from_utf8_lossy(&received)
        );
    }
    if let (Some(upstream), Some(first)) = (http1::upstream_response(response), responses.first())
        && sent.requests.first().is_some_and(|r| !r.head && !r.tunnel)
        && from_upstream(first, upstream.status)
    {
        assert!(
            upstream.body.starts_with(&first.body),
            "the client got a body that is not a prefix of the upstream's:\n\
             client:   {:?}\nupstream: {:?}",
            String::from_utf8_lossy(&first.body),
            String::from_utf8_lossy(&upstream.body)
        );
    }
}

/// A response that passed the upstream's on, rather than one the proxy or hyper made.
fn from_upstream(r: &Received, upstream_status: u16) -> bool {
    r.status == upstream_status && !r.body.windows(19).any(|w| w == b"goodput_proxy_error")
}

/// Every request the upstream saw has a record: records minus requests, per id, never
/// below zero once no measurement is open. Returns how many records and upstream requests
/// this input added.
fn check_records(w: &World) -> (usize, usize) {
    let mut state = lock(&w.state);
    let state = &mut *state;
    state.inputs += 1;
    let now = state.inputs;
    let (mut records, mut seen) = (0, 0);
    while let Ok(p) = state.records.try_recv() {
        records += 1;
        let e = state.balance.entry(p.id).or_insert((0, now));
        *e = (e.0 + 1, now);
    }
    for id in std::mem::take(&mut lock(&w.upstream).seen) {
        seen += 1;
        let e = state.balance.entry(id).or_insert((0, now));
        *e = (e.0 - 1, now);
    }
    if let Some((id, _)) = state.balance.iter().find(|(_, (n, _))| *n < 0) {
        panic!("the upstream saw request {id:?} but no record of it was made");
    }
    state
        .balance
        .retain(|_, (n, at)| *n > 0 && now - *at < KEEP_UNMATCHED);
    (records, seen)
}
