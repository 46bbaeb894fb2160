//! The results as one table (ratios goodput/direct and goodput/nginx, with the spread over
//! rounds) and as `load.json` (the Contract: one object per scenario and path, plus the
//! machine it ran on).

use std::{collections::BTreeMap, fmt::Write as _, process::Command};

use serde_json::{Value, json};

use crate::latency::{self, LatencyOut};
use crate::memory::{self, MemRound};
use crate::paths::{Env, PathKind};
use crate::stats::{median, quantile, ratio, spread};
use crate::throughput::{self, ThrRound};

#[derive(Default)]
pub struct Results {
    pub latency: Vec<LatencyOut>,
    pub throughput: Option<BTreeMap<PathKind, Vec<ThrRound>>>,
    pub memory: Option<BTreeMap<PathKind, Vec<MemRound>>>,
    pub requests: Option<crate::requests::RequestsOut>,
    pub streams: Option<crate::streams::StreamsOut>,
    pub shadow: Option<crate::shadow::ShadowOut>,
    pub load_before: String,
    pub load_after: String,
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    let s = String::from_utf8_lossy(&text).trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn machine(env: &Env, r: &Results) -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_owned());
    let nginx = env
        .nginx_bin
        .as_ref()
        .and_then(|b| command_line(&b.to_string_lossy(), &["-v"]));
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu_model": cpu,
        "kernel": kernel,
        "rustc": command_line("rustc", &["--version"]),
        "nginx": nginx,
        "goodput": if env.plain {
            Some("plain hyper proxy (benches/load/plain.rs), in goodput's place".to_owned())
        } else {
            command_line(&env.goodput_bin.to_string_lossy(), &["--version"])
        },
        "timestamp": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        "loadavg_before": r.load_before,
        "loadavg_after": r.load_after,
    })
}

/// Formats an optional number.
fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn pair(a: Option<f64>, b: Option<f64>, digits: usize) -> String {
    if a.is_none() && b.is_none() {
        return "-".to_owned();
    }
    format!("{} / {}", f(a, digits), f(b, digits))
}

fn range(s: Option<(f64, f64)>, digits: usize) -> String {
    s.map_or_else(String::new, |(a, b)| {
        format!("[{a:.digits$} .. {b:.digits$}]")
    })
}

struct Table(String);

impl Table {
    fn row(&mut self, cells: [&str; 7]) {
        let [s, fig, d, n, g, rd, rn] = cells;
        let _ = writeln!(
            self.0,
            "{s:<14} {fig:<34} {d:>13} {n:>13} {g:>13} {rd:>13} {rn:>13}"
        );
    }
    fn note(&mut self, text: &str) {
        let _ = writeln!(self.0, "{:<14} {:<34} {text}", "", "");
    }
}

struct Target {
    what: String,
    goodput: String,
    nginx: String,
    met: Option<bool>,
}

