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
    process::Command,
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
    poll_loop!(deadline = Instant::now() + timeout, {
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
    });
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

mod accuracy;
mod concurrency;
mod h2c;
mod secrecy;
mod tls;
mod upgrade;
mod upstream_tls;
