//! Protocols end to end, over real loopback sockets: HTTP/2 clients (h2c prior knowledge and
//! h2 over TLS via ALPN), TLS termination and `https://` upstreams with certificates made
//! here by rcgen, HTTP/2 towards the upstream (ALPN and h2c), HTTP Upgrade tunnels, 500
//! concurrent streams, timing accuracy against the simulator's ground truth, and secrecy of
//! credentials and prompts in logs, `/metrics` and the API (the real binary included).
//!
//! Every test runs on its own multi-thread runtime behind [`GATE`]: the heavy tests (500
//! streams, accuracy) take it exclusively so none disturbs another's timing or a light
//! test's timeouts; the light ones share it and run in parallel.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant},
};

use crate::common::{
    fake::{FakeUpstream, SSE_COMMENT, Script, WritePlan, openai_chat_events},
    harness::{self, chat_body, fast_sim, metric_value, start_proxy, start_proxy_with, start_sim},
    temp::TempDir,
};
use anyhow::{Context as _, anyhow, bail, ensure};
use bytes::Bytes;
use goodput::config::{self, Config, Overrides};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::Connect},
    rt::{TokioExecutor, TokioIo},
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_json::Value;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::{JoinHandle, JoinSet},
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Every secret the secrecy tests send; none may show up anywhere goodput writes.
const SECRETS: [&str; 5] = [
    "SECRET-API-KEY",
    "SECRET-X-API-KEY",
    "SECRET-API-KEY-2",
    "SECRET-COOKIE",
    "SECRET-PROMPT-TEXT",
];

const CHAT: &str = "/v1/chat/completions";

// ---------------------------------------------------------------------------------------
// Running tests: one runtime per test, light tests in parallel, heavy ones alone.

static GATE: RwLock<()> = RwLock::new(());

#[expect(
    clippy::expect_used,
    reason = "test support: without a runtime the test cannot run at all"
)]
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs a test that may share the machine with other light tests.
fn light<F: Future>(test: F) -> F::Output {
    let _shared = GATE.read().unwrap_or_else(PoisonError::into_inner);
    runtime().block_on(test)
}

/// Runs a test alone: its timing must not be disturbed, and its load must not disturb.
fn exclusive<F: Future>(test: F) -> F::Output {
    let _alone = GATE.write().unwrap_or_else(PoisonError::into_inner);
    runtime().block_on(test)
}

// ---------------------------------------------------------------------------------------
// Certificates and files.

/// A throwaway certificate authority and the leaf certificates it signs.
struct Pki {
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

/// A leaf certificate with its key, as PEM (for goodput's files) and DER (for rustls).
struct Leaf {
    cert_pem: String,
    key_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Pki {
    fn new() -> anyhow::Result<Pki> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "goodput test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca = params.self_signed(&ca_key)?;
        Ok(Pki { ca, ca_key })
    }

    fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by this CA.
    fn leaf(&self, names: &[&str]) -> anyhow::Result<Leaf> {
        let sans: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        })
    }

    /// A client configuration trusting only this CA, offering `alpn`.
    fn client_config(&self, alpn: &[&[u8]]) -> anyhow::Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone())?;
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(cfg)
    }
}

impl Leaf {
    /// A TLS acceptor serving this certificate, offering h2 and http/1.1 by ALPN.
    fn acceptor(&self) -> anyhow::Result<TlsAcceptor> {
        let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert_der.clone()], key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(cfg)))
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Writes `toml` as the config file and loads it the way `goodput serve --config` does.
fn load_toml(dir: &TempDir, toml: &str) -> anyhow::Result<Config> {
    let path = dir.write("goodput.toml", toml)?;
    Ok(config::load(Some(&path), &Overrides::default())?)
}

/// `path` as a TOML literal string (no escapes inside `'...'`).
fn toml_path(path: &Path) -> anyhow::Result<String> {
    let s = path.to_str().context("temp path is not UTF-8")?;
    ensure!(!s.contains('\''), "temp path contains a quote: {s}");
    Ok(format!("'{s}'"))
}

// ---------------------------------------------------------------------------------------
// Clients and responses.

/// A response read to its end.
#[derive(Debug)]
struct Collected {
    status: StatusCode,
    version: Version,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Collected {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn collect(resp: Response<Incoming>) -> anyhow::Result<Collected> {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Collected {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body,
    })
}

/// A streamed chat request carrying every kind of credential a client might send.
fn chat_request(uri: &str, id: &str, body: String) -> anyhow::Result<Request<Full<Bytes>>> {
    Ok(Request::post(uri)
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .header("authorization", "Bearer SECRET-API-KEY")
        .header("x-api-key", "SECRET-X-API-KEY")
        .header("api-key", "SECRET-API-KEY-2")
        .header("cookie", "session=SECRET-COOKIE")
        .body(Full::new(Bytes::from(body)))?)
}

async fn send<C>(
    client: &Client<C, Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> anyhow::Result<Collected>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    collect(client.request(req).await?).await
}

/// A plain GET that reports failures instead of panicking (the process may not be up yet).
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(StatusCode, String)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let resp = collect(client.get(format!("http://{addr}{path}").parse()?).await?).await?;
    Ok((resp.status, resp.text()))
}

async fn records(admin: SocketAddr) -> anyhow::Result<Vec<Value>> {
    let (_, body) = http_get(admin, "/api/v1/requests?limit=100000").await?;
    let v: Value = serde_json::from_str(&body)?;
    v["requests"]
        .as_array()
        .cloned()
        .context("no `requests` array")
}

