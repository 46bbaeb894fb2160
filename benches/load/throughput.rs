//! Throughput: 256 streams at once, events back to back (the simulator's TTFT and ITL are
//! 0), each stream followed at once by the next on the same connection. Per path and
//! round: events/s over a fixed window after a warm-up, the proxy's CPU seconds (user +
//! system, its whole process tree) per million events, and the client's and simulator's
//! CPU, to show whether they, rather than the proxy, were the limit.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use goodput::sim::{Dist, SimConfig};
use tokio::task::JoinSet;

use crate::client::{self, Ask};
use crate::paths::{Env, PathKind, rotate};
use crate::procs;

pub const STREAMS: usize = 256;
/// Tokens (= events) per stream: a long reply, so per-request costs weigh little.
pub const TOKENS: u32 = 1000;

pub fn sim_config() -> SimConfig {
    SimConfig {
        ttft: Dist::Fixed(0.0),
        itl: Dist::Fixed(0.0),
        ..SimConfig::default()
    }
}

#[derive(Clone, Debug, Default)]
pub struct ThrRound {
    pub events_per_s: f64,
    /// The proxy's CPU seconds per million events (`None` for direct).
    pub proxy_cpu_s_per_m: Option<f64>,
    /// The proxy's write system calls (`write`, `writev`) per 1,000 events.
    pub proxy_writes_per_k: Option<f64>,
    /// All the proxy's system calls per 1,000 events (perf; `None` without it).
    pub proxy_syscalls_per_k: Option<f64>,
    /// The proxy's CPU use, % of one core.
    pub proxy_cpu_pct: Option<f64>,
    pub client_cpu_pct: f64,
    pub sim_cpu_pct: f64,
    /// The whole machine, % of all cores.
    pub machine_busy_pct: f64,
    pub failed_streams: u64,
}

pub async fn run(env: &Env, upstream: SocketAddr) -> Result<BTreeMap<PathKind, Vec<ThrRound>>> {
    let paths = env.start_paths(upstream, "throughput")?;
    let kinds = paths.kinds();
    let (warm, window) = if env.quick {
        (Duration::from_millis(700), Duration::from_secs(3))
    } else {
        (Duration::from_secs(2), Duration::from_secs(8))
    };
    let mut out: BTreeMap<PathKind, Vec<ThrRound>> = BTreeMap::new();
    for round in 0..env.rounds {
        for kind in rotate(&kinds, round) {
            let addr = paths.addr(kind);
            let proxy = paths.proxy(kind);
            let pids = proxy.map(crate::procs::Proxy::pids).unwrap_or_default();
            let r = measure(env, addr, warm, window, &pids, || {
                proxy.map(|p| (p.cpu_seconds(), p.io_calls().1))
            })
            .await;
            out.entry(kind).or_default().push(r);
            // Let the path settle (aborted streams closing) before the next one.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    paths.stop();
    Ok(out)
}

async fn measure(
    env: &Env,
    addr: SocketAddr,
    warm: Duration,
    window: Duration,
    pids: &[u32],
    proxy_usage: impl Fn() -> Option<(f64, u64)>,
) -> ThrRound {
    let c = client::client();
    let events = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ask = Ask {
        max_tokens: TOKENS,
        usage: env.usage,
    };
    let mut set = JoinSet::new();
    for w in 0..STREAMS {
        let (c, events, failed, stop) = (c.clone(), events.clone(), failed.clone(), stop.clone());
        set.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let id = format!("thr-{w}-{n}");
                n += 1;
                if client::stream(&c, addr, id, ask, false, Some(&events))
                    .await
                    .is_err()
                {
                    failed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
    }
    tokio::time::sleep(warm).await;
    let snap = || {
        let (client_cpu, sim_cpu) = procs::own_cpu_split();
        (
            Instant::now(),
            events.load(Ordering::Relaxed),
            proxy_usage(),
            client_cpu,
            sim_cpu,
            procs::machine_jiffies(),
        )
    };
    let (t0, e0, p0, c0, s0, m0) = snap();
    tokio::time::sleep(window).await;
    let (t1, e1, p1, c1, s1, m1) = snap();
    let syscalls = crate::syscalls::per_unit(pids, &events, window).await;
    stop.store(true, Ordering::Relaxed);
    set.abort_all();
    while set.join_next().await.is_some() {}

    let secs = t1.duration_since(t0).as_secs_f64();
    let n = e1.saturating_sub(e0) as f64;
    let proxy = p0.zip(p1).map(|(a, b)| b.0 - a.0);
    let writes = p0.zip(p1).map(|(a, b)| b.1.saturating_sub(a.1) as f64);
    let busy = (m1.0.saturating_sub(m0.0)) as f64;
    let total = (m1.1.saturating_sub(m0.1)) as f64;
    ThrRound {
        events_per_s: n / secs,
        proxy_cpu_s_per_m: proxy.filter(|_| n > 0.0).map(|cpu| cpu / n * 1e6),
        proxy_writes_per_k: writes.filter(|_| n > 0.0).map(|w| w / n * 1000.0),
        proxy_syscalls_per_k: syscalls.map(|s| s * 1000.0),
        proxy_cpu_pct: proxy.map(|cpu| cpu / secs * 100.0),
        client_cpu_pct: (c1 - c0) / secs * 100.0,
        sim_cpu_pct: (s1 - s0) / secs * 100.0,
        machine_busy_pct: if total > 0.0 {
            busy / total * 100.0
        } else {
            0.0
        },
        failed_streams: failed.load(Ordering::Relaxed),
    }
}