pub fn render(env: &Env, r: &Results) -> (String, Value) {
    let mut t = Table(String::new());
    let mut objects = Vec::new();
    let mut targets = Vec::new();
    let _ = writeln!(
        t.0,
        "goodput load benchmark: {} mode, {} round(s), load average {} before, {} after",
        if env.quick { "quick" } else { "full" },
        env.rounds,
        r.load_before,
        r.load_after
    );
    if env.plain {
        let _ = writeln!(
            t.0,
            "the goodput column is a plain hyper proxy that measures nothing (--plain-hyper)"
        );
    }
    t.row([
        "scenario",
        "figure",
        "direct",
        "nginx",
        "goodput",
        "goodput/direct",
        "goodput/nginx",
    ]);
    let mut requests_table = String::new();
    for l in &r.latency {
        latency_rows(&mut t, &mut objects, &mut targets, l);
    }
    if let Some(thr) = &r.throughput {
        throughput_rows(&mut t, &mut objects, &mut targets, thr);
    }
    if let Some(req) = &r.requests {
        let (table, objs) = crate::requests::table(req);
        requests_table = table;
        objects.extend(objs);
        let best = |k| crate::requests::best_rate(req, k);
        targets.push(Target {
            what: "requests/s at added P99 <= 1 ms >= nginx's".to_owned(),
            goodput: format!("{} req/s", f(best(PathKind::Goodput), 0)),
            nginx: format!("{} req/s", f(best(PathKind::Nginx), 0)),
            met: best(PathKind::Goodput)
                .zip(best(PathKind::Nginx))
                .map(|(g, n)| g >= n),
        });
    }
    if let Some(mem) = &r.memory {
        memory_rows(&mut t, &mut objects, &mut targets, mem);
    }
    if let Some(st) = &r.streams {
        streams_rows(&mut t, &mut objects, &mut targets, st);
    }
    accuracy_rows(&mut t, &mut objects, &mut targets, &r.latency);
    t.0.push_str(&requests_table);
    if let Some(sh) = &r.shadow {
        t.0.push_str(&sh.table);
        objects.push(sh.json.clone());
    }
    let _ = writeln!(t.0, "\ntargets (2 cores, ratios from this run)");
    for tg in &targets {
        let verdict = match tg.met {
            Some(true) => "met",
            Some(false) => "NOT MET",
            None => "n/a",
        };
        let _ = writeln!(
            t.0,
            "  [{verdict:^7}] {:<52} goodput {}  nginx {}",
            tg.what, tg.goodput, tg.nginx
        );
    }
    let json = json!({
        "benchmark": "goodput load",
        "mode": if env.quick { "quick" } else { "full" },
        "rounds": env.rounds,
        "clients_ask_usage": env.usage,
        "machine": machine(env, r),
        "results": objects,
        "targets": targets.iter().map(|tg| json!({
            "target": tg.what, "goodput": tg.goodput, "nginx": tg.nginx, "met": tg.met,
        })).collect::<Vec<_>>(),
    });
    (t.0, json)
}

