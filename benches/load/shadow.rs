//! Shadow: what mirroring every request to a candidate costs the client. The latency
//! scenario's streams (100 events 20 ms apart) go direct, through goodput without a
//! shadow, through goodput with `[shadow] share = 1.0` to a second simulator, and with a
//! secondary as well (`secondary_url`, a third simulator: every copy goes to both and the
//! answers are compared), in the same run, paths alternating round by round. Figures: each event's transit from the
//! primary simulator to the client, its added P50/P99 against direct, and goodput's CPU
//! per streamed event (the shadow's copies, decoding and records included).

use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use crate::client::{self, Ask};
use crate::latency::{self, TOKENS};
use crate::paths::{Env, rotate};
use crate::procs::{self, Proxy};
use crate::stats::quantile;

/// Streams at once: enough that the copies' work competes with the primary's.
pub const STREAMS: usize = 32;

const PATHS: [&str; 4] = [
    "direct",
    "goodput",
    "goodput+shadow",
    "goodput+shadow+secondary",
];

#[derive(Default)]
struct PathOut {
    event_us: Vec<f64>,
    events: u64,
    cpu_s: f64,
    failed: usize,
}

pub struct ShadowOut {
    pub table: String,
    pub json: Value,
}

pub async fn run(env: &Env) -> Result<ShadowOut> {
    let (primary, upstream) = env.start_sim(latency::sim_config())?;
    let (_candidate, candidate) = env.start_sim(latency::sim_config())?;
    let (_secondary, secondary) = env.start_sim(latency::sim_config())?;
    let plain = start(env, upstream, "shadow-off", "")?;
    let shadow =
        format!("\n[shadow]\nurl = \"http://{candidate}\"\nshare = 1.0\nmax_in_flight = 1024\n");
    let shadowed = start(env, upstream, "shadow-on", &shadow)?;
    let both = start(
        env,
        upstream,
        "shadow-secondary",
        &format!("{shadow}secondary_url = \"http://{secondary}\"\n"),
    )?;
    let addr = |p: &str| -> SocketAddr {
        match p {
            "goodput" => plain.addr,
            "goodput+shadow" => shadowed.addr,
            "goodput+shadow+secondary" => both.addr,
            _ => upstream,
        }
    };
    let proxy = |p: &str| -> Option<&Proxy> {
        match p {
            "goodput" => Some(&plain),
            "goodput+shadow" => Some(&shadowed),
            "goodput+shadow+secondary" => Some(&both),
            _ => None,
        }
    };
    let http = client::client();
    let ask = Ask {
        max_tokens: TOKENS,
        usage: env.usage,
    };
    let warm = Ask {
        max_tokens: 2,
        usage: env.usage,
    };
    for p in PATHS {
        latency::batch(&http, addr(p), &format!("shwarm-{p}-"), STREAMS, 1, warm).await;
    }
    let mut out: BTreeMap<&str, PathOut> = BTreeMap::new();
    for round in 0..env.rounds {
        for p in rotate(&PATHS, round) {
            let prefix = format!("sh-{p}-r{round}-");
            let cpu_before = proxy(p).map(Proxy::cpu_seconds);
            let results = latency::batch(&http, addr(p), &prefix, STREAMS, 1, ask).await;
            // The copies end about when the streams do: their CPU belongs to this batch.
            if let Some(px) = proxy(p).filter(|_| p.starts_with("goodput+shadow")) {
                copies_done(&http, px.admin).await;
            }
            let cpu = cpu_before
                .zip(proxy(p).map(Proxy::cpu_seconds))
                .map(|(a, b)| b - a);
            let truth = latency::truth_by_id(&primary, &prefix);
            let o = out.entry(p).or_default();
            o.cpu_s += cpu.unwrap_or(0.0);
            for r in results {
                match r.ok().and_then(|s| latency::timings(&s, truth.get(&s.id)?)) {
                    Some((_, exact)) => {
                        o.events += exact.len() as u64;
                        o.event_us.extend(exact);
                    }
                    None => o.failed += 1,
                }
            }
        }
    }
    let copies = records_of(&http, shadowed.admin).await;
    tokio::task::block_in_place(|| {
        plain.stop();
        shadowed.stop();
        both.stop();
    });
    Ok(render(&out, copies))
}

