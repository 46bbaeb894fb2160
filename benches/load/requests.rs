//! Request rate: short requests back to back from a closed loop of N clients at a few
//! levels of N, every other one non-streamed (a 4-token answer as one JSON body) and the
//! rest short streams (4 tokens, 7 events), against a simulator that answers at once. Per
//! level and path: requests/s, latency P50 / P99 per request (sent to last byte), the
//! P99 a proxy adds to direct's at the same level, and the proxy's CPU per request. The
//! headline is the highest rate measured at which a proxy's added P99 stays within 1 ms.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use bytes::Bytes;
use goodput::sim::{Dist, SimConfig};
use http::{Request, StatusCode, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::client::{self, Ask, HttpClient};
use crate::paths::{Env, PathKind, rotate};
use crate::stats::quantile;

/// Tokens per answer: a short reply, so the request's own costs dominate.
const TOKENS: u32 = 4;
/// The added P99 a proxy may cost at a level for that level's rate to count.
pub const ADDED_P99_BUDGET_US: f64 = 1_000.0;

pub fn sim_config() -> SimConfig {
    SimConfig {
        ttft: Dist::Fixed(0.0),
        itl: Dist::Fixed(0.0),
        ..SimConfig::default()
    }
}

pub fn levels(quick: bool) -> &'static [usize] {
    if quick { &[1, 8, 32] } else { &[1, 4, 16, 64] }
}

/// One level on one path.
#[derive(Clone, Debug)]
pub struct Level {
    pub clients: usize,
    pub requests_per_s: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// The proxy's CPU µs per request (`None` for direct).
    pub proxy_cpu_us: Option<f64>,
    /// The proxy's system calls per request (`None` for direct, or without perf).
    pub proxy_syscalls: Option<f64>,
    pub failed: u64,
}

/// Levels per path, in level order.
pub type RequestsOut = BTreeMap<PathKind, Vec<Level>>;