/// Waits until the records with all of `ids` are there (records are finished off the data
/// path, shortly after a response ends); returns them by id.
async fn records_by_id(
    admin: SocketAddr,
    ids: &[String],
    timeout: Duration,
) -> anyhow::Result<BTreeMap<String, Value>> {
    let deadline = Instant::now() + timeout;
    loop {
        let by_id: BTreeMap<String, Value> = records(admin)
            .await?
            .into_iter()
            .filter_map(|r| Some((r["id"].as_str()?.to_owned(), r)))
            .collect();
        let missing = ids.iter().filter(|id| !by_id.contains_key(*id)).count();
        if missing == 0 {
            return Ok(by_id);
        }
        if Instant::now() >= deadline {
            bail!(
                "{missing} of {} records missing after {timeout:?}",
                ids.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What an OpenAI chat stream contained.
#[derive(Debug, Default)]
struct ChatStream {
    content_events: usize,
    usage_completion_tokens: Option<u64>,
    ids: BTreeSet<String>,
}

/// Parses a complete OpenAI chat SSE body, insisting on its framing and its `[DONE]` end.
fn parse_chat_stream(body: &[u8]) -> anyhow::Result<ChatStream> {
    let text = std::str::from_utf8(body)?;
    ensure!(
        text.ends_with("data: [DONE]\n\n"),
        "stream does not end with [DONE]: {text:?}"
    );
    let mut out = ChatStream::default();
    let blocks: Vec<&str> = text.split("\n\n").filter(|b| !b.is_empty()).collect();
    for (i, block) in blocks.iter().enumerate() {
        let data = block
            .strip_prefix("data: ")
            .with_context(|| format!("not an event: {block:?}"))?;
        if data == "[DONE]" {
            ensure!(i + 1 == blocks.len(), "[DONE] before the end");
            continue;
        }
        let v: Value = serde_json::from_str(data).with_context(|| format!("event {data:?}"))?;
        out.ids
            .insert(v["id"].as_str().context("event without id")?.to_owned());
        if let Some(n) = v.get("usage").and_then(|u| u["completion_tokens"].as_u64()) {
            out.usage_completion_tokens = Some(n);
        }
        if v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
        {
            out.content_events += 1;
        }
    }
    Ok(out)
}

/// The body with every `"created":<unix seconds>` zeroed: two runs of the deterministic
/// simulator differ only there when they straddle a second.
fn mask_created(body: &[u8]) -> String {
    const KEY: &str = "\"created\":";
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len());
    let mut rest = &*text;
    while let Some(at) = rest.find(KEY) {
        let (head, tail) = rest.split_at(at + KEY.len());
        out.push_str(head);
        out.push('0');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

fn sim_addr(url: &str) -> anyhow::Result<SocketAddr> {
    Ok(url.trim_start_matches("http://").parse()?)
}

/// Nearest-rank percentile of `values` (sorted here).
fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len().max(1));
    values.get(rank - 1).copied().unwrap_or(f64::NAN)
}

/// Sums every sample of a counter family in the metrics text.
fn sum_series(metrics: &str, family: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------
// 1. HTTP/2 client (h2c prior knowledge).

#[test]
fn h2c_client_gets_the_stream_byte_identical_to_a_direct_request() {
    light(async {
        // Two simulators with the same seed: the n-th request to each is the same run.
        let sim_cfg = fast_sim(20.0, 2.0);
        let (_direct_sim, direct_url) = start_sim(sim_cfg.clone()).await;
        let (_sim, upstream) = start_sim(sim_cfg).await;
        let proxy = start_proxy(&upstream).await;
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<Full<Bytes>>();

        let body = chat_body(true, 12, true);
        let direct_req = chat_request(&format!("{direct_url}{CHAT}"), "h2c-direct", body.clone());
        let direct = send(&h2c, direct_req.unwrap()).await.unwrap();
        let proxied_req = chat_request(
            &format!("http://{}{CHAT}", proxy.proxy_addr),
            "h2c-proxied",
            body,
        );
        let proxied = send(&h2c, proxied_req.unwrap()).await.unwrap();

        assert_eq!(
            (direct.status, direct.version),
            (StatusCode::OK, Version::HTTP_2)
        );
        assert_eq!(
            (proxied.status, proxied.version),
            (StatusCode::OK, Version::HTTP_2)
        );
        assert_eq!(proxied.headers["content-type"], "text/event-stream");
        assert_eq!(mask_created(&proxied.body), mask_created(&direct.body));
        let stream = parse_chat_stream(&proxied.body).unwrap();
        assert_eq!(
            (stream.content_events, stream.usage_completion_tokens),
            (12, Some(12))
        );

        let ids = ["h2c-proxied".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["h2c-proxied"];
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["status"], 200);
        assert_eq!(r["api"], "chat_completions");
        assert_eq!(r["stream"], true);
        assert_eq!(r["output_tokens"], 12);
        assert_eq!(r["output_tokens_source"], "usage");
        assert_eq!(r["events"], 12);
        assert_eq!(r["bytes_out"], proxied.body.len());
        assert!(r["ttft_ms"].as_f64().unwrap() >= 20.0, "{r}");
        proxy.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------
// 2a. TLS termination: HTTP/1.1 and h2 chosen by ALPN.

/// One request on a fresh TLS connection offering exactly `alpn`; returns what was
/// negotiated and the response. HTTP/2 when `h2` was negotiated, else HTTP/1.1.
async fn tls_exchange(
    pki: &Pki,
    addr: SocketAddr,
    alpn: &[u8],
    id: &str,
    body: String,
) -> anyhow::Result<(Option<Vec<u8>>, Collected)> {
    let connector = TlsConnector::from(Arc::new(pki.client_config(&[alpn])?));
    let tcp = TcpStream::connect(addr).await?;
    let tls = connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(tls);
    let resp = if negotiated.as_deref() == Some(b"h2") {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        let req = chat_request(&format!("https://localhost{CHAT}"), id, body)?;
        sender.send_request(req).await?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        let mut req = chat_request(CHAT, id, body)?;
        req.headers_mut()
            .insert("host", http::HeaderValue::from_static("localhost"));
        sender.send_request(req).await?
    };
    Ok((negotiated, collect(resp).await?))
}

#[test]
fn tls_termination_serves_http1_and_h2_by_alpn_and_says_https_upstream() {
    light(async {
        let pki = Pki::new().unwrap();
        let leaf = pki.leaf(&["localhost", "127.0.0.1"]).unwrap();
        let dir = TempDir::new("tls-server");
        let cert = dir.write("server.pem", &leaf.cert_pem).unwrap();
        let key = dir.write("server.key", &leaf.key_pem).unwrap();
        let events = openai_chat_events(5, true);
        let expected: Vec<u8> = events.concat();
        let upstream = FakeUpstream::start(Script::sse_chunked(
            &events,
            WritePlan::Whole,
            Duration::ZERO,
        ))
        .await;
        let cfg = load_toml(
            &dir,
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n\
                 [server.tls]\ncert = {}\nkey = {}\n\
                 [upstream]\nurl = \"{}\"\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n\
                 [log]\naccess_log = false\n",
                toml_path(&cert).unwrap(),
                toml_path(&key).unwrap(),
                upstream.url()
            ),
        )
        .unwrap();
        assert!(cfg.server.tls.is_some());
        let proxy = start_proxy_with(cfg).await;
        let body = chat_body(true, 5, true);

        let (alpn, h1) = tls_exchange(&pki, proxy.proxy_addr, b"http/1.1", "tls-h1", body.clone())
            .await
            .unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!((h1.status, h1.version), (StatusCode::OK, Version::HTTP_11));
        assert_eq!(h1.body, expected);

        let (alpn, h2) = tls_exchange(&pki, proxy.proxy_addr, b"h2", "tls-h2", body.clone())
            .await
            .unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
        assert_eq!((h2.status, h2.version), (StatusCode::OK, Version::HTTP_2));
        assert_eq!(h2.body, expected);

        // A stock client offering both gets h2, as the server prefers it.
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(pki.client_config(&[]).unwrap())
            .https_only()
            .enable_all_versions()
            .build();
        let stock = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(https);
        let port = proxy.proxy_addr.port();
        let req = chat_request(
            &format!("https://localhost:{port}{CHAT}"),
            "tls-stock",
            body,
        );
        let resp = send(&stock, req.unwrap()).await.unwrap();
        assert_eq!(
            (resp.status, resp.version),
            (StatusCode::OK, Version::HTTP_2)
        );
        assert_eq!(resp.body, expected);

        let seen = upstream.wait_requests(3, Duration::from_secs(5)).await;
        assert_eq!(seen.len(), 3);
        for r in &seen {
            assert_eq!(
                r.header("x-forwarded-proto"),
                Some("https"),
                "{:?}",
                r.headers
            );
            assert_eq!(
                r.header("x-forwarded-for"),
                Some("127.0.0.1"),
                "{:?}",
                r.headers
            );
            assert_eq!(r.version, "HTTP/1.1");
        }
        let ids = ["tls-h1", "tls-h2", "tls-stock"].map(str::to_owned);
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        for id in &ids {
            let r = &recs[id];
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(r["output_tokens"], 5, "{r}");
            assert_eq!(r["bytes_out"], expected.len(), "{r}");
        }
        proxy.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------
// 2b/2c. https:// upstreams and HTTP/2 towards the upstream.

/// What the relay saw on one connection.
#[derive(Clone, Debug)]
enum Seen {
    /// The TLS handshake failed (the peer refused our certificate, for instance).
    HandshakeFailed(String),
    /// A connection was relayed: the ALPN protocol agreed and the first line of the
    /// (decrypted) byte stream: a request line, or `PRI * HTTP/2.0` for HTTP/2.
    Relayed {
        alpn: Option<Vec<u8>>,
        first_line: String,
    },
}

/// A TCP relay in front of the simulator, optionally terminating TLS, that notes the
/// negotiated ALPN and the first line each connection sends. The simulator serves both
/// HTTP/1.1 and h2c, so whatever the relay's peer speaks reaches it unchanged.
struct Relay {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr, tls: Option<TlsAcceptor>) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (tls, log) = (tls.clone(), log.clone());
                conns.spawn(async move {
                    if let Err(e) = relay_conn(tcp, tls, target, log).await {
                        tracing::debug!(error = %e, "relay connection failed");
                    }
                });
            }
        });
        Ok(Relay { addr, seen, accept })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// [`Relay::seen`] once it holds at least `n` entries, or whatever it holds at `timeout`.
    async fn wait_seen(&self, n: usize, timeout: Duration) -> Vec<Seen> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.seen();
            if seen.len() >= n || Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn note(log: &Mutex<Vec<Seen>>, seen: Seen) {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(seen);
}

async fn relay_conn(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    target: SocketAddr,
    log: Arc<Mutex<Vec<Seen>>>,
) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let Some(acceptor) = tls else {
        return pipe(tcp, None, target, &log).await;
    };
    match acceptor.accept(tcp).await {
        Ok(stream) => {
            let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            pipe(stream, alpn, target, &log).await
        }
        Err(e) => {
            note(&log, Seen::HandshakeFailed(e.to_string()));
            Ok(())
        }
    }
}

async fn pipe<S>(
    mut client: S,
    alpn: Option<Vec<u8>>,
    target: SocketAddr,
    log: &Mutex<Vec<Seen>>,
) -> anyhow::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let first_line = String::from_utf8_lossy(&head[..end]).into_owned();
    note(log, Seen::Relayed { alpn, first_line });
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    upstream.write_all(&head).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// An https upstream: the simulator behind a TLS relay whose certificate names `localhost`.
struct TlsUpstream {
    dir: TempDir,
    ca_file: PathBuf,
    relay: Relay,
    _sim: goodput::sim::Sim,
}

impl TlsUpstream {
    async fn start(tag: &str) -> anyhow::Result<TlsUpstream> {
        let pki = Pki::new()?;
        let leaf = pki.leaf(&["localhost"])?;
        let dir = TempDir::new(tag);
        let ca_file = dir.write("ca.pem", &pki.ca_pem())?;
        let (sim, url) = start_sim(fast_sim(10.0, 1.0)).await;
        let relay = Relay::start(sim_addr(&url)?, Some(leaf.acceptor()?)).await?;
        Ok(TlsUpstream {
            dir,
            ca_file,
            relay,
            _sim: sim,
        })
    }

    fn url(&self) -> String {
        format!("https://localhost:{}", self.relay.addr.port())
    }

    /// goodput's config for this upstream; `extra` goes into `[upstream]`.
    fn config(&self, extra: &str) -> anyhow::Result<Config> {
        load_toml(
            &self.dir,
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n\
                 [upstream]\nurl = \"{}\"\n{extra}\n",
                self.url()
            ),
        )
    }
}

/// Streams one chat completion through `proxy` and checks the body and the record.
async fn stream_through(proxy: &goodput::run::Running, id: &str) -> anyhow::Result<Collected> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
    let resp = send(&client, chat_request(&uri, id, chat_body(true, 8, true))?).await?;
    ensure!(
        resp.status == StatusCode::OK,
        "status {}: {}",
        resp.status,
        resp.text()
    );
    let stream = parse_chat_stream(&resp.body)?;
    ensure!(
        stream.content_events == 8 && stream.usage_completion_tokens == Some(8),
        "{stream:?}"
    );
    let recs = records_by_id(proxy.admin_addr, &[id.to_owned()], Duration::from_secs(5)).await?;
    let r = &recs[id];
    ensure!(
        r["outcome"] == "ok" && r["output_tokens"] == 8,
        "record {r}"
    );
    Ok(resp)
}

#[test]
fn https_upstream_is_trusted_through_ca_file() {
    light(async {
        let up = TlsUpstream::start("ca-file").await.unwrap();
        let ca = toml_path(&up.ca_file).unwrap();
        let cfg = up.config(&format!("ca_file = {ca}")).unwrap();
        let proxy = start_proxy_with(cfg).await;
        stream_through(&proxy, "https-h1").await.unwrap();
        match up.relay.seen().as_slice() {
            [Seen::Relayed { alpn, first_line }] => {
                // HTTP/1.1 only: no ALPN offered, a plain request line inside TLS.
                assert!(alpn.as_deref().is_none_or(|p| p == b"http/1.1"), "{alpn:?}");
                assert_eq!(first_line, "POST /v1/chat/completions HTTP/1.1");
            }
            other => panic!("relay saw {other:?}"),
        }
        proxy.shutdown().await;
    });
}

#[test]
fn https_upstream_with_an_untrusted_certificate_is_a_502_naming_it() {
    light(async {
        let up = TlsUpstream::start("no-ca").await.unwrap();
        let proxy = start_proxy_with(up.config("").unwrap()).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
        let req = chat_request(&uri, "https-untrusted", chat_body(true, 8, true)).unwrap();
        let resp = send(&client, req).await.unwrap();
        assert_eq!(resp.status, StatusCode::BAD_GATEWAY, "{}", resp.text());
        assert_eq!(resp.headers["content-type"], "application/json");
        let v: Value = serde_json::from_slice(&resp.body).unwrap();
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            message.contains("certificate"),
            "error does not name the cause: {v}"
        );
        assert!(
            v["error"]["code"]
                .as_str()
                .is_some_and(|c| c.starts_with("upstream")),
            "{v}"
        );
        // The proxy refused the handshake itself: no request reached the untrusted peer.
        // (The relay learns of the refusal asynchronously, possibly after the 502.)
        let seen = up.relay.wait_seen(1, Duration::from_secs(5)).await;
        assert!(
            !seen.is_empty()
                && seen
                    .iter()
                    .all(|s| matches!(s, Seen::HandshakeFailed(e) if !e.is_empty())),
            "{seen:?}"
        );
        let ids = ["https-untrusted".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["https-untrusted"];
        assert_eq!(
            (r["status"].as_u64(), r["outcome"].as_str()),
            (Some(502), Some("upstream_error"))
        );
        // The same upstream with the CA trusted works: the failure was the trust, nothing else.
        let ca = toml_path(&up.ca_file).unwrap();
        let trusted = start_proxy_with(up.config(&format!("ca_file = {ca}")).unwrap()).await;
        stream_through(&trusted, "https-trusted").await.unwrap();
        proxy.shutdown().await;
        trusted.shutdown().await;
    });
}

#[test]
fn upstream_http2_over_tls_negotiates_h2_by_alpn() {
    light(async {
        let up = TlsUpstream::start("h2-alpn").await.unwrap();
        let ca = toml_path(&up.ca_file).unwrap();
        let proxy =
            start_proxy_with(up.config(&format!("ca_file = {ca}\nhttp2 = true")).unwrap()).await;
        stream_through(&proxy, "https-h2-a").await.unwrap();
        stream_through(&proxy, "https-h2-b").await.unwrap();
        match up.relay.seen().as_slice() {
            // Both requests share one multiplexed connection.
            [Seen::Relayed { alpn, first_line }] => {
                assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
                assert_eq!(first_line, "PRI * HTTP/2.0");
            }
            other => panic!("relay saw {other:?}"),
        }
        proxy.shutdown().await;
    });
}

#[test]
fn upstream_http2_over_plain_http_uses_h2c_prior_knowledge() {
    light(async {
        let (_sim, url) = start_sim(fast_sim(10.0, 1.0)).await;
        let relay = Relay::start(sim_addr(&url).unwrap(), None).await.unwrap();
        let dir = TempDir::new("h2c-upstream");
        let cfg = load_toml(
            &dir,
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
                 [upstream]\nurl = \"http://{}\"\nhttp2 = true\n",
                relay.addr
            ),
        )
        .unwrap();
        let proxy = start_proxy_with(cfg).await;
        stream_through(&proxy, "h2c-up-a").await.unwrap();
        stream_through(&proxy, "h2c-up-b").await.unwrap();
        match relay.seen().as_slice() {
            [
                Seen::Relayed {
                    alpn: None,
                    first_line,
                },
            ] => assert_eq!(first_line, "PRI * HTTP/2.0"),
            other => panic!("relay saw {other:?}"),
        }
        proxy.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------
// 3. HTTP Upgrade.

/// A WebSocket-style upstream over raw TCP: answers `101 Switching Protocols` (with
/// `greeting` in the same write, as servers that speak first do), then echoes every byte
/// until the peer half-closes, then closes. Notes each request head and the bytes echoed.
struct UpgradeUpstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    echoed: Arc<Mutex<Vec<u8>>>,
    accept: JoinHandle<()>,
}

impl UpgradeUpstream {
    async fn start(greeting: &'static [u8]) -> anyhow::Result<UpgradeUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let heads = Arc::new(Mutex::new(Vec::new()));
        let echoed = Arc::new(Mutex::new(Vec::new()));
        let (h, e) = (heads.clone(), echoed.clone());
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (h, e) = (h.clone(), e.clone());
                conns.spawn(async move {
                    if let Err(err) = upgrade_conn(tcp, greeting, &h, &e).await {
                        tracing::debug!(error = %err, "upgrade upstream connection failed");
                    }
                });
            }
        });
        Ok(UpgradeUpstream {
            addr,
            heads,
            echoed,
            accept,
        })
    }
}

impl Drop for UpgradeUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn upgrade_conn(
    mut tcp: TcpStream,
    greeting: &[u8],
    heads: &Mutex<Vec<String>>,
    echoed: &Mutex<Vec<u8>>,
) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let (head, rest) = read_head(&mut tcp).await?;
    heads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(head);
    let mut out = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\
                    connection: Upgrade\r\n\r\n"
        .to_vec();
    out.extend_from_slice(greeting);
    tcp.write_all(&out).await?;
    let mut pending = rest;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !pending.is_empty() {
            tcp.write_all(&pending).await?;
            echoed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(&pending);
        }
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            tcp.shutdown().await?;
            return Ok(());
        }
        pending = buf[..n].to_vec();
    }
}