fn latency_rows(
    t: &mut Table,
    objects: &mut Vec<Value>,
    targets: &mut Vec<Target>,
    l: &LatencyOut,
) {
    let scenario = format!("latency_{}", l.concurrency);
    let q = |k: PathKind, p: f64| l.paths.get(&k).and_then(|x| quantile(&x.event_us, p));
    let tq = |k: PathKind, p: f64| l.paths.get(&k).and_then(|x| quantile(&x.timetable_us, p));
    let added = |k: PathKind, p: f64| q(k, p).zip(q(PathKind::Direct, p)).map(|(a, d)| a - d);
    let added_t = |k: PathKind, p: f64| tq(k, p).zip(tq(PathKind::Direct, p)).map(|(a, d)| a - d);
    // Per round: the path's median minus direct's median of the same round.
    let round_added = |k: PathKind| -> Vec<f64> {
        let (Some(p), Some(d)) = (l.paths.get(&k), l.paths.get(&PathKind::Direct)) else {
            return Vec::new();
        };
        p.round_p50_us
            .iter()
            .zip(&d.round_p50_us)
            .map(|(a, b)| a - b)
            .collect()
    };
    let round_ratio: Vec<f64> = round_added(PathKind::Goodput)
        .iter()
        .zip(round_added(PathKind::Nginx))
        .filter(|(_, n)| *n != 0.0)
        .map(|(g, n)| g / n)
        .collect();
    let label = format!("latency {}", l.concurrency);
    let cell = |k: PathKind| pair(q(k, 0.5), q(k, 0.99), 0);
    let g = PathKind::Goodput;
    let n = PathKind::Nginx;
    let d = PathKind::Direct;
    t.row([
        &label,
        "event latency P50 / P99 (us)",
        &cell(d),
        &cell(n),
        &cell(g),
        &pair(
            ratio(q(g, 0.5), q(d, 0.5)),
            ratio(q(g, 0.99), q(d, 0.99)),
            2,
        ),
        &pair(
            ratio(q(g, 0.5), q(n, 0.5)),
            ratio(q(g, 0.99), q(n, 0.99)),
            2,
        ),
    ]);
    t.row([
        "",
        "added per event P50 / P99 (us)",
        "-",
        &pair(added(n, 0.5), added(n, 0.99), 0),
        &pair(added(g, 0.5), added(g, 0.99), 0),
        "",
        &pair(
            ratio(added(g, 0.5), added(n, 0.5)),
            ratio(added(g, 0.99), added(n, 0.99)),
            2,
        ),
    ]);
    t.row([
        "",
        "added P50 per round, spread (us)",
        "",
        &range(spread(&round_added(n)), 0),
        &range(spread(&round_added(g)), 0),
        "",
        &range(spread(&round_ratio), 2),
    ]);
    t.row([
        "",
        "vs timetable, all events P50 / P99",
        &pair(tq(d, 0.5), tq(d, 0.99), 0),
        &pair(tq(n, 0.5), tq(n, 0.99), 0),
        &pair(tq(g, 0.5), tq(g, 0.99), 0),
        &pair(
            ratio(tq(g, 0.5), tq(d, 0.5)),
            ratio(tq(g, 0.99), tq(d, 0.99)),
            2,
        ),
        &pair(ratio(added_t(g, 0.5), added_t(n, 0.5)), None, 2),
    ]);
    let samples: Vec<String> = PathKind::ALL
        .iter()
        .map(|k| {
            l.paths.get(k).map_or_else(String::new, |p| {
                format!(
                    "{} {} streams, {} events, {} failed",
                    k.name(),
                    p.streams,
                    p.event_us.len(),
                    p.failed
                )
            })
        })
        .collect();
    t.note(&samples.join("; "));
    for k in PathKind::ALL {
        let Some(p) = l.paths.get(&k) else { continue };
        let is_g = k == g;
        objects.push(json!({
            "scenario": scenario,
            "path": k.name(),
            "streams_at_once": l.concurrency,
            "events_per_stream": latency::TOKENS,
            "event_interval_ms": latency::ITL_MS,
            "streams": p.streams,
            "failed_streams": p.failed,
            "event_samples": p.event_us.len(),
            "event_latency_us": { "p50": q(k, 0.5), "p99": q(k, 0.99) },
            "added_latency_us": if k == d { Value::Null } else {
                json!({ "p50": added(k, 0.5), "p99": added(k, 0.99),
                        "p50_per_round": round_added(k) })
            },
            "timetable_latency_us": { "p50": tq(k, 0.5), "p99": tq(k, 0.99),
                                      "samples": p.timetable_us.len() },
            "ratio_to_direct": if k == d { Value::Null } else {
                json!({ "event_latency_p50": ratio(q(k, 0.5), q(d, 0.5)),
                        "event_latency_p99": ratio(q(k, 0.99), q(d, 0.99)) })
            },
            "ratio_to_nginx": if is_g {
                json!({ "added_latency_p50": ratio(added(g, 0.5), added(n, 0.5)),
                        "added_latency_p99": ratio(added(g, 0.99), added(n, 0.99)),
                        "added_latency_p50_per_round": round_ratio,
                        "event_latency_p50": ratio(q(g, 0.5), q(n, 0.5)) })
            } else { Value::Null },
        }));
    }
    targets.push(Target {
        what: format!(
            "added P50 latency per event <= nginx's ({} at once)",
            l.concurrency
        ),
        goodput: format!("{} us", f(added(g, 0.5), 0)),
        nginx: format!("{} us", f(added(n, 0.5), 0)),
        // Within 5 us counts as equal: below what one run can tell apart.
        met: added(g, 0.5).zip(added(n, 0.5)).map(|(a, b)| a <= b + 5.0),
    });
}

