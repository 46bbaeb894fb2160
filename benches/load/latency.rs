//! Latency and accuracy: streams of 100 events 20 ms apart (after a 50 ms TTFT), 1 or 64
//! at a time, on each path in turn.
//!
//! An event's latency is its transit from the simulator to the client: the simulator runs
//! in this process (same monotonic clock) and records when it handed each content event to
//! hyper, so every event's transit is measured exactly; added latency is a path's quantile
//! minus direct's. Events are also timed against the simulator's absolute timetable
//! (request arrival + TTFT + k × ITL), a secondary figure: it also holds the simulator's
//! own timer lateness (tokio's 1 ms wheel, the same for every event of a stream), which
//! only many streams average out.
//!
//! Accuracy compares, per goodput request, the TTFT the client saw (request handed to the
//! client → first content event received) with the TTFT goodput recorded, read back from
//! its `/api/v1/requests` by `x-request-id`.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use bytes::Bytes;
use goodput::sim::{Dist, Sim, SimConfig, Truth};
use http_body_util::{BodyExt, Full};
use tokio::task::JoinSet;

use crate::client::{self, Ask, HttpClient, Stream};
use crate::paths::{Env, PathKind, rotate};
use crate::stats::median;

pub const TTFT_MS: f64 = 50.0;
pub const ITL_MS: f64 = 20.0;
pub const TOKENS: u32 = 100;

pub fn sim_config() -> SimConfig {
    SimConfig {
        ttft: Dist::Fixed(TTFT_MS),
        itl: Dist::Fixed(ITL_MS),
        record_event_times: true,
        ..SimConfig::default()
    }
}

#[derive(Default)]
pub struct LatPath {
    /// Every content event's transit from the simulator's send, µs.
    pub event_us: Vec<f64>,
    /// Every content event's latency against the simulator's timetable, µs.
    pub timetable_us: Vec<f64>,
    /// Per round: the median event latency.
    pub round_p50_us: Vec<f64>,
    pub streams: usize,
    pub failed: usize,
}

pub struct LatencyOut {
    pub concurrency: usize,
    pub paths: BTreeMap<PathKind, LatPath>,
    /// goodput only: client TTFT − recorded TTFT, ms.
    pub ttft_diff_ms: Vec<f64>,
    /// goodput requests whose record could not be found.
    pub unmatched: usize,
}

pub async fn run(
    env: &Env,
    sim: &Sim,
    upstream: SocketAddr,
    concurrency: usize,
) -> Result<LatencyOut> {
    let paths = env.start_paths(upstream, &format!("latency{concurrency}"))?;
    let kinds = paths.kinds();
    let clients: BTreeMap<PathKind, HttpClient> =
        kinds.iter().map(|k| (*k, client::client())).collect();
    let ask = Ask {
        max_tokens: TOKENS,
        usage: env.usage,
    };
    // One stream at a time gives 100 samples, all from one connection: run several.
    let sequential = match (concurrency, env.quick) {
        (1, true) => 2,
        (1, false) => 4,
        _ => 1,
    };
    let mut out = LatencyOut {
        concurrency,
        paths: BTreeMap::new(),
        ttft_diff_ms: Vec::new(),
        unmatched: 0,
    };
    // Warm-up: open the connections (client → proxy → simulator) the rounds will reuse.
    for (kind, c) in &clients {
        let warm = Ask {
            max_tokens: 2,
            usage: env.usage,
        };
        let batch = batch(
            c,
            paths.addr(*kind),
            &format!("warm{concurrency}-{}", kind.name()),
            concurrency,
            1,
            warm,
        )
        .await;
        if batch.iter().all(Result::is_err) {
            bail!("{} path does not answer", kind.name());
        }
    }
    for round in 0..env.rounds {
        for kind in rotate(&kinds, round) {
            let Some(c) = clients.get(&kind) else {
                continue;
            };
            let prefix = format!("lat{concurrency}-{}-r{round}-", kind.name());
            let results = batch(c, paths.addr(kind), &prefix, concurrency, sequential, ask).await;
            let truth = truth_by_id(sim, &prefix);
            let p = out.paths.entry(kind).or_default();
            let mut round_events = Vec::new();
            let mut ok = Vec::new();
            for r in results {
                p.streams += 1;
                match r {
                    Ok(s) => match truth.get(&s.id).and_then(|t| timings(&s, t)) {
                        Some((timetable, exact)) => {
                            round_events.extend(exact);
                            p.timetable_us.extend(timetable);
                            ok.push(s);
                        }
                        None => p.failed += 1,
                    },
                    Err(e) => {
                        eprintln!("load: {} stream failed: {e:#}", kind.name());
                        p.failed += 1;
                    }
                }
            }
            if let Some(m) = median(&round_events) {
                p.round_p50_us.push(m);
            }
            p.event_us.extend(round_events);
            // The plain hyper proxy keeps no records to compare with.
            if kind == PathKind::Goodput
                && !env.plain
                && let Some(admin) = paths.goodput.admin
            {
                let (diffs, unmatched) = accuracy(c, admin, &ok).await;
                out.ttft_diff_ms.extend(diffs);
                out.unmatched += unmatched;
            }
        }
    }
    paths.stop();
    Ok(out)
}