/// Reads an HTTP/1.1 head; returns it and whatever followed it in the same reads.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> anyhow::Result<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = data.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&data).into_owned(), rest));
        }
        let n = s.read(&mut buf).await?;
        ensure!(
            n > 0,
            "connection closed inside a head: {:?}",
            String::from_utf8_lossy(&data)
        );
        data.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn upgrade_is_tunnelled_byte_exact_both_ways_and_recorded() {
    light(async {
        const GREETING: &[u8] = b"\x81\x05hello";
        let upstream = UpgradeUpstream::start(GREETING).await.unwrap();
        let proxy = start_proxy(&format!("http://{}", upstream.addr)).await;

        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        tcp.write_all(
            b"GET /v1/realtime HTTP/1.1\r\nhost: gw.test\r\nupgrade: websocket\r\n\
              connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              sec-websocket-version: 13\r\nx-request-id: ws-1\r\n\r\n",
        )
        .await
        .unwrap();
        let (head, mut from_tunnel) = read_head(&mut tcp).await.unwrap();
        let lower = head.to_ascii_lowercase();
        assert!(lower.starts_with("http/1.1 101 "), "{head}");
        assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
        assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");

        // Arbitrary bytes, including some that look like HTTP and every byte value.
        let mut payload: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
        payload.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        let (mut rd, mut wr) = tcp.into_split();
        let to_send = payload.clone();
        let writer = tokio::spawn(async move {
            for piece in to_send.chunks(7_777) {
                wr.write_all(piece).await?;
            }
            // Half-close: the tunnel must carry the FIN through and close the other side.
            wr.shutdown().await?;
            io::Result::Ok(wr)
        });
        let want = GREETING.len() + payload.len();
        let read_all = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = rd.read(&mut buf).await?;
                if n == 0 {
                    return io::Result::Ok(());
                }
                from_tunnel.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read_all)
            .await
            .expect("tunnel did not close after the half-close")
            .unwrap();
        let _wr = writer.await.unwrap().unwrap();
        assert_eq!(from_tunnel.len(), want);
        assert_eq!(&from_tunnel[..GREETING.len()], GREETING);
        assert!(
            from_tunnel[GREETING.len()..] == payload[..],
            "echo differs from what was sent"
        );
        let echoed = upstream
            .echoed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        assert!(echoed == payload, "upstream received different bytes");
        let heads = upstream
            .heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let up_head = heads[0].to_ascii_lowercase();
        assert!(
            up_head.starts_with("get /v1/realtime http/1.1\r\n"),
            "{up_head}"
        );
        assert!(up_head.contains("\r\nupgrade: websocket\r\n"), "{up_head}");
        assert!(up_head.contains("\r\nconnection: upgrade\r\n"), "{up_head}");
        assert!(up_head.contains("\r\nsec-websocket-key: dghlihnhbxbszsbub25jzq==\r\n"));

        let ids = ["ws-1".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["ws-1"];
        assert_eq!(r["api"], "upgrade", "{r}");
        assert_eq!(r["status"], 101, "{r}");
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["bytes_out"], want, "{r}");
        assert!(
            r["ttft_ms"].is_null() && r["output_tokens"].is_null(),
            "{r}"
        );
        assert!(r["e2e_ms"].as_f64().unwrap() > 0.0, "{r}");
        proxy.shutdown().await;
    });
}