pub async fn run(env: &Env, upstream: SocketAddr) -> Result<RequestsOut> {
    let paths = env.start_paths(upstream, "requests")?;
    let haproxy = env.start_proxy(PathKind::Haproxy, upstream, "requests")?;
    let mut kinds = paths.kinds();
    if haproxy.is_some() {
        kinds.push(PathKind::Haproxy);
    }
    let (warm, window) = if env.quick {
        (Duration::from_millis(300), Duration::from_secs(2))
    } else {
        (Duration::from_secs(1), Duration::from_secs(5))
    };
    let mut out = RequestsOut::new();
    for (i, &clients) in levels(env.quick).iter().enumerate() {
        for kind in rotate(&kinds, i) {
            let (addr, proxy) = match (kind, &haproxy) {
                (PathKind::Haproxy, Some(h)) => (h.addr, Some(h)),
                _ => (paths.addr(kind), paths.proxy(kind)),
            };
            let pids = proxy.map(crate::procs::Proxy::pids).unwrap_or_default();
            let level = measure(addr, clients, warm, window, &pids, || {
                proxy.map(crate::procs::Proxy::cpu_seconds)
            })
            .await;
            out.entry(kind).or_default().push(level);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    paths.stop();
    if let Some(h) = haproxy {
        tokio::task::block_in_place(|| h.stop());
    }
    Ok(out)
}

/// A non-streamed chat completion, read to its end.
async fn plain(c: &HttpClient, addr: SocketAddr, id: &str) -> Result<()> {
    let body = format!(
        r#"{{"model":"sim-model","stream":false,"max_tokens":{TOKENS},"messages":[{{"role":"user","content":"Say four words."}}]}}"#
    );
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(CONTENT_TYPE, "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(body)))?;
    let resp = c.request(req).await?;
    if resp.status() != StatusCode::OK {
        bail!("{id}: status {}", resp.status());
    }
    resp.into_body().collect().await?;
    Ok(())
}

async fn measure(
    addr: SocketAddr,
    clients: usize,
    warm: Duration,
    window: Duration,
    pids: &[u32],
    proxy_cpu: impl Fn() -> Option<f64>,
) -> Level {
    let c = client::client();
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Latencies (µs) of the requests that ended while the window was open.
    let window_open = Arc::new(AtomicBool::new(false));
    let lat: Arc<Mutex<Vec<f64>>> = Arc::default();
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ask = Ask {
        max_tokens: TOKENS,
        usage: true,
    };
    let mut set = JoinSet::new();
    for w in 0..clients {
        let (c, stop, open, lat, failed, done) = (
            c.clone(),
            stop.clone(),
            window_open.clone(),
            lat.clone(),
            failed.clone(),
            done.clone(),
        );
        set.spawn(async move {
            let mut n = 0u64;
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let id = format!("req-{w}-{n}");
                n += 1;
                let t = Instant::now();
                let r = if n.is_multiple_of(2) {
                    plain(&c, addr, &id).await
                } else {
                    client::stream(&c, addr, id, ask, false, None)
                        .await
                        .map(|_| ())
                };
                let us = t.elapsed().as_secs_f64() * 1e6;
                if r.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                match r {
                    Ok(()) if open.load(Ordering::Relaxed) => mine.push(us),
                    Ok(()) => {}
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            lat.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(mine);
        });
    }
    tokio::time::sleep(warm).await;
    let (t0, p0) = (Instant::now(), proxy_cpu());
    window_open.store(true, Ordering::Relaxed);
    tokio::time::sleep(window).await;
    window_open.store(false, Ordering::Relaxed);
    let (t1, p1) = (Instant::now(), proxy_cpu());
    // System calls in a window of their own after it, so that perf's own cost is not in
    // the CPU figures: per request = calls per second / requests per second, both there.
    let proxy_syscalls = crate::syscalls::per_unit(pids, &done, window).await;
    stop.store(true, Ordering::Relaxed);
    while set.join_next().await.is_some() {}
    let lat = std::mem::take(&mut *lat.lock().unwrap_or_else(PoisonError::into_inner));
    let n = lat.len() as f64;
    let secs = t1.duration_since(t0).as_secs_f64();
    Level {
        clients,
        requests_per_s: n / secs,
        proxy_syscalls,
        p50_us: quantile(&lat, 0.5),
        p99_us: quantile(&lat, 0.99),
        proxy_cpu_us: p0
            .zip(p1)
            .filter(|_| n > 0.0)
            .map(|(a, b)| (b - a) / n * 1e6),
        failed: failed.load(Ordering::Relaxed),
    }
}

/// P99 `kind` adds to direct's at level `i`.
fn added_p99(out: &RequestsOut, kind: PathKind, i: usize) -> Option<f64> {
    let at = |k: PathKind| out.get(&k).and_then(|v| v.get(i)).and_then(|l| l.p99_us);
    Some(at(kind)? - at(PathKind::Direct)?)
}

/// The highest rate `kind` reached at a level where it added at most the budget.
pub fn best_rate(out: &RequestsOut, kind: PathKind) -> Option<f64> {
    out.get(&kind)?
        .iter()
        .enumerate()
        .filter(|(i, _)| added_p99(out, kind, *i).is_some_and(|a| a <= ADDED_P99_BUDGET_US))
        .map(|(_, l)| l.requests_per_s)
        .reduce(f64::max)
}

fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

/// The scenario's own table (a row per level and path, as paths differ from the other
/// scenarios': HAProxy too) and its JSON objects.
pub fn table(out: &RequestsOut) -> (String, Vec<Value>) {
    let kinds: Vec<PathKind> = out.keys().copied().collect();
    let count = out.get(&PathKind::Direct).map_or(0, Vec::len);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nrequests: short requests back to back (every other one streamed, {TOKENS} tokens)"
    );
    let _ = writeln!(
        t,
        "{:>8} {:<8} {:>11} {:>9} {:>9} {:>12} {:>11} {:>13} {:>8}",
        "clients",
        "path",
        "requests/s",
        "P50 us",
        "P99 us",
        "added P99 us",
        "CPU us/req",
        "syscalls/req",
        "failed"
    );
    let mut objects = Vec::new();
    for i in 0..count {
        for &k in &kinds {
            let Some(l) = out.get(&k).and_then(|v| v.get(i)) else {
                continue;
            };
            let added = if k == PathKind::Direct {
                None
            } else {
                added_p99(out, k, i)
            };
            let _ = writeln!(
                t,
                "{:>8} {:<8} {:>11} {:>9} {:>9} {:>12} {:>11} {:>13} {:>8}",
                l.clients,
                k.name(),
                cell(Some(l.requests_per_s), 0),
                cell(l.p50_us, 0),
                cell(l.p99_us, 0),
                cell(added, 0),
                cell(l.proxy_cpu_us, 1),
                cell(l.proxy_syscalls, 1),
                l.failed
            );
            objects.push(json!({
                "scenario": "requests",
                "path": k.name(),
                "clients": l.clients,
                "requests_per_s": l.requests_per_s,
                "latency_us": { "p50": l.p50_us, "p99": l.p99_us },
                "added_p99_us": added,
                "proxy_cpu_us_per_request": l.proxy_cpu_us,
                "proxy_syscalls_per_request": l.proxy_syscalls,
                "failed": l.failed,
            }));
        }
    }
    let mut best = serde_json::Map::new();
    let _ = write!(t, "highest requests/s with added P99 <= 1 ms:");
    for &k in kinds.iter().filter(|k| **k != PathKind::Direct) {
        let b = best_rate(out, k);
        let _ = write!(t, "  {} {}", k.name(), cell(b, 0));
        best.insert(k.name().to_owned(), json!(b));
    }
    let _ = writeln!(t);
    objects.push(json!({
        "scenario": "requests",
        "summary": "highest requests/s measured at a level where the proxy's added P99 <= 1 ms",
        "best_requests_per_s": best,
    }));
    (t, objects)
}