/// `n` streams at once (started a fraction of an ITL apart so their events interleave as
/// independent users' do), `sequential` times over.
pub async fn batch(
    c: &HttpClient,
    addr: SocketAddr,
    prefix: &str,
    n: usize,
    sequential: usize,
    ask: Ask,
) -> Vec<Result<Stream>> {
    let mut all = Vec::new();
    for s in 0..sequential {
        let mut set = JoinSet::new();
        let stagger = Duration::from_secs_f64(ITL_MS / 1000.0 / n as f64);
        for i in 0..n {
            let c = c.clone();
            let id = format!("{prefix}{s}-{i}");
            set.spawn(async move {
                tokio::time::sleep(stagger * i as u32).await;
                client::stream(&c, addr, id, ask, true, None).await
            });
        }
        while let Some(r) = set.join_next().await {
            all.push(r.map_err(anyhow::Error::from).and_then(|r| r));
        }
    }
    all
}

/// The simulator's ground truth of the finished requests whose id starts with `prefix`.
pub fn truth_by_id(sim: &Sim, prefix: &str) -> HashMap<String, Truth> {
    sim.truth()
        .into_iter()
        .filter_map(|t| Some((t.request_id.clone()?, t)))
        .filter(|(id, _)| id.starts_with(prefix))
        .collect()
}

/// (every content event's latency vs the timetable, its exact transit), µs.
pub fn timings(s: &Stream, t: &Truth) -> Option<(Vec<f64>, Vec<f64>)> {
    let tokens = t.events as usize;
    if tokens == 0 {
        return None;
    }
    // The role chunk, then the content events.
    let content = s.events.get(1..=tokens)?;
    let us = |a: Instant, b: Instant| match a.checked_duration_since(b) {
        Some(d) => d.as_secs_f64() * 1e6,
        None => -(b.duration_since(a).as_secs_f64() * 1e6),
    };
    let timetable = content
        .iter()
        .enumerate()
        .map(|(k, &recv)| {
            let due =
                t.received_at + Duration::from_secs_f64((TTFT_MS + ITL_MS * k as f64) / 1000.0);
            us(recv, due)
        })
        .collect();
    if t.event_times.len() != content.len() {
        return None;
    }
    let exact = content
        .iter()
        .zip(&t.event_times)
        .map(|(&recv, &sent)| us(recv, sent))
        .collect();
    Some((timetable, exact))
}

/// Client TTFT − goodput's recorded TTFT per stream (ms), and how many had no record.
async fn accuracy(c: &HttpClient, admin: SocketAddr, streams: &[Stream]) -> (Vec<f64>, usize) {
    let mut recorded: HashMap<String, f64> = HashMap::new();
    for _ in 0..30 {
        recorded = records(c, admin).await.unwrap_or_default();
        if streams.iter().all(|s| recorded.contains_key(&s.id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut diffs = Vec::new();
    let mut unmatched = 0;
    for s in streams {
        let client_ttft = s
            .events
            .get(1)
            .map(|first| first.duration_since(s.sent).as_secs_f64() * 1000.0);
        match (client_ttft, recorded.get(&s.id)) {
            (Some(c), Some(p)) => diffs.push(c - p),
            _ => unmatched += 1,
        }
    }
    (diffs, unmatched)
}

/// id → ttft_ms of goodput's recent records.
async fn records(c: &HttpClient, admin: SocketAddr) -> Result<HashMap<String, f64>> {
    let req = http::Request::get(format!("http://{admin}/api/v1/requests?limit=1000"))
        .body(Full::new(Bytes::new()))?;
    let body = c
        .request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    let list = v
        .get("requests")
        .and_then(|r| r.as_array())
        .cloned()
        .unwrap_or_default();
    Ok(list
        .iter()
        .filter_map(|r| {
            let id = r.get("id")?.as_str()?.to_owned();
            let ttft = r.get("ttft_ms")?.as_f64()?;
            Some((id, ttft))
        })
        .collect())
}