fn throughput_rows(
    t: &mut Table,
    objects: &mut Vec<Value>,
    targets: &mut Vec<Target>,
    thr: &BTreeMap<PathKind, Vec<ThrRound>>,
) {
    let col = |k: PathKind, get: &dyn Fn(&ThrRound) -> Option<f64>| -> Vec<f64> {
        thr.get(&k)
            .map(|v| v.iter().filter_map(get).collect())
            .unwrap_or_default()
    };
    let eps = |k| col(k, &|r| Some(r.events_per_s));
    let cpu = |k| col(k, &|r| r.proxy_cpu_s_per_m);
    let per_round = |a: Vec<f64>, b: Vec<f64>| -> Vec<f64> {
        a.iter()
            .zip(b)
            .filter(|(_, b)| *b != 0.0)
            .map(|(a, b)| a / b)
            .collect()
    };
    let (g, n, d) = (PathKind::Goodput, PathKind::Nginx, PathKind::Direct);
    let label = format!("throughput {}", throughput::STREAMS);
    let m = |v: Vec<f64>| median(&v);
    t.row([
        &label,
        "events/s (median of rounds)",
        &f(m(eps(d)), 0),
        &f(m(eps(n)), 0),
        &f(m(eps(g)), 0),
        &f(ratio(m(eps(g)), m(eps(d))), 2),
        &f(ratio(m(eps(g)), m(eps(n))), 2),
    ]);
    t.row([
        "",
        "  spread over rounds",
        &range(spread(&eps(d)), 0),
        &range(spread(&eps(n)), 0),
        &range(spread(&eps(g)), 0),
        &range(spread(&per_round(eps(g), eps(d))), 2),
        &range(spread(&per_round(eps(g), eps(n))), 2),
    ]);
    t.row([
        "",
        "proxy CPU s per million events",
        "-",
        &f(m(cpu(n)), 2),
        &f(m(cpu(g)), 2),
        "",
        &f(ratio(m(cpu(g)), m(cpu(n))), 2),
    ]);
    t.row([
        "",
        "  spread over rounds",
        "",
        &range(spread(&cpu(n)), 2),
        &range(spread(&cpu(g)), 2),
        "",
        &range(spread(&per_round(cpu(g), cpu(n))), 2),
    ]);
    let wr = |k| col(k, &|r| r.proxy_writes_per_k);
    t.row([
        "",
        "proxy write syscalls per 1k events",
        "-",
        &f(m(wr(n)), 0),
        &f(m(wr(g)), 0),
        "",
        &f(ratio(m(wr(g)), m(wr(n))), 2),
    ]);
    let sys = |k| col(k, &|r| r.proxy_syscalls_per_k);
    t.row([
        "",
        "proxy system calls per 1k events (perf)",
        "-",
        &f(m(sys(n)), 0),
        &f(m(sys(g)), 0),
        "",
        &f(ratio(m(sys(g)), m(sys(n))), 2),
    ]);
    let pct = |k, get: &dyn Fn(&ThrRound) -> Option<f64>| f(m(col(k, get)), 0);
    t.row([
        "",
        "CPU % proxy / client / sim / machine",
        &format!(
            "- / {} / {} / {}",
            pct(d, &|r| Some(r.client_cpu_pct)),
            pct(d, &|r| Some(r.sim_cpu_pct)),
            pct(d, &|r| Some(r.machine_busy_pct))
        ),
        &format!(
            "{} / {} / {} / {}",
            pct(n, &|r| r.proxy_cpu_pct),
            pct(n, &|r| Some(r.client_cpu_pct)),
            pct(n, &|r| Some(r.sim_cpu_pct)),
            pct(n, &|r| Some(r.machine_busy_pct))
        ),
        &format!(
            "{} / {} / {} / {}",
            pct(g, &|r| r.proxy_cpu_pct),
            pct(g, &|r| Some(r.client_cpu_pct)),
            pct(g, &|r| Some(r.sim_cpu_pct)),
            pct(g, &|r| Some(r.machine_busy_pct))
        ),
        "",
        "",
    ]);
    t.note("(CPU %: of one core; machine: of all cores)");
    for k in PathKind::ALL {
        let Some(rounds) = thr.get(&k) else { continue };
        let client_pct = m(col(k, &|r| Some(r.client_cpu_pct)));
        objects.push(json!({
            "scenario": "throughput",
            "path": k.name(),
            "streams_at_once": throughput::STREAMS,
            "events_per_stream": throughput::TOKENS,
            "events_per_s": m(eps(k)),
            "events_per_s_per_round": eps(k),
            "proxy_cpu_s_per_million_events": m(cpu(k)),
            "proxy_cpu_s_per_million_events_per_round": cpu(k),
            "proxy_cpu_percent": m(col(k, &|r| r.proxy_cpu_pct)),
            "proxy_write_syscalls_per_1k_events": m(wr(k)),
            "proxy_syscalls_per_1k_events": m(sys(k)),
            "client_cpu_percent": client_pct,
            "sim_cpu_percent": m(col(k, &|r| Some(r.sim_cpu_pct))),
            "machine_busy_percent": m(col(k, &|r| Some(r.machine_busy_pct))),
            "failed_streams": rounds.iter().map(|r| r.failed_streams).sum::<u64>(),
            "ratio_to_direct": if k == d { Value::Null } else {
                json!({ "events_per_s": ratio(m(eps(k)), m(eps(d))),
                        "events_per_s_per_round": per_round(eps(k), eps(d)) })
            },
            "ratio_to_nginx": if k == g {
                json!({ "events_per_s": ratio(m(eps(g)), m(eps(n))),
                        "events_per_s_per_round": per_round(eps(g), eps(n)),
                        "proxy_cpu_per_event": ratio(m(cpu(g)), m(cpu(n))),
                        "proxy_cpu_per_event_per_round": per_round(cpu(g), cpu(n)) })
            } else { Value::Null },
        }));
    }
    targets.push(Target {
        what: "throughput >= nginx's events/s".to_owned(),
        goodput: format!("{} ev/s", f(m(eps(g)), 0)),
        nginx: format!("{} ev/s", f(m(eps(n)), 0)),
        met: m(eps(g)).zip(m(eps(n))).map(|(a, b)| a >= b),
    });
    targets.push(Target {
        what: "... at equal or lower CPU per event".to_owned(),
        goodput: format!("{} s/M", f(m(cpu(g)), 2)),
        nginx: format!("{} s/M", f(m(cpu(n)), 2)),
        met: m(cpu(g)).zip(m(cpu(n))).map(|(a, b)| a <= b),
    });
}

