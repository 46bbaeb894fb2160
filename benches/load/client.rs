//! The load client: hyper's pooled HTTP/1.1 client on a multi-thread runtime, reading SSE
//! streams with one clock read per body frame, the way the proxy itself does.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use http::{Request, StatusCode, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use memchr::memchr_iter;
use tokio::sync::watch;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One client (and connection pool) per path and scenario, so pools never mix.
pub fn client() -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(120))
        .build(http)
}

/// One request through a fresh proxy, so that lazily built state (pools, buffers, the
/// first record) exists before its memory is read; then half a second to settle.
pub async fn warm_up(client: &HttpClient, addr: SocketAddr) -> Result<()> {
    let req = Request::get(format!("http://{addr}/health")).body(Full::new(Bytes::new()))?;
    let body = client
        .request(req)
        .await
        .context("warm-up request")?
        .into_body();
    body.collect().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// What a stream asks for.
#[derive(Clone, Copy, Debug)]
pub struct Ask {
    pub max_tokens: u32,
    /// `stream_options.include_usage`, as most benchmark clients and SDK users send it.
    pub usage: bool,
}

fn request(addr: SocketAddr, id: &str, ask: Ask) -> Result<Request<Full<Bytes>>> {
    let body = format!(
        r#"{{"model":"sim-model","stream":true,"max_tokens":{},"stream_options":{{"include_usage":{}}},"messages":[{{"role":"system","content":"You are a helpful assistant."}},{{"role":"user","content":"Write a short story about a lighthouse keeper who finds a message in a bottle."}}]}}"#,
        ask.max_tokens, ask.usage
    );
    Ok(Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(CONTENT_TYPE, "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(body)))?)
}

/// Counts SSE events (blank-line terminated) across arbitrary chunk boundaries.
#[derive(Default)]
struct Events {
    last_was_lf: bool,
}

impl Events {
    fn feed(&mut self, data: &[u8]) -> usize {
        let mut n = 0;
        let mut prev: Option<usize> = None;
        for i in memchr_iter(b'\n', data) {
            let blank = if i == 0 {
                self.last_was_lf
            } else {
                prev == Some(i - 1)
            };
            if blank {
                n += 1;
            }
            prev = Some(i);
        }
        if let Some(&last) = data.last() {
            self.last_was_lf = last == b'\n';
        }
        n
    }
}

/// One finished stream as the client saw it.
pub struct Stream {
    pub id: String,
    /// Just before the request was handed to the client.
    pub sent: Instant,
    /// When each event was received (role, content..., usage, `[DONE]`).
    pub events: Vec<Instant>,
}

/// Runs one stream to its end; with `times`, keeps each event's arrival.
pub async fn stream(
    client: &HttpClient,
    addr: SocketAddr,
    id: String,
    ask: Ask,
    times: bool,
    counter: Option<&AtomicU64>,
) -> Result<Stream> {
    let req = request(addr, &id, ask)?;
    let sent = Instant::now();
    let resp = client.request(req).await?;
    if resp.status() != StatusCode::OK {
        bail!("{id}: status {}", resp.status());
    }
    let mut body = resp.into_body();
    let mut events = Vec::with_capacity(if times {
        ask.max_tokens as usize + 4
    } else {
        0
    });
    let mut framer = Events::default();
    while let Some(frame) = body.frame().await {
        let now = Instant::now();
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let n = framer.feed(&data);
        if times {
            events.extend(std::iter::repeat_n(now, n));
        }
        if let Some(c) = counter {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    Ok(Stream { id, sent, events })
}

/// Opens a stream whose first token will not come for an hour, counts it as open once
/// its response head arrived, and holds it until `stop`.
pub async fn idle(
    client: HttpClient,
    addr: SocketAddr,
    id: String,
    opened: &AtomicUsize,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let Some(resp) = open(&client, addr, &id, 100, opened, &mut stop).await? else {
        return Ok(());
    };
    let _ = stop.wait_for(|s| *s).await;
    drop(resp);
    Ok(())
}

/// Sends a stream's request and waits for its response head (counted in `opened`);
/// `None` when `stop` comes first.
async fn open(
    client: &HttpClient,
    addr: SocketAddr,
    id: &str,
    max_tokens: u32,
    opened: &AtomicUsize,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<http::Response<hyper::body::Incoming>>> {
    let req = request(
        addr,
        id,
        Ask {
            max_tokens,
            usage: true,
        },
    )?;
    let resp = tokio::select! {
        r = client.request(req) => r?,
        _ = stop.wait_for(|s| *s) => return Ok(None),
    };
    if resp.status() != StatusCode::OK {
        bail!("{id}: status {}", resp.status());
    }
    opened.fetch_add(1, Ordering::Relaxed);
    Ok(Some(resp))
}

/// Counters shared by the slow streams of one path.
#[derive(Clone)]
pub struct Slow {
    /// Streams whose response head arrived.
    pub opened: Arc<AtomicUsize>,
    /// Streams that received their first content event.
    pub active: Arc<AtomicUsize>,
    /// Events received by every stream.
    pub events: Arc<AtomicU64>,
}

/// Opens a long stream and reads it until `stop`, keeping each event's arrival (the role
/// chunk first).
pub async fn slow(
    client: HttpClient,
    addr: SocketAddr,
    id: String,
    counters: &Slow,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<Instant>> {
    let Some(resp) = open(&client, addr, &id, 4_000, &counters.opened, &mut stop).await? else {
        return Ok(Vec::new());
    };
    let mut body = resp.into_body();
    let mut framer = Events::default();
    let mut events = Vec::with_capacity(16);
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Some(frame) = frame else {
            bail!("{id}: the stream ended early");
        };
        let now = Instant::now();
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let n = framer.feed(&data);
        // The role chunk, then the first content event.
        if events.len() < 2 && events.len() + n >= 2 {
            counters.active.fetch_add(1, Ordering::Relaxed);
        }
        events.extend(std::iter::repeat_n(now, n));
        counters.events.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(events)
}
