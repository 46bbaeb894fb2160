//! Memory: 2,000 streams held open and idle (the simulator's first token is an hour away,
//! so each stream has its response head and nothing more). Per round and proxy, a fresh
//! process: warm it with one request, read its resident memory, open the streams, let it
//! settle, read it again; the difference divided by the streams is the cost of one idle
//! stream (both its connections, the request's state and the measurement's).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use goodput::sim::{Dist, SimConfig};
use tokio::{sync::watch, task::JoinSet};

use crate::client;
use crate::paths::{Env, PathKind, rotate};

pub const STREAMS: usize = 2_000;
/// Connections being opened at once (listen backlogs are finite).
const OPENING: usize = 200;

pub fn sim_config() -> SimConfig {
    SimConfig {
        ttft: Dist::Fixed(3_600_000.0),
        itl: Dist::Fixed(20.0),
        ..SimConfig::default()
    }
}

#[derive(Clone, Debug)]
pub struct MemRound {
    pub per_stream_bytes: f64,
    pub baseline_bytes: u64,
    pub opened: usize,
}

pub async fn run(env: &Env, upstream: SocketAddr) -> Result<BTreeMap<PathKind, Vec<MemRound>>> {
    let rounds = if env.quick { 1 } else { env.rounds.clamp(1, 3) };
    let mut out: BTreeMap<PathKind, Vec<MemRound>> = BTreeMap::new();
    let mut kinds = vec![PathKind::Goodput];
    if env.nginx_bin.is_some() {
        kinds.insert(0, PathKind::Nginx);
    }
    for round in 0..rounds {
        for kind in rotate(&kinds, round) {
            let Some(proxy) = env.start_proxy(kind, upstream, &format!("memory-r{round}"))? else {
                continue;
            };
            let r = measure(&proxy, proxy.addr).await;
            tokio::task::block_in_place(|| proxy.stop());
            match r {
                Ok(r) => out.entry(kind).or_default().push(r),
                Err(e) => eprintln!("load: memory round on {} failed: {e:#}", kind.name()),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(out)
}

async fn measure(proxy: &crate::procs::Proxy, addr: SocketAddr) -> Result<MemRound> {
    let c = client::client();
    client::warm_up(&c, addr).await?;
    let baseline = proxy.rss_bytes();

    let opened = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = watch::channel(false);
    let mut set = JoinSet::new();
    let started = Instant::now();
    for i in 0..STREAMS {
        while i.saturating_sub(opened.load(Ordering::Relaxed)) >= OPENING {
            if started.elapsed() > Duration::from_secs(60) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (c, opened, stop) = (c.clone(), opened.clone(), stop.clone());
        set.spawn(async move {
            if let Err(e) = client::idle(c, addr, format!("idle-{i}"), &opened, stop).await {
                eprintln!("load: idle stream {i}: {e:#}");
            }
        });
    }
    while opened.load(Ordering::Relaxed) < STREAMS && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = opened.load(Ordering::Relaxed);
    // Let allocations settle (connection tasks finish their first polls).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = proxy.rss_bytes();
    let _ = stop_tx.send(true);
    while set.join_next().await.is_some() {}
    if n == 0 {
        bail!("no stream opened");
    }
    Ok(MemRound {
        per_stream_bytes: loaded.saturating_sub(baseline) as f64 / n as f64,
        baseline_bytes: baseline,
        opened: n,
    })
}
