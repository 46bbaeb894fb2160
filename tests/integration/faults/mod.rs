//! Every fault path of the data path, over real loopback sockets: upstream resets and
//! truncated streams reach the client as aborts (after every byte the upstream did send), a
//! client that goes away cancels the upstream request, a dead or silent upstream becomes a
//! 502 / 504, idle and header-read timeouts fire (and never cut a healthy stream), shutdown
//! drains and then cuts, measurement never holds traffic back, and the binary's exit codes.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::common::{fake::*, harness::*, temp::TempDir};
use bytes::Bytes;
use goodput::{config::Config, measure::Outcome, run::Running};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const CHAT: &str = "/v1/chat/completions";

/// How a raw client read ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Orderly close (FIN).
    Eof,
    /// The connection was reset.
    Reset,
    /// Still open when the test stopped waiting.
    TimedOut,
}

/// Reads until the peer closes or `timeout` passes.
async fn read_to_end(s: &mut TcpStream, timeout: Duration) -> (Vec<u8>, End) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return End::Eof,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => return End::Reset,
            }
        }
    };
    let end = tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(End::TimedOut);
    (out, end)
}

/// Decodes the whole chunks (and the data of a cut last one) of a chunked body. Returns the
/// data and whether the terminating `0\r\n\r\n` chunk was there.
fn dechunk(mut body: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return (data, false);
        };
        let Some(size) = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
        else {
            return (data, false);
        };
        body = &body[eol + 2..];
        if size == 0 {
            return (data, body.starts_with(b"\r\n"));
        }
        let take = size.min(body.len());
        data.extend_from_slice(&body[..take]);
        if body.len() < size + 2 {
            return (data, false);
        }
        body = &body[size + 2..];
    }
}

/// Splits a raw response into its head and body, if the head is complete.
fn head_and_body(raw: &[u8]) -> Option<(String, &[u8])> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((
        String::from_utf8_lossy(&raw[..end]).into_owned(),
        &raw[end..],
    ))
}

/// Polls every frame of a body; returns the data and how the body ended.
async fn read_body(mut body: Incoming) -> (Vec<u8>, Result<(), hyper::Error>) {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    out.extend_from_slice(d);
                }
            }
            Err(e) => return (out, Err(e)),
        }
    }
    (out, Ok(()))
}

/// Reads data frames until at least `n` SSE events (`\n\n`) arrived; returns the data.
async fn read_events(body: &mut Incoming, n: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while out.windows(2).filter(|w| w == b"\n\n").count() < n {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    out.extend_from_slice(d);
                }
            }
            Some(Err(e)) => return Err(format!("body error after {} bytes: {e}", out.len())),
            None => return Err(format!("body ended after {} bytes", out.len())),
        }
    }
    Ok(out)
}

/// Sends a raw streaming chat request and reads from the socket until it holds `n` events.
async fn raw_stream_events(addr: SocketAddr, n: usize) -> Result<(TcpStream, Vec<u8>), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.write_all(&raw_post(CHAT, &chat_body(true, 100, false)))
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some((_, body)) = head_and_body(&raw)
            && dechunk(body).0.windows(2).filter(|w| w == b"\n\n").count() >= n
        {
            return Ok((s, raw));
        }
        match tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
            Ok(Ok(0)) => return Err("closed early".into()),
            Ok(Ok(k)) => raw.extend_from_slice(&buf[..k]),
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        }
    }
}

fn chat_url(p: &Running) -> String {
    format!("http://{}{CHAT}", p.proxy_addr)
}

/// Waits for exactly one record and returns it.
async fn one_record(admin: SocketAddr) -> Value {
    let recs = wait_records(admin, 1, Duration::from_secs(3)).await;
    assert_eq!(recs.len(), 1, "expected one record: {recs:?}");
    recs.into_iter().next().unwrap_or_default()
}

fn concat(events: &[Vec<u8>]) -> Vec<u8> {
    events.concat()
}

/// A script whose upstream writes the head and `n` events, waits so the proxy surely
/// read them (a reset discards unread bytes in the kernel), then ends with `last`.
fn prefix_then(events: &[Vec<u8>], n: usize, last: Step) -> Script {
    let mut s = Script::sse_then_close(events, n);
    s.steps.pop();
    s.then(Step::Pause(Duration::from_millis(50))).then(last)
}

/// [`SSE_HEAD`] and the first `n` events, then `last` at once.
fn prefix_then_at_once(events: &[Vec<u8>], n: usize, last: Step) -> Script {
    let mut s = Script::sse_then_close(events, n);
    s.steps.pop();
    s.then(last)
}

fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>()
}

mod binary;
mod client_gone;
mod drain;
mod header_timeout;
mod idle_timeout;
mod never_blocks;
mod no_response;
mod upstream_cut;