/// Opens an upgraded tunnel through `proxy` with request id `id`; returns the stream with
/// the upstream's greeting already read.
async fn open_tunnel(proxy: SocketAddr, id: &str, greeting: &[u8]) -> anyhow::Result<TcpStream> {
    let mut tcp = TcpStream::connect(proxy).await?;
    let head = format!(
        "GET /v1/realtime HTTP/1.1\r\nhost: gw.test\r\nupgrade: websocket\r\n\
         connection: Upgrade\r\nx-request-id: {id}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await?;
    let (head, mut rest) = read_head(&mut tcp).await?;
    ensure!(head.starts_with("HTTP/1.1 101 "), "{head}");
    while rest.len() < greeting.len() {
        let mut buf = [0u8; 256];
        let n = tcp.read(&mut buf).await?;
        ensure!(n > 0, "closed before the greeting");
        rest.extend_from_slice(&buf[..n]);
    }
    ensure!(rest == greeting, "greeting {rest:?}");
    Ok(tcp)
}

#[test]
fn upgrade_tunnel_reset_by_the_client_is_recorded_with_its_bytes() {
    light(async {
        const GREETING: &[u8] = b"\x81\x02hi";
        let upstream = UpgradeUpstream::start(GREETING).await.unwrap();
        let proxy = start_proxy(&format!("http://{}", upstream.addr)).await;
        let mut tcp = open_tunnel(proxy.proxy_addr, "ws-reset", GREETING)
            .await
            .unwrap();
        let payload = vec![0x5a_u8; 1000];
        tcp.write_all(&payload).await.unwrap();
        let mut echo = vec![0u8; payload.len()];
        tcp.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, payload);
        // The client dies: RST instead of an orderly close.
        tcp.set_zero_linger().unwrap();
        drop(tcp);

        let ids = ["ws-reset".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["ws-reset"];
        assert_eq!(
            (r["api"].as_str(), r["status"].as_u64()),
            (Some("upgrade"), Some(101))
        );
        // What did flow before the reset is still counted, and the client is blamed.
        assert_eq!(r["bytes_out"], GREETING.len() + payload.len(), "{r}");
        assert_eq!(r["outcome"], "client_abort", "{r}");
        proxy.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------
// 4. 500 concurrent streams.

/// Sends `n` streamed chats at once; returns each body by the request id it was sent with.
async fn concurrent_streams(
    base: &str,
    n: usize,
    tag: &str,
) -> anyhow::Result<BTreeMap<String, Bytes>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let req = chat_request(&format!("{base}{CHAT}"), &id, chat_body(true, 20, true))?;
        let client = client.clone();
        tasks.spawn(async move {
            let resp = send(&client, req).await?;
            ensure!(
                resp.status == StatusCode::OK,
                "{id}: status {}",
                resp.status
            );
            anyhow::Ok((id, resp.body))
        });
    }
    let mut out = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (id, body) = done??;
        out.insert(id, body);
    }
    Ok(out)
}

#[test]
fn five_hundred_concurrent_streams_are_byte_exact_and_all_recorded() {
    const N: usize = 500;
    exclusive(async {
        let started = Instant::now();
        // The reference: the same seed answered directly. A body depends only on its
        // sequence number, which the simulator writes into every event's id, so bodies of
        // the two runs are matched by that id whatever order the requests arrived in.
        let sim_cfg = fast_sim(20.0, 2.0);
        let (_reference_sim, reference_url) = start_sim(sim_cfg.clone()).await;
        let (_sim, upstream) = start_sim(sim_cfg).await;
        let proxy = start_proxy(&upstream).await;

        let reference = concurrent_streams(&reference_url, N, "ref").await.unwrap();
        let mut by_sim_id = BTreeMap::new();
        for body in reference.values() {
            let s = parse_chat_stream(body).unwrap();
            assert_eq!(s.ids.len(), 1);
            by_sim_id.insert(s.ids.into_iter().next().unwrap(), mask_created(body));
        }
        assert_eq!(by_sim_id.len(), N);

        let proxied_at = Instant::now();
        let proxied = concurrent_streams(&format!("http://{}", proxy.proxy_addr), N, "c")
            .await
            .unwrap();
        let proxied_took = proxied_at.elapsed();
        assert_eq!(proxied.len(), N);
        let mut sim_ids = BTreeSet::new();
        for (id, body) in &proxied {
            let s = parse_chat_stream(body).unwrap_or_else(|e| panic!("{id}: {e:#}"));
            assert_eq!(s.content_events, 20, "{id}");
            assert_eq!(s.usage_completion_tokens, Some(20), "{id}");
            assert_eq!(
                s.ids.len(),
                1,
                "{id}: events of several streams mixed: {:?}",
                s.ids
            );
            let sim_id = s.ids.into_iter().next().unwrap();
            assert!(
                by_sim_id.get(&sim_id) == Some(&mask_created(body)),
                "{id} ({sim_id}) differs from the direct answer"
            );
            assert!(sim_ids.insert(sim_id), "{id}: a stream was delivered twice");
        }

        let ids: Vec<String> = proxied.keys().cloned().collect();
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(10))
            .await
            .unwrap();
        for (id, body) in &proxied {
            let r = &recs[id];
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(r["output_tokens"], 20, "{r}");
            assert_eq!(r["events"], 20, "{r}");
            assert_eq!(r["bytes_out"], body.len(), "{r}");
        }
        let (_, metrics) = http_get(proxy.admin_addr, "/metrics").await.unwrap();
        assert_eq!(
            sum_series(&metrics, "goodput_requests_total"),
            N as f64,
            "{metrics}"
        );
        assert_eq!(
            metric_value(&metrics, "goodput_in_flight_requests"),
            Some(0.0),
            "{metrics}"
        );
        assert_eq!(
            metric_value(&metrics, "goodput_measurement_dropped_total"),
            Some(0.0)
        );
        proxy.shutdown().await;
        eprintln!(
            "500 streams: proxied run {proxied_took:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

#[test]
fn five_hundred_streams_multiplexed_on_one_h2_connection_all_reach_the_upstream_at_once() {
    const N: usize = 500;
    exclusive(async {
        // Every response starts and then stalls, so every stream stays open: the only way
        // fewer than N requests reach the upstream is a concurrency limit on the way, which
        // would hold the rest back in the client, before t_arrival, unmeasured. The
        // default bounds (128 streams per connection, 1024 upstream connections) are
        // raised to let N through: an operator's choice (tests/hostile.rs holds them).
        let upstream = FakeUpstream::start(Script::stall_after_head()).await;
        let mut cfg = harness::test_config(&upstream.url());
        cfg.server.limits.http2_max_concurrent_streams = N as u32;
        cfg.upstream.max_connections = N;
        let proxy = start_proxy_with(cfg).await;
        let tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        let conn = tokio::spawn(conn);

        let mut tasks = JoinSet::new();
        for i in 0..N {
            let id = format!("mux-{i}");
            let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
            let req = chat_request(&uri, &id, chat_body(true, 3, true)).unwrap();
            let mut sender = sender.clone();
            tasks.spawn(async move {
                let resp = sender.send_request(req).await?;
                ensure!(resp.status() == StatusCode::OK, "{id}: {}", resp.status());
                let mut body = resp.into_body();
                let first = body.frame().await.context("no first frame")??;
                ensure!(
                    first.data_ref().map(|d| &d[..]) == Some(SSE_COMMENT),
                    "{id}: {first:?}"
                );
                anyhow::Ok((id, body))
            });
        }
        let reached = upstream
            .wait_requests(N, Duration::from_secs(10))
            .await
            .len();
        assert_eq!(
            reached, N,
            "streams of one HTTP/2 connection were held back"
        );
        let mut open = Vec::new();
        while let Some(done) = tasks.join_next().await {
            open.push(done.unwrap().unwrap());
        }

        // Hanging up the connection cancels every one of the upstream requests.
        drop((open, sender));
        conn.abort();
        let deadline = Instant::now() + Duration::from_secs(10);
        while upstream.client_closes().len() < N && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            upstream.client_closes().len(),
            N,
            "upstream requests left open"
        );
        let ids: Vec<String> = (0..N).map(|i| format!("mux-{i}")).collect();
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(10))
            .await
            .unwrap();
        for r in recs.values() {
            assert_eq!(r["outcome"], "client_abort", "{r}");
        }
        let (_, metrics) = http_get(proxy.admin_addr, "/metrics").await.unwrap();
        assert_eq!(
            metric_value(&metrics, "goodput_in_flight_requests"),
            Some(0.0),
            "{metrics}"
        );
        proxy.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------
// 5. Accuracy against the simulator's ground truth.

#[test]
fn recorded_timings_agree_with_the_servers_ground_truth() {
    const N: usize = 40;
    const TOKENS: u32 = 10;
    exclusive(async {
        let (sim, upstream) = start_sim(fast_sim(20.0, 5.0)).await;
        let proxy = start_proxy(&upstream).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
        // Warm-up: opens the client and upstream connections so no request below pays a
        // connect inside its timings.
        let warm = send(
            &client,
            chat_request(&uri, "acc-warmup", chat_body(true, 2, true)).unwrap(),
        );
        assert_eq!(warm.await.unwrap().status, StatusCode::OK);

        let mut sent_at = BTreeMap::new();
        for i in 0..N {
            let id = format!("acc-{i}");
            let req = chat_request(&uri, &id, chat_body(true, TOKENS, true)).unwrap();
            let t_send = Instant::now();
            let resp = send(&client, req).await.unwrap();
            assert_eq!(resp.status, StatusCode::OK);
            sent_at.insert(id, t_send);
        }
        let ids: Vec<String> = sent_at.keys().cloned().collect();
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let truths: BTreeMap<String, goodput::sim::Truth> = sim
            .truth()
            .into_iter()
            .filter_map(|t| Some((t.request_id.clone()?, t)))
            .collect();

        // Two comparisons, both on the one monotonic clock this process shares with the
        // simulator and the proxy:
        //
        // - TPOT: the record's (t_last − t_first)/(n − 1) against the same quantity from the
        //   instants the simulator wrote the first and last token. Delivery delay common to
        //   both events cancels out.
        //
        // - first-token lag: the proxy's first-token instant is t_arrival + ttft, but
        //   t_arrival is internal to the proxy. It is bracketed, though: the client sent the
        //   request before it (t_send ≤ t_arrival) and the simulator received it after the
        //   proxy forwarded it (t_arrival ≤ truth.received_at). So
        //       lag_hi = truth.received_at + ttft − truth.first_token_at
        //   over-states the true lag by exactly the request's forwarding delay and is an
        //   upper bound; asserting lag_hi ≤ 2 ms is therefore stricter than the requirement
        //   (it is also `record.ttft − server-side ttft`: the TTFT error itself). It must
        //   not be negative either: the proxy cannot see a token before it was written.
        //   (t_send + ttft − first would be a lower bound, useless for a ≤ check.)
        //
        // A loaded 2-core machine can stall any one request for a scheduler tick or more;
        // a timing error of the proxy would show in most requests, a stall in a few. So
        // the bound is asserted on the median and the 95th percentile (nearest rank: two
        // outliers in 40 are tolerated), not on the maximum.
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (mut tpot_err, mut lag_hi) = (Vec::new(), Vec::new());
        for id in &ids {
            let (r, t) = (&recs[id], &truths[id]);
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(
                r["output_tokens"].as_u64(),
                Some(t.completion_tokens),
                "{r}"
            );
            assert_eq!(r["input_tokens"].as_u64(), Some(t.prompt_tokens), "{r}");
            assert_eq!(r["events"].as_u64(), Some(u64::from(t.events)), "{r}");
            let (first, last) = (t.first_token_at.unwrap(), t.last_token_at.unwrap());
            let truth_tpot = ms(last - first) / (t.completion_tokens - 1) as f64;
            tpot_err.push((r["tpot_ms"].as_f64().unwrap() - truth_tpot).abs());
            let ttft = r["ttft_ms"].as_f64().unwrap();
            let truth_ttft = ms(first - t.received_at);
            let lag = ttft - truth_ttft;
            assert!(
                lag >= -0.001,
                "{id}: proxy saw the first token {lag:.3} ms before it was sent"
            );
            assert!(sent_at[id] <= t.received_at, "clocks disagree");
            lag_hi.push(lag);
        }
        let report = format!("tpot |error| ms {tpot_err:.3?}\nfirst-token lag ms {lag_hi:.3?}");
        eprintln!("{report}");
        for (what, values) in [
            ("tpot error", &mut tpot_err),
            ("first-token lag", &mut lag_hi),
        ] {
            let (p50, p95) = (percentile(values, 0.5), percentile(values, 0.95));
            assert!(
                p50 <= 2.0 && p95 <= 2.0,
                "{what}: p50 {p50:.3} p95 {p95:.3} ms\n{report}"
            );
        }
        // The 2 ms bound leaves room for a wrong definition: dividing by n instead of n - 1
        // is off by tpot/n = 0.5 ms here, in every request. With one shared clock the
        // typical request is exact to scheduling noise (~0.01 ms), so the median must be too.
        let p50 = percentile(&mut tpot_err, 0.5);
        assert!(p50 <= 0.1, "median tpot error {p50:.3} ms\n{report}");
        proxy.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------
// 6. Secrecy.

/// The secrets found in `text`.
fn leaked(text: &str) -> Vec<&'static str> {
    SECRETS.into_iter().filter(|s| text.contains(s)).collect()
}

/// Sends a streamed and a non-streamed chat with every secret; returns the request ids.
async fn send_secrets(proxy: SocketAddr, tag: &str) -> anyhow::Result<Vec<String>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{proxy}{CHAT}");
    let mut ids = Vec::new();
    for stream in [true, false] {
        let id = format!("{tag}-{}", if stream { "stream" } else { "full" });
        let body = chat_body(stream, 8, stream);
        ensure!(
            body.contains("SECRET-PROMPT-TEXT"),
            "the prompt must carry the secret"
        );
        let resp = send(&client, chat_request(&uri, &id, body)?).await?;
        ensure!(
            resp.status == StatusCode::OK,
            "{id}: {} {}",
            resp.status,
            resp.text()
        );
        ids.push(id);
    }
    Ok(ids)
}

/// Checks that `/metrics` and the API hold records for `ids` and none of the secrets.
async fn admin_is_clean(admin: SocketAddr, ids: &[String]) -> anyhow::Result<()> {
    records_by_id(admin, ids, Duration::from_secs(5)).await?;
    for path in ["/metrics", "/api/v1/requests?limit=1000"] {
        let (status, text) = http_get(admin, path).await?;
        ensure!(status == StatusCode::OK, "{path}: {status}");
        ensure!(
            leaked(&text).is_empty(),
            "{path} leaks {:?}:\n{text}",
            leaked(&text)
        );
    }
    Ok(())
}

#[test]
fn secrets_never_reach_metrics_or_the_api_in_process() {
    light(async {
        let events = openai_chat_events(8, true);
        let upstream = FakeUpstream::start(Script::sse_chunked(
            &events,
            WritePlan::Whole,
            Duration::ZERO,
        ))
        .await;
        let proxy = start_proxy(&upstream.url()).await;
        let ids = send_secrets(proxy.proxy_addr, "inproc").await.unwrap();
        // Credentials are the gateway's business: they pass through untouched.
        let seen = upstream.wait_requests(2, Duration::from_secs(5)).await;
        for r in &seen {
            assert_eq!(r.header("authorization"), Some("Bearer SECRET-API-KEY"));
            assert_eq!(r.header("x-api-key"), Some("SECRET-X-API-KEY"));
            assert_eq!(r.header("api-key"), Some("SECRET-API-KEY-2"));
            assert_eq!(r.header("cookie"), Some("session=SECRET-COOKIE"));
            assert!(r.body_text().contains("SECRET-PROMPT-TEXT"));
        }
        admin_is_clean(proxy.admin_addr, &ids).await.unwrap();
        proxy.shutdown().await;
    });
}

/// A `goodput serve` child process; killed if the test ends without stopping it.
struct Served {
    child: std::process::Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Two free loopback ports: bound, read, released. Another process may take one before
/// goodput binds it; [`serve_binary`] retries once for that.
fn free_ports() -> io::Result<(u16, u16)> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// Starts the real binary in front of `upstream` and waits until its admin server answers.
async fn serve_binary(
    dir: &TempDir,
    tag: &str,
    upstream: &str,
    config: Option<&Path>,
) -> anyhow::Result<Served> {
    let mut last_error = None;
    for attempt in 0..2 {
        let (p, a) = free_ports()?;
        let (proxy, admin): (SocketAddr, SocketAddr) = (
            format!("127.0.0.1:{p}").parse()?,
            format!("127.0.0.1:{a}").parse()?,
        );
        let stdout = dir.path().join(format!("{tag}-{attempt}.stdout"));
        let stderr = dir.path().join(format!("{tag}-{attempt}.stderr"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_goodput"));
        cmd.arg("serve")
            .args([
                "--listen",
                &proxy.to_string(),
                "--admin",
                &admin.to_string(),
            ])
            .args(["--upstream", upstream])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?);
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        let mut served = Served {
            child: cmd.spawn()?,
            proxy,
            admin,
            stdout,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = served.child.try_wait()? {
                let err = std::fs::read_to_string(&served.stderr).unwrap_or_default();
                last_error = Some(anyhow!("goodput exited early ({status}):\n{err}"));
                break;
            }
            if let Ok((StatusCode::OK, _)) = http_get(admin, "/healthz").await {
                return Ok(served);
            }
            if Instant::now() >= deadline {
                bail!("goodput did not come up within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow!("goodput did not start")))
}

/// SIGTERM, then waits for a clean exit; returns (stdout, stderr).
async fn terminate(mut served: Served) -> anyhow::Result<(String, String)> {
    let status = Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed: {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = served.child.try_wait()? {
            break exit;
        }
        ensure!(
            Instant::now() < deadline,
            "goodput did not exit within 10 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(exit.success(), "goodput exited with {exit} after SIGTERM");
    Ok((
        std::fs::read_to_string(&served.stdout)?,
        std::fs::read_to_string(&served.stderr)?,
    ))
}

#[test]
fn secrets_never_reach_the_logs_of_the_real_binary_text_and_json() {
    light(async {
        let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
        let dir = TempDir::new("secrecy");

        // Text logs, flags only, defaults: level info, access log on.
        let served = serve_binary(&dir, "text", &upstream, None).await.unwrap();
        let ids = send_secrets(served.proxy, "sec-text").await.unwrap();
        admin_is_clean(served.admin, &ids).await.unwrap();
        let (stdout, stderr) = terminate(served).await.unwrap();
        let logs = format!("{stdout}\n{stderr}");
        assert!(
            leaked(&logs).is_empty(),
            "text logs leak {:?}:\n{logs}",
            leaked(&logs)
        );
        // Written to a file, not a terminal: plain text that `grep id=...` finds.
        assert!(
            !logs.contains('\u{1b}'),
            "colour escapes in a log file:\n{logs}"
        );
        for id in &ids {
            let line = logs
                .lines()
                .find(|l| l.contains("goodput::access") && l.contains(&format!("id={id} ")))
                .unwrap_or_else(|| panic!("no access line for {id}:\n{logs}"));
            assert!(
                line.contains("outcome=\"ok\"") && line.contains("output_tokens=8"),
                "{line}"
            );
        }

        // JSON logs, from a config file.
        let config = dir
            .write("json.toml", "[log]\nformat = \"json\"\n")
            .unwrap();
        let served = serve_binary(&dir, "json", &upstream, Some(&config))
            .await
            .unwrap();
        let ids = send_secrets(served.proxy, "sec-json").await.unwrap();
        admin_is_clean(served.admin, &ids).await.unwrap();
        let (stdout, stderr) = terminate(served).await.unwrap();
        let logs = format!("{stdout}\n{stderr}");
        assert!(
            leaked(&logs).is_empty(),
            "JSON logs leak {:?}:\n{logs}",
            leaked(&logs)
        );
        let lines: Vec<Value> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        for id in &ids {
            let line = lines
                .iter()
                .find(|v| v["target"] == "goodput::access" && v["id"] == id.as_str())
                .unwrap_or_else(|| panic!("no access line for {id}:\n{stderr}"));
            assert_eq!(line["outcome"], "ok", "{line}");
            assert_eq!(line["output_tokens"], 8, "{line}");
        }
    });
}