fn memory_rows(
    t: &mut Table,
    objects: &mut Vec<Value>,
    targets: &mut Vec<Target>,
    mem: &BTreeMap<PathKind, Vec<MemRound>>,
) {
    let kib = |k: PathKind| -> Vec<f64> {
        mem.get(&k)
            .map(|v| v.iter().map(|r| r.per_stream_bytes / 1024.0).collect())
            .unwrap_or_default()
    };
    let (g, n) = (PathKind::Goodput, PathKind::Nginx);
    let label = format!("memory {}", memory::STREAMS);
    t.row([
        &label,
        "RSS per idle stream (KiB)",
        "-",
        &f(median(&kib(n)), 1),
        &f(median(&kib(g)), 1),
        "",
        &f(ratio(median(&kib(g)), median(&kib(n))), 2),
    ]);
    t.row([
        "",
        "  spread over rounds",
        "",
        &range(spread(&kib(n)), 1),
        &range(spread(&kib(g)), 1),
        "",
        "",
    ]);
    for k in PathKind::ALL {
        let rounds = mem.get(&k);
        objects.push(json!({
            "scenario": "memory",
            "path": k.name(),
            "idle_streams": memory::STREAMS,
            "rss_per_stream_kib": rounds.and_then(|_| median(&kib(k))),
            "rss_per_stream_kib_per_round": kib(k),
            "rss_baseline_mib": rounds.and_then(|v| v.first()).map(|r| r.baseline_bytes as f64 / 1048576.0),
            "streams_opened": rounds.map(|v| v.iter().map(|r| r.opened).collect::<Vec<_>>()),
            "note": if k == PathKind::Direct { Value::from("no proxy process on this path") } else { Value::Null },
            "ratio_to_nginx": if k == g {
                json!({ "rss_per_stream": ratio(median(&kib(g)), median(&kib(n))) })
            } else { Value::Null },
        }));
    }
    targets.push(Target {
        what: "RSS per idle stream <= 32 KiB".to_owned(),
        goodput: format!("{} KiB", f(median(&kib(g)), 1)),
        nginx: format!("{} KiB", f(median(&kib(n)), 1)),
        met: median(&kib(g)).map(|v| v <= 32.0),
    });
}

