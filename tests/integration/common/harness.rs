//! Starting goodput and the simulator in-process on `127.0.0.1:0`, and talking to them the
//! way a user would: a real HTTP client, raw sockets for byte-exact checks, and the admin
//! API and `/metrics` text for what was recorded.
#![expect(
    clippy::unwrap_used,
    reason = "test support: a failed set-up must stop the test"
)]

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use goodput::{
    config::{self, Config, Overrides},
    run::{self, Running},
    sim::{Sim, SimConfig},
};
use http::{Request, Response, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// A goodput configuration for tests: ephemeral ports, the given upstream.
pub fn test_config(upstream: &str) -> Config {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(upstream.into()),
        admin: Some("127.0.0.1:0".into()),
    };
    let mut cfg = config::load(None, &overrides).unwrap();
    cfg.log.access_log = false;
    server_from_env(&mut cfg);
    cfg
}

/// `GOODPUT_TEST_SERVER=own` (or `hyper`): plaintext HTTP/1.1 clients served by
/// goodput's own server connection (or hyper's), whatever the default
/// (`server.http1_own`), in every proxy a test starts, so that the suite checks both.
pub fn server_from_env(cfg: &mut Config) {
    match std::env::var("GOODPUT_TEST_SERVER").as_deref() {
        Ok("own") => cfg.server.http1_own = true,
        Ok("hyper") => cfg.server.http1_own = false,
        _ => {}
    }
}

/// Starts goodput in front of `upstream` with the configuration `toml` (the access log
/// off; ephemeral ports).
pub async fn start_proxy_toml(upstream: &str, toml: &str) -> Running {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(upstream.into()),
        admin: Some("127.0.0.1:0".into()),
    };
    let text = format!("[log]\naccess_log = false\n{toml}");
    start_proxy_with(config::load_str(&text, "test", &overrides).unwrap()).await
}

/// Starts goodput in front of `upstream`.
pub async fn start_proxy(upstream: &str) -> Running {
    start_proxy_with(test_config(upstream)).await
}

/// Starts goodput with `cfg`. `GOODPUT_TEST_UPSTREAM_CLIENT=hyper` runs every test on
/// hyper's HTTP/1.1 client instead of goodput's relay (`upstream.http1_relay = false`), so
/// that the suite checks both; `GOODPUT_TEST_SERVER` as [`server_from_env`] says.
pub async fn start_proxy_with(mut cfg: Config) -> Running {
    if std::env::var("GOODPUT_TEST_UPSTREAM_CLIENT").is_ok_and(|v| v == "hyper") {
        cfg.upstream.http1_relay = false;
    }
    server_from_env(&mut cfg);
    run::start(cfg).await.unwrap()
}

/// A running simulator and its base URL. The server task ends with the test runtime.
pub async fn start_sim(cfg: SimConfig) -> (Sim, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sim = Sim::new(cfg);
    let serving = sim.clone();
    tokio::spawn(async move { serving.serve(listener, std::future::pending()).await });
    (sim, url)
}

/// A fast, deterministic simulator: fixed TTFT and ITL in milliseconds.
pub fn fast_sim(ttft_ms: f64, itl_ms: f64) -> SimConfig {
    SimConfig {
        ttft: "fixed:0".parse().unwrap(),
        itl: "fixed:0".parse().unwrap(),
        ..SimConfig::default()
    }
    .with_times(ttft_ms, itl_ms)
}

trait WithTimes {
    fn with_times(self, ttft_ms: f64, itl_ms: f64) -> Self;
}

impl WithTimes for SimConfig {
    fn with_times(mut self, ttft_ms: f64, itl_ms: f64) -> Self {
        self.ttft = format!("fixed:{ttft_ms}").parse().unwrap();
        self.itl = format!("fixed:{itl_ms}").parse().unwrap();
        self
    }
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An OpenAI chat request body.
pub fn chat_body(stream: bool, max_tokens: u32, include_usage: bool) -> String {
    let mut body = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": "SECRET-PROMPT-TEXT say hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if include_usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string()
}

/// POSTs JSON through `client` and returns the response with its body still streaming.
pub async fn post(client: &HttpClient, url: &str, body: String) -> Response<Incoming> {
    let req = Request::post(url)
        .header(CONTENT_TYPE, "application/json")
        .header("authorization", "Bearer SECRET-API-KEY")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    client.request(req).await.unwrap()
}

/// POSTs JSON and collects the whole body.
pub async fn post_collect(client: &HttpClient, url: &str, body: String) -> (u16, Bytes) {
    let resp = post(client, url, body).await;
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// GETs an admin path and returns the body text.
pub async fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    let client = client();
    let resp = client
        .get(format!("http://{admin}{path}").parse().unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

pub async fn metrics(admin: SocketAddr) -> String {
    admin_get(admin, "/metrics").await.1
}

/// The recorded requests, oldest first.
pub async fn records(admin: SocketAddr) -> Vec<Value> {
    let (_, body) = admin_get(admin, "/api/v1/requests?limit=100000").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    v["requests"].as_array().unwrap().clone()
}

/// Waits until at least `n` requests are recorded (records are finished off the data path,
/// so they appear shortly after the response ends).
pub async fn wait_records(admin: SocketAddr, n: usize, timeout: Duration) -> Vec<Value> {
    poll_loop!(deadline = tokio::time::Instant::now() + timeout, {
        let r = records(admin).await;
        if r.len() >= n || tokio::time::Instant::now() >= deadline {
            return r;
        }
    });
}

/// The record of request `id` (its `x-request-id`), waiting up to `timeout` for it to be
/// finished off the data path.
pub async fn record_of(admin: SocketAddr, id: &str, timeout: Duration) -> Value {
    poll_until!(format!("the record of {id}"), timeout, {
        records(admin).await.into_iter().find(|r| r["id"] == id)
    })
}

/// Sends raw bytes on a fresh connection and reads until the peer closes (or `timeout`).
/// Returns what was read and whether the read ended in an error (reset) rather than EOF.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return false,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => return true,
            }
        }
    };
    let errored = tokio::time::timeout(timeout, read_all)
        .await
        .unwrap_or(false);
    (out, errored)
}

/// A raw HTTP/1.1 POST with `Connection: close`.
pub fn raw_post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Splits a raw HTTP/1.1 response into its head and its (still encoded) body.
pub fn split_head(raw: &[u8]) -> (String, &[u8]) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    (
        String::from_utf8_lossy(&raw[..end]).into_owned(),
        &raw[end..],
    )
}

/// The value of one sample line of the metrics text, e.g.
/// `goodput_requests_total{model="m",api="chat_completions",outcome="ok"}`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().split(' ').next())
        })
        .and_then(|v| v.parse().ok())
}

// Every test file uses a different subset; naming each item once keeps all of them "used".
const _: () = {
    let _ = keep_alive;
};

fn keep_alive() {
    let _ = (
        test_config,
        start_proxy,
        start_proxy_with,
        start_sim,
        fast_sim,
        client,
        chat_body,
        post,
        post_collect,
        admin_get,
        metrics,
        records,
        wait_records,
        raw_exchange,
        raw_post,
        split_head,
        metric_value,
    );
}
