//! Many long streams (`streams-10k`): 10,000 streams held open at once, each an agentic
//! session's slow reply (one event every [`ITL_MS`] ms, for as long as the scenario runs).
//! Per path, a fresh proxy process: warm it with one request and read its resident
//! memory; open the streams ([`OPENING`] at a time); once every stream has had its first
//! token, measure for a window: the proxy's resident memory per active stream (loaded −
//! baseline, over the streams), its CPU per event and in cores, and every event's transit
//! (client receipt − the simulator's hand-off of the same event, from the simulator's
//! ground truth) against direct's; then close every stream and read the memory again,
//! two seconds later: what the proxy kept after the streams were gone.
//!
//! Descriptors: each stream costs the proxy two and this process two (client and
//! simulator), so the benchmark raises its open-file limit (children inherit it) and
//! opens fewer streams, saying so, when it cannot.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use goodput::sim::{Dist, Sim, SimConfig, Truth};
use tokio::{sync::watch, task::JoinSet};

use crate::client::{self, Slow};
use crate::paths::{Env, PathKind};
use crate::stats::quantile;

pub const NAME: &str = "streams-10k";
pub const STREAMS: usize = 10_000;
/// Between two events of a stream (and before the first): a slow agentic reply.
pub const ITL_MS: f64 = 2_000.0;
/// Connections being opened at once (listen backlogs are finite).
const OPENING: usize = 200;
/// Descriptors this process keeps for everything but the streams.
const SPARE_FILES: u64 = 300;
/// The most descriptors goodput keeps for everything but connections (its file budget).
const GOODPUT_RESERVE_MAX: u64 = 1024;

pub fn sim_config() -> SimConfig {
    SimConfig {
        ttft: Dist::Fixed(ITL_MS),
        itl: Dist::Fixed(ITL_MS),
        record_event_times: true,
        ..SimConfig::default()
    }
}

/// Raises this process's open-file limit (soft and hard, as root) so that the streams fit;
/// returns how many streams fit in what it got.
pub fn raise_file_limit() -> usize {
    let want = (STREAMS as u64) * 2 + SPARE_FILES.max(GOODPUT_RESERVE_MAX);
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap_or((1024, 1024));
    let got = if soft >= want {
        soft
    } else if rlimit::Resource::NOFILE.set(want, want.max(hard)).is_ok() {
        want
    } else {
        let _ = rlimit::Resource::NOFILE.set(hard, hard);
        rlimit::Resource::NOFILE.get().map_or(soft, |(s, _)| s)
    };
    // Two descriptors per stream here (client, simulator); the proxy needs two as well and
    // inherits the same limit. goodput keeps a reserve of its limit (an eighth, 32 to 1,024
    // descriptors: src/proxy/fds.rs) and gives client and upstream connections half of
    // the rest each: past that it refuses clients, so fewer streams are opened for every
    // path alike.
    let reserve = (got / 8).clamp(32, GOODPUT_RESERVE_MAX).max(SPARE_FILES);
    let fit = (got.saturating_sub(reserve) / 2 / 100 * 100) as usize;
    if fit < STREAMS {
        eprintln!(
            "load: {NAME}: open-file limit {got} (could not raise it to {want}): {fit} streams instead of {STREAMS}"
        );
    }
    fit.min(STREAMS)
}

/// One path's measurement.
#[derive(Clone, Debug, Default)]
pub struct StreamsRun {
    pub opened: usize,
    pub failed: usize,
    pub window_s: f64,
    pub events: u64,
    /// Every event received inside the window: client receipt − simulator hand-off, µs.
    pub transit_us: Vec<f64>,
    /// Proxy paths only.
    pub proxy: Option<ProxySide>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ProxySide {
    pub baseline_bytes: u64,
    pub loaded_bytes: u64,
    pub after_close_bytes: u64,
    pub cpu_s: f64,
}

impl StreamsRun {
    pub fn rss_per_stream_kib(&self) -> Option<f64> {
        let p = self.proxy?;
        (self.opened > 0).then(|| {
            p.loaded_bytes.saturating_sub(p.baseline_bytes) as f64 / self.opened as f64 / 1024.0
        })
    }

    pub fn events_per_s(&self) -> Option<f64> {
        (self.window_s > 0.0).then(|| self.events as f64 / self.window_s)
    }

    pub fn cpu_us_per_event(&self) -> Option<f64> {
        let p = self.proxy?;
        (self.events > 0).then(|| p.cpu_s / self.events as f64 * 1e6)
    }

    pub fn cpu_cores(&self) -> Option<f64> {
        let p = self.proxy?;
        (self.window_s > 0.0).then(|| p.cpu_s / self.window_s)
    }