fn streams_rows(
    t: &mut Table,
    objects: &mut Vec<Value>,
    targets: &mut Vec<Target>,
    st: &crate::streams::StreamsOut,
) {
    use crate::streams::{self, StreamsRun};
    let (d, n, g) = (PathKind::Direct, PathKind::Nginx, PathKind::Goodput);
    let get = |k: PathKind, f: &dyn Fn(&StreamsRun) -> Option<f64>| st.get(&k).and_then(f);
    // The scenario's name on its first row only.
    let mut label = streams::NAME;
    let mut row = |figure: &str, digits: usize, of: &dyn Fn(&StreamsRun) -> Option<f64>| {
        let (vd, vn, vg) = (get(d, of), get(n, of), get(g, of));
        t.row([
            std::mem::take(&mut label),
            figure,
            &f(vd, digits),
            &f(vn, digits),
            &f(vg, digits),
            &f(ratio(vg, vd), 2),
            &f(ratio(vg, vn), 2),
        ]);
    };
    let mib = |b: u64| b as f64 / 1_048_576.0;
    row("streams open", 0, &|r| Some(r.opened as f64));
    row("event transit P50 (ms)", 3, &|r| r.transit_ms(0.5));
    row("event transit P99 (ms)", 3, &|r| r.transit_ms(0.99));
    row("events/s", 0, &StreamsRun::events_per_s);
    row(
        "RSS per active stream (KiB)",
        1,
        &StreamsRun::rss_per_stream_kib,
    );
    row("RSS with the streams (MiB)", 1, &|r| {
        r.proxy.map(|p| mib(p.loaded_bytes))
    });
    row("RSS after they closed (MiB)", 1, &|r| {
        r.proxy.map(|p| mib(p.after_close_bytes))
    });
    row("RSS before them (MiB)", 1, &|r| {
        r.proxy.map(|p| mib(p.baseline_bytes))
    });
    row("proxy CPU per event (us)", 1, &StreamsRun::cpu_us_per_event);
    row("proxy CPU (cores)", 2, &StreamsRun::cpu_cores);
    let failed: Vec<String> = st
        .iter()
        .map(|(k, r)| format!("{} {}", k.name(), r.failed))
        .collect();
    t.note(&format!("failed streams: {}", failed.join(", ")));
    let per_stream = |k| get(k, &StreamsRun::rss_per_stream_kib);
    for (k, r) in st {
        let p99 = r.transit_ms(0.99);
        objects.push(json!({
            "scenario": streams::NAME,
            "path": k.name(),
            "streams_opened": r.opened,
            "streams_failed": r.failed,
            "event_interval_ms": streams::ITL_MS,
            "window_s": r.window_s,
            "events": r.events,
            "events_per_s": r.events_per_s(),
            "event_transit_ms": {
                "count": r.transit_us.len(),
                "p50": r.transit_ms(0.5),
                "p99": p99,
                "max": r.transit_ms(1.0),
            },
            "added_transit_p99_ms": (*k != d)
                .then(|| p99.zip(get(d, &|r| r.transit_ms(0.99))).map(|(a, b)| a - b))
                .flatten(),
            "rss_per_stream_kib": r.rss_per_stream_kib(),
            "rss_baseline_mib": r.proxy.map(|p| mib(p.baseline_bytes)),
            "rss_loaded_mib": r.proxy.map(|p| mib(p.loaded_bytes)),
            "rss_after_close_mib": r.proxy.map(|p| mib(p.after_close_bytes)),
            "proxy_cpu_us_per_event": r.cpu_us_per_event(),
            "proxy_cpu_cores": r.cpu_cores(),
            "note": if *k == d { Value::from("no proxy process on this path") } else { Value::Null },
            "ratio_to_nginx": if *k == g {
                json!({
                    "rss_per_stream": ratio(per_stream(g), per_stream(n)),
                    "cpu_per_event": ratio(get(g, &StreamsRun::cpu_us_per_event), get(n, &StreamsRun::cpu_us_per_event)),
                    "event_transit_p99": ratio(p99, get(n, &|r| r.transit_ms(0.99))),
                })
            } else { Value::Null },
        }));
    }
    targets.push(Target {
        what: "RSS per active stream <= 2x nginx's".to_owned(),
        goodput: format!("{} KiB", f(per_stream(g), 1)),
        nginx: format!("{} KiB", f(per_stream(n), 1)),
        met: per_stream(g).zip(per_stream(n)).map(|(g, n)| g <= 2.0 * n),
    });
}

