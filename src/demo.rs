//! `goodput demo`: the built-in simulator as the upstream, the proxy in front of it and a
//! light synthetic client load through the proxy, with a one-line live summary every few
//! seconds until Ctrl-C. Everything stays on 127.0.0.1.

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use bytes::Bytes;
use http::{Request, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::net::TcpListener;

use crate::{
    config::{self, Overrides},
    measure::{Outcome, RequestRecord},
    run,
    sim::{Sim, SimConfig},
    stats::engine::Summary,
};

/// The demo's configuration (SLO classes and cost); also checked in CI as a config file.
const DEMO_CONFIG: &str = include_str!("../config/demo.toml");

/// The window the live line reports.
const SUMMARY_WINDOW: Duration = Duration::from_secs(60);

#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Proxy address; if taken, a free port is used instead.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Admin address; if taken, a free port is used instead.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub admin: SocketAddr,
    /// Concurrent synthetic clients.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Seconds between summary lines.
    #[arg(long, default_value_t = 5)]
    pub interval: u64,
    /// Stop by itself after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Fraction of simulated requests that fail with HTTP 500.
    #[arg(long, default_value_t = 0.01)]
    pub error_rate: f64,
    /// Fraction of simulated streams reset mid-stream.
    #[arg(long, default_value_t = 0.01)]
    pub reset_rate: f64,
}

async fn bind_or_any(addr: SocketAddr) -> std::io::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            TcpListener::bind(SocketAddr::new(addr.ip(), 0)).await
        }
        Err(e) => Err(e),
    }
}

pub async fn run(args: DemoArgs) -> ExitCode {
    match demo(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("goodput demo: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let sim_listener = TcpListener::bind("127.0.0.1:0").await?;
    let sim_addr = sim_listener.local_addr()?;
    let sim = Sim::new(SimConfig {
        concurrency_knee: Some(16),
        error_rate: args.error_rate,
        reset_rate: args.reset_rate,
        ..SimConfig::default()
    });
    let (sim_stop, sim_stopped) = tokio::sync::oneshot::channel::<()>();
    let sim_task = tokio::spawn({
        let sim = sim.clone();
        async move {
            sim.serve(sim_listener, async {
                let _ = sim_stopped.await;
            })
            .await
        }
    });

    let proxy_listener = bind_or_any(args.listen).await?;
    let admin_listener = bind_or_any(args.admin).await?;
    let overrides = Overrides {
        listen: Some(proxy_listener.local_addr()?.to_string()),
        upstream: Some(format!("http://{sim_addr}")),
        admin: Some(admin_listener.local_addr()?.to_string()),
    };
    let cfg = config::load_str(DEMO_CONFIG, "config/demo.toml", &overrides)?;
    let running = run::start_on(cfg, proxy_listener, admin_listener)?;
    let proxy = running.proxy_addr;
    println!("goodput demo");
    println!("  simulator (upstream)  http://{sim_addr}");
    println!("  proxy                 http://{proxy}/v1/chat/completions");
    println!(
        "  dashboard             {}",
        crate::admin::dashboard_url(running.admin_addr, false)
    );
    println!(
        "  admin                 http://{}/metrics  /api/v1/summary  /api/v1/requests",
        running.admin_addr
    );
    println!(
        "  load                  {} synthetic clients; Ctrl-C to stop",
        args.clients
    );

    let mut load = tokio::task::JoinSet::new();
    for worker in 0..args.clients {
        load.spawn(client_loop(proxy, worker as u64));
    }
    let interval = Duration::from_secs(args.interval.max(1));
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    let mut since = tokio::time::Instant::now().into_std();
    let deadline = async {
        match args.duration {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let signal = run::shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let now = std::time::Instant::now();
                let summary = running.live.lock().summary(SUMMARY_WINDOW, now);
                match summary {
                    Some(s) => {
                        println!("{}", summary_line(&s));
                        let status = running
                            .calibration
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .clone();
                        for a in &status.attribution {
                            println!("{}", attribution_line(a));
                        }
                    }
                    None => println!("{}", recent_line(&running.recent.since(since), now - since)),
                }
                since = now;
            }
            () = &mut deadline => break,
            () = &mut signal => break,
        }
    }
    load.abort_all();
    while load.join_next().await.is_some() {}
    running.shutdown().await;
    let _ = sim_stop.send(());
    let _ = sim_task.await;
    Ok(())
}

/// One synthetic user: a mix of streaming (with and without usage) and non-streaming
/// chat requests with varied lengths and think times.
async fn client_loop(proxy: SocketAddr, seed: u64) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut rng = SmallRng::seed_from_u64(seed);
    let url = format!("http://{proxy}/v1/chat/completions");
    loop {
        let stream = rng.random_bool(0.8);
        let body = serde_json::json!({
            "model": "sim-model",
            "messages": [{"role": "user", "content": "x".repeat(rng.random_range(20..2000))}],
            "max_tokens": rng.random_range(16..256),
            "stream": stream,
            "stream_options": if stream { serde_json::json!({"include_usage": rng.random_bool(0.7)}) } else { serde_json::Value::Null },
        });
        let req = Request::post(&url)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())));
        if let Ok(req) = req
            && let Ok(resp) = client.request(req).await
        {
            let _ = resp.into_body().collect().await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
    }
}

fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    crate::quantile::nearest_rank(values, q)
}

/// `1m: 412 req | SLO 97.1% | goodput 1020 of 1100 tok/s | TTFT p50 152 p95 260 ms |
/// TPOT p50 20.1 ms | $3.20/M eff. tok | stable conc 8`.
pub fn summary_line(s: &Summary) -> String {
    let o = &s.overall;
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    let cost = o
        .cost_per_million_effective_tokens
        .map_or_else(String::new, |c| {
            let currency = o.cost.as_ref().map_or("", |c| c.currency.as_str());
            format!(" | {c:.2} {currency}/M eff. tok")
        });
    format!(
        "{}: {} req | SLO {} | goodput {:.0} of {:.0} tok/s | TTFT p50 {} p95 {} ms | TPOT p50 {} ms{} | stable conc {}",
        s.window,
        o.group.rates.requests,
        pct(o.group.rates.attainment),
        o.group.rates.effective_goodput_tokens_per_s,
        o.group.rates.raw_output_tokens_per_s,
        ms(o.group.ttft_ms.p50),
        ms(o.group.ttft_ms.p95),
        o.group
            .tpot_ms
            .p50
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
        cost,
        o.group
            .max_stable_concurrency
            .map_or_else(|| "-".to_owned(), |v| v.to_string()),
    )
}

/// `  where time goes (sim-model): queue 0 | prefill 152 | decode 1840 | outside engine 1.2
/// ms | KV cache 38% | waiting 0 | running 6 | preempted 0`: the engine's own phases (from
/// its vLLM-style metrics) beside the time the proxy saw outside it.
pub fn attribution_line(a: &crate::calibrate::Attribution) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.1}", v * 1000.0));
    let n = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    format!(
        "  where time goes ({}): queue {} | prefill {} | decode {} | outside engine {} ms | KV cache {} | waiting {} | running {} | preempted {}",
        if a.model.is_empty() { "all" } else { &a.model },
        ms(a.queue_seconds),
        ms(a.prefill_seconds),
        ms(a.decode_seconds),
        ms(a.outside_engine_seconds),
        a.kv_cache_usage
            .map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", v * 100.0)),
        n(a.requests_waiting),
        n(a.requests_running),
        n(a.preemptions),
    )
}

/// `reqs 40 (8.0/s) ok 97% | ttft p50 152 ms p95 260 ms | tpot p50 20.1 ms | 1020 tok/s`.
pub fn recent_line(records: &[std::sync::Arc<RequestRecord>], window: Duration) -> String {
    let secs = window.as_secs_f64().max(1e-9);
    let n = records.len();
    let ok = records.iter().filter(|r| r.outcome == Outcome::Ok).count();
    let mut ttft: Vec<f64> = records.iter().filter_map(|r| r.ttft_ms).collect();
    let mut tpot: Vec<f64> = records.iter().filter_map(|r| r.tpot_ms).collect();
    let tokens: u64 = records.iter().filter_map(|r| r.output_tokens).sum();
    let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0} ms"));
    let ok_pct = if n == 0 {
        100.0
    } else {
        100.0 * ok as f64 / n as f64
    };
    format!(
        "reqs {n} ({:.1}/s) ok {ok_pct:.0}% | ttft p50 {} p95 {} | tpot p50 {} | {:.0} tok/s",
        n as f64 / secs,
        fmt(percentile(&mut ttft, 0.5)),
        fmt(percentile(&mut ttft, 0.95)),
        percentile(&mut tpot, 0.5).map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms")),
        tokens as f64 / secs,
    )
}