    pub fn transit_ms(&self, q: f64) -> Option<f64> {
        quantile(&self.transit_us, q).map(|us| us / 1000.0)
    }
}

pub type StreamsOut = BTreeMap<PathKind, StreamsRun>;

pub async fn run(env: &Env, streams: usize) -> Result<StreamsOut> {
    let (sim, upstream) = env.start_sim(sim_config())?;
    let window = if env.quick {
        Duration::from_secs(6)
    } else {
        Duration::from_secs(20)
    };
    let mut kinds = vec![PathKind::Direct, PathKind::Goodput];
    if env.nginx_bin.is_some() {
        kinds.insert(1, PathKind::Nginx);
    }
    let mut out = StreamsOut::new();
    for kind in kinds {
        eprintln!("load: {NAME}, {streams} streams through {}", kind.name());
        let proxy = env.start_proxy(kind, upstream, NAME)?;
        if kind != PathKind::Direct && proxy.is_none() {
            continue;
        }
        let addr = proxy.as_ref().map_or(upstream, |p| p.addr);
        let r = measure(&sim, proxy.as_ref(), addr, kind, streams, window).await;
        if let Some(p) = proxy {
            tokio::task::block_in_place(|| p.stop());
        }
        match r {
            Ok(r) => {
                out.insert(kind, r);
            }
            Err(e) => eprintln!("load: {NAME} on {} failed: {e:#}", kind.name()),
        }
        // The closed connections' TIME_WAIT and the simulator's dropped bodies settle.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(out)
}

async fn measure(
    sim: &Sim,
    proxy: Option<&crate::procs::Proxy>,
    addr: SocketAddr,
    kind: PathKind,
    streams: usize,
    window: Duration,
) -> Result<StreamsRun> {
    let c = client::client();
    client::warm_up(&c, addr).await?;
    let rss = || proxy.map_or(0, crate::procs::Proxy::rss_bytes);
    let cpu = || proxy.map_or(0.0, crate::procs::Proxy::cpu_seconds);
    let baseline = rss();

    let prefix = format!("{NAME}-{}-", kind.name());
    let shared = Slow {
        opened: Arc::new(AtomicUsize::new(0)),
        active: Arc::new(AtomicUsize::new(0)),
        events: Arc::new(AtomicU64::new(0)),
    };
    let failed = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = watch::channel(false);
    let mut set = JoinSet::new();
    let started = Instant::now();
    let opening_deadline = Duration::from_secs(120);
    for i in 0..streams {
        while i
            .saturating_sub(shared.opened.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed))
            >= OPENING
            && started.elapsed() < opening_deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (c, shared, stop, failed) = (c.clone(), shared.clone(), stop.clone(), failed.clone());
        let id = format!("{prefix}{i}");
        set.spawn(async move {
            match client::slow(c, addr, id.clone(), &shared, stop).await {
                Ok(events) => Some((id, events)),
                Err(e) => {
                    if failed.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!("load: {NAME} stream {id}: {e:#}");
                    }
                    None
                }
            }
        });
    }
    let settled =
        |n: &AtomicUsize| n.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) >= streams;
    while !settled(&shared.opened) && started.elapsed() < opening_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every open stream has had its first token (ITL_MS after its request).
    let first_by = Instant::now() + Duration::from_secs_f64(ITL_MS / 1000.0 * 2.0 + 5.0);
    while !settled(&shared.active) && Instant::now() < first_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = shared.opened.load(Ordering::Relaxed);
    let (t0, cpu0, ev0) = (Instant::now(), cpu(), shared.events.load(Ordering::Relaxed));
    tokio::time::sleep(window).await;
    let (t1, cpu1, ev1) = (Instant::now(), cpu(), shared.events.load(Ordering::Relaxed));
    let loaded = rss();
    let _ = stop_tx.send(true);
    let mut received = HashMap::new();
    while let Some(r) = set.join_next().await {
        if let Ok(Some((id, events))) = r {
            received.insert(id, events);
        }
    }
    if opened == 0 {
        bail!("no stream opened");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_close = rss();
    let truth = crate::latency::truth_by_id(sim, &prefix);
    let mut transit_us = Vec::new();
    for (id, events) in &received {
        if let Some(t) = truth.get(id) {
            transit_us.extend(transits(events, t, t0, t1));
        }
    }
    Ok(StreamsRun {
        opened,
        failed: failed.load(Ordering::Relaxed),
        window_s: t1.duration_since(t0).as_secs_f64(),
        events: ev1 - ev0,
        transit_us,
        proxy: proxy.map(|_| ProxySide {
            baseline_bytes: baseline,
            loaded_bytes: loaded,
            after_close_bytes: after_close,
            cpu_s: cpu1 - cpu0,
        }),
    })
}

/// Transit (µs) of each content event received in `[t0, t1)`: the client's receipt of the
/// k-th content event against the simulator's hand-off of it. `events` are the client's
/// receipts, the role chunk first.
fn transits(events: &[Instant], t: &Truth, t0: Instant, t1: Instant) -> Vec<f64> {
    events
        .iter()
        .skip(1)
        .zip(&t.event_times)
        .filter(|(recv, _)| **recv >= t0 && **recv < t1)
        .map(|(recv, sent)| match recv.checked_duration_since(*sent) {
            Some(d) => d.as_secs_f64() * 1e6,
            None => -(sent.duration_since(*recv).as_secs_f64() * 1e6),
        })
        .collect()
}