fn accuracy_rows(
    t: &mut Table,
    objects: &mut Vec<Value>,
    targets: &mut Vec<Target>,
    latency: &[LatencyOut],
) {
    if latency.is_empty() {
        return;
    }
    let all: Vec<f64> = latency
        .iter()
        .flat_map(|l| l.ttft_diff_ms.iter().copied())
        .collect();
    let abs: Vec<f64> = all.iter().map(|v| v.abs()).collect();
    let unmatched: usize = latency.iter().map(|l| l.unmatched).sum();
    t.row([
        "accuracy",
        "client - recorded TTFT P50 / P99 (ms)",
        "-",
        "-",
        &pair(quantile(&all, 0.5), quantile(&all, 0.99), 3),
        "",
        "",
    ]);
    let by: Vec<String> = latency
        .iter()
        .map(|l| {
            format!(
                "{} at once: {} ({} requests)",
                l.concurrency,
                pair(
                    quantile(&l.ttft_diff_ms, 0.5),
                    quantile(&l.ttft_diff_ms, 0.99),
                    3
                ),
                l.ttft_diff_ms.len()
            )
        })
        .collect();
    t.note(&format!("{}; {unmatched} without a record", by.join("; ")));
    for k in PathKind::ALL {
        let g = k == PathKind::Goodput;
        objects.push(json!({
            "scenario": "accuracy",
            "path": k.name(),
            "requests": if g { Value::from(all.len()) } else { Value::Null },
            "unmatched": if g { Value::from(unmatched) } else { Value::Null },
            "ttft_difference_ms": if g {
                json!({ "p50": quantile(&all, 0.5), "p99": quantile(&all, 0.99),
                        "abs_p99": quantile(&abs, 0.99),
                        "by_streams_at_once": latency.iter().map(|l| json!({
                            "streams_at_once": l.concurrency,
                            "p50": quantile(&l.ttft_diff_ms, 0.5),
                            "p99": quantile(&l.ttft_diff_ms, 0.99),
                            "requests": l.ttft_diff_ms.len(),
                        })).collect::<Vec<_>>() })
            } else { Value::Null },
            "note": if g { Value::from("client TTFT minus goodput's recorded TTFT, per request") }
                    else { Value::from("this path records no TTFT") },
            "ratio_to_direct": Value::Null,
            "ratio_to_nginx": Value::Null,
        }));
    }
    targets.push(Target {
        what: "proxy-vs-client TTFT difference P99 <= 1 ms".to_owned(),
        goodput: format!("{} ms", f(quantile(&abs, 0.99), 3)),
        nginx: "-".to_owned(),
        met: quantile(&abs, 0.99).map(|v| v <= 1.0),
    });
}