fn start(env: &Env, upstream: SocketAddr, tag: &str, extra: &str) -> Result<Proxy> {
    let dir = env.dir.join(tag);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let config = format!("{}{extra}", env.goodput_config);
    tokio::task::block_in_place(|| {
        procs::start_goodput(&env.goodput_bin, "serve", &dir, upstream, &config)
    })
}

/// Waits (up to 10 s) until no copy is under way.
async fn copies_done(http: &client::HttpClient, admin: Option<SocketAddr>) {
    let Some(admin) = admin else { return };
    for _ in 0..200 {
        let Ok(req) = http::Request::get(format!("http://{admin}/metrics"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
        else {
            return;
        };
        if let Ok(resp) = http.request(req).await
            && let Ok(body) = http_body_util::BodyExt::collect(resp.into_body()).await
            && String::from_utf8_lossy(&body.to_bytes())
                .lines()
                .any(|l| l == "goodput_shadow_in_flight_requests 0")
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Shadow records the shadowed goodput kept (its recent ring), for the report.
async fn records_of(http: &client::HttpClient, admin: Option<SocketAddr>) -> usize {
    let Some(admin) = admin else { return 0 };
    let Ok(req) = http::Request::get(format!("http://{admin}/api/v1/requests?limit=100000"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
    else {
        return 0;
    };
    let Ok(resp) = http.request(req).await else {
        return 0;
    };
    let Ok(body) = http_body_util::BodyExt::collect(resp.into_body()).await else {
        return 0;
    };
    let v: Value = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
    v["requests"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|r| r["target"] == "shadow").count())
}

fn render(out: &BTreeMap<&str, PathOut>, copies: usize) -> ShadowOut {
    let q = |p: &str, x: f64| out.get(p).and_then(|o| quantile(&o.event_us, x));
    let added = |p: &str, x: f64| q(p, x).zip(q("direct", x)).map(|(a, d)| a - d);
    let cpu_us = |p: &str| {
        out.get(p)
            .filter(|o| o.events > 0)
            .map(|o| o.cpu_s * 1e6 / o.events as f64)
    };
    let f = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0}"));
    let mut table = format!(
        "\nshadow: {STREAMS} streams of {TOKENS} events, goodput with and without [shadow] share = 1.0 \
         (copies answered: {copies})\n"
    );
    let _ = writeln!(
        table,
        "  {:<24} {:>14} {:>14} {:>14} {:>14} {:>8}",
        "path", "transit p50 us", "transit p99 us", "added p50 us", "added p99 us", "cpu/event us"
    );
    let mut paths = Vec::new();
    for p in PATHS {
        let o = out.get(p);
        let _ = writeln!(
            table,
            "  {:<24} {:>14} {:>14} {:>14} {:>14} {:>8}",
            p,
            f(q(p, 0.5)),
            f(q(p, 0.99)),
            f(added(p, 0.5)),
            f(added(p, 0.99)),
            f(cpu_us(p))
        );
        paths.push(json!({
            "path": p,
            "events": o.map_or(0, |o| o.events),
            "failed": o.map_or(0, |o| o.failed),
            "transit_p50_us": q(p, 0.5), "transit_p99_us": q(p, 0.99),
            "added_p50_us": added(p, 0.5), "added_p99_us": added(p, 0.99),
            "cpu_per_event_us": cpu_us(p),
        }));
    }
    ShadowOut {
        table,
        json: json!({"scenario": "shadow", "streams": STREAMS, "shadow_records": copies, "paths": paths}),
    }
}
