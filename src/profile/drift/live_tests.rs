//! The live monitor: quiet on a resample, fires on a shift after `fire_after`
//! evaluations, clears after `clear_after`; metrics, snapshot and webhook.

use std::time::{Duration, Instant};

use rand::{SeedableRng, rngs::SmallRng};

use super::{window::PANES, *};
use crate::{
    config::DriftConfig,
    profile::{Anonymizer, Contract, Profile, ProfileLine, shape::samples_of, stats},
    sim::Dist,
};

/// `n` requests `gap_ms` apart from `start_ms`, output lengths log-normal around
/// `output_median`, prompts sharing a system prefix.
pub(crate) fn synthetic(
    seed: u64,
    n: usize,
    output_median: f64,
    start_ms: i64,
    gap_ms: i64,
) -> Vec<ProfileLine> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let input = Dist::LogNormal {
        median: 600.0,
        sigma: 0.6,
    };
    let output = Dist::LogNormal {
        median: output_median,
        sigma: 0.4,
    };
    let anon = Anonymizer::from_salt(b"test-salt-0123456789", 64, true, Vec::new());
    (0..n)
        .map(|i| {
            let prompt = format!(
                r#"{{"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"q{}"}}]}}"#,
                "shared system prompt ".repeat(8),
                rand::Rng::random::<u32>(&mut rng)
            );
            ProfileLine {
                arrival_ms: start_ms + i as i64 * gap_ms,
                model: Some("llama".into()),
                api: "chat_completions".into(),
                stream: true,
                input_tokens: Some(u64::from(input.sample_count(&mut rng).max(1))),
                input_tokens_source: Some("usage"),
                output_tokens: Some(u64::from(output.sample_count(&mut rng).max(1))),
                output_tokens_source: Some("usage"),
                max_tokens: Some(1024),
                outcome: "ok",
                status: Some(200),
                slo_class: "default".into(),
                slo_met: Some(true),
                ttft_ms: Some(100.0),
                tpot_ms: Some(20.0),
                e2e_ms: 2000.0,
                tenant: None,
                block_hashes: anon.blocks(crate::decode::Api::ChatCompletions, Some("llama"), prompt.as_bytes()),
            }
        })
        .collect()
}

pub(crate) fn profile_of(lines: &[ProfileLine]) -> Profile {
    let anon = Anonymizer::from_salt(b"test-salt-0123456789", 64, true, Vec::new());
    let start = lines.first().map_or(0, |l| l.arrival_ms);
    let header = anon.header(crate::profile::from_unix_ms(start), &Contract::default());
    let mut text = Vec::new();
    write_profile(&mut text, &header, lines).unwrap();
    let mut p = Profile::default();
    p.add(std::path::Path::new("mem.jsonl"), text.as_slice())
        .unwrap();
    p
}

fn config() -> DriftConfig {
    let mut cfg = DriftConfig::with_defaults(std::path::PathBuf::new());
    cfg.window = Duration::from_secs(600);
    cfg
}

/// Feeds `lines` (one every `gap_ms`) starting at `t0 + offset`, evaluating every minute.
fn run(m: &mut Monitor, lines: &[ProfileLine], t0: Instant, gap_ms: u64) -> Vec<DriftStatus> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let at = t0 + Duration::from_millis(i as u64 * gap_ms);
        m.observe(l, at);
        if (i as u64 * gap_ms).is_multiple_of(60_000) && i > 0 {
            out.push(m.evaluate(at));
        }
    }
    out
}

#[test]
fn quiet_on_a_resample_fires_on_a_shift_and_clears() {
    let base = profile_of(&synthetic(1, 3000, 180.0, 0, 200));
    let mut m = Monitor::new(&config(), &base);
    let t0 = Instant::now();
    // Same distribution, another seed: 10 minutes of evaluations, nothing fires.
    let same = synthetic(2, 3000, 180.0, 0, 200);
    let statuses = run(&mut m, &same, t0, 200);
    assert!(
        statuses
            .iter()
            .all(|s| s.transitions.is_empty() && !s.drifted),
        "{:#?}",
        statuses.last()
    );
    let last = statuses.last().unwrap();
    assert!(
        last.dimensions.iter().all(|d| d.stat.value.is_some()),
        "{last:#?}"
    );
    // Output lengths more than double: fires on the third evaluation over threshold.
    let shifted = synthetic(3, 6000, 410.0, 600_000, 200);
    let t1 = t0 + Duration::from_secs(600);
    let statuses = run(&mut m, &shifted, t1, 200);
    let fired: Vec<usize> = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| s.transitions.iter().any(|t| t.dimension == "output_length"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(fired.len(), 1, "fires once");
    let at = &statuses[fired[0]];
    let over_before = statuses[..fired[0]]
        .iter()
        .filter(|s| {
            s.dimensions
                .iter()
                .any(|d| d.stat.name == "output_length" && d.stat.drifted)
        })
        .count();
    assert_eq!(
        over_before, 2,
        "two evaluations over threshold before firing"
    );
    let t = at
        .transitions
        .iter()
        .find(|t| t.dimension == "output_length")
        .unwrap();
    assert_eq!(t.kind, TransitionKind::Fired);
    assert!(
        t.explanation.starts_with("output length P50 "),
        "{}",
        t.explanation
    );
    assert!(at.fired() && at.active.contains(&"output_length"));
    assert!(!at.active.contains(&"input_length"), "{:?}", at.active);
    // Back to the baseline shape: clears once five evaluations in a row are quiet.
    let back = synthetic(4, 6000, 180.0, 1_800_000, 200);
    let statuses = run(&mut m, &back, t1 + Duration::from_secs(1200), 200);
    let cleared = statuses
        .iter()
        .position(|s| {
            s.transitions
                .iter()
                .any(|t| t.kind == TransitionKind::Cleared)
        })
        .unwrap();
    assert!(cleared >= 4, "{cleared}");
    assert!(!statuses.last().unwrap().drifted);
}

#[test]
fn too_few_requests_never_fire() {
    let base = profile_of(&synthetic(1, 1000, 180.0, 0, 200));
    let mut m = Monitor::new(&config(), &base);
    let t0 = Instant::now();
    let shifted = synthetic(3, 100, 5000.0, 0, 200);
    for (i, l) in shifted.iter().enumerate() {
        m.observe(l, t0 + Duration::from_millis(i as u64 * 200));
    }
    for k in 0..10 {
        let s = m.evaluate(t0 + Duration::from_secs(20 + k));
        assert!(s.transitions.is_empty() && s.dimensions.iter().all(|d| d.stat.value.is_none()));
    }
    assert_eq!(m.status().evaluations, 10);
}

#[test]
fn the_window_is_bounded_and_reuse_is_seen() {
    let base = profile_of(&synthetic(1, 500, 180.0, 0, 200));
    let mut cfg = config();
    cfg.window_max_requests = 300;
    cfg.min_samples = 100;
    let mut m = Monitor::new(&cfg, &base);
    let t0 = Instant::now();
    for (i, l) in synthetic(2, 1000, 180.0, 0, 10).iter().enumerate() {
        m.observe(l, t0 + Duration::from_millis(i as u64 * 10));
    }
    assert_eq!(m.window_lines().count(), 300);
    let s = m.evaluate(t0 + Duration::from_secs(10));
    // The snapshot keeps the newest 300; the statistics count every request.
    assert_eq!(s.live_requests, 1000);
    assert_eq!(m.window_lines().count(), 300);
    let reuse = s
        .dimensions
        .iter()
        .find(|d| d.stat.name == "prefix_reuse")
        .unwrap();
    assert!(reuse.stat.value.unwrap() < 0.2, "{reuse:?}");
    assert!(
        reuse.stat.explanation.starts_with("prefix reuse 0."),
        "{}",
        reuse.stat.explanation
    );
}

#[test]
fn metrics_and_snapshot() {
    let base = profile_of(&synthetic(1, 1000, 180.0, 0, 200));
    let mut m = Monitor::new(&config(), &base);
    let t0 = Instant::now();
    let statuses = run(&mut m, &synthetic(3, 3000, 900.0, 0, 200), t0, 200);
    assert!(statuses.last().unwrap().drifted);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = crate::profile::ProfileMetrics::register(&mut registry);
    statuses.last().unwrap().publish(&metrics);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("goodput_reacceptance_required{dimension=\"output_length\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("goodput_reacceptance_required{dimension=\"input_length\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("goodput_profile_drift{dimension=\"output_length\",statistic=\"psi\"}"),
        "{text}"
    );
    let dir = std::env::temp_dir().join(format!("goodput-snap-{}", std::process::id()));
    let anon = Anonymizer::from_salt(b"test-salt-0123456789", 64, true, Vec::new());
    let header = anon.header(std::time::SystemTime::now(), &Contract::default());
    let path = write_snapshot(&dir, &header, m.window_lines()).unwrap();
    let again = write_snapshot(&dir, &header, m.window_lines()).unwrap();
    assert_ne!(path, again);
    let snap = Profile::read(&[path]).unwrap();
    assert_eq!(snap.entries.len(), m.window_lines().count());
    assert!(snap.entries.iter().all(|e| e.entry.hash_ids.is_some()));
    std::fs::remove_dir_all(&dir).ok();
    let json = serde_json::to_value(m.status()).unwrap();
    assert_eq!(json["drifted"], true);
    assert!(
        json["dimensions"][0].get("name").is_some()
            && json["dimensions"][0].get("threshold").is_some()
    );
}

/// The window's summaries against the exact computation over the same requests:
/// everything equal except what binning lengths costs, within its stated bound.
#[test]
fn the_summaries_give_what_every_request_gives() {
    use crate::profile::{
        shape::Sample,
        stats::{ks, psi},
    };
    let window = Duration::from_secs(600);
    let pane_ms = 10_000; // window / PANES
    // 800 s of traffic, so the window slides; lengths up to a few thousand tokens.
    let mut lines = synthetic(2, 4000, 300.0, 0, 200);
    for (i, l) in lines.iter_mut().enumerate() {
        if i % 3 == 0 {
            l.model = Some("qwen".into());
        }
        if i % 5 == 0 {
            l.api = "completions".into();
            l.outcome = "client_abort";
        }
        l.e2e_ms = 500.0 + (i % 17) as f64 * 100.0;
        // Prompts seen again 3020 requests (60.4 panes) later: some within the window
        // as it was then, some just out of it.
        if i % 4 == 0 {
            let k = (i % 3020) as u64;
            l.block_hashes = vec![0xb10c_0000 + k, 0xb10d_0000 + k];
        }
        // Arrivals out of finish order.
        l.arrival_ms -= (i % 7) as i64 * 150;
    }
    let t0 = Instant::now();
    let mut w = Window::new(window);
    let finish = |i: usize| i as u64 * 200;
    for (i, l) in lines.iter().enumerate() {
        assert!(
            w.observe(l, t0 + Duration::from_millis(finish(i)))
                .is_some()
        );
    }
    let now = t0 + Duration::from_millis(finish(lines.len() - 1));
    let (live, covered) = w.shape(now);
    // The exact computation: every request of the panes still in the window, each block
    // reused when an earlier request of the window (as it was then) had it.
    let pane = |i: usize| finish(i) / pane_ms;
    let oldest = pane(lines.len() - 1) - PANES;
    let mut last_seen: std::collections::HashMap<u64, u64> = Default::default();
    let mut samples = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let reused = l
            .block_hashes
            .iter()
            .filter(|h| last_seen.get(h).is_some_and(|p| *p + PANES >= pane(i)))
            .count();
        for h in &l.block_hashes {
            last_seen.insert(*h, pane(i));
        }
        if pane(i) >= oldest {
            samples.push(Sample {
                at_ms: l.arrival_ms,
                model: l.model.clone().unwrap(),
                api: l.api.clone(),
                stream: l.stream,
                input: l.input_tokens,
                output: l.output_tokens,
                e2e_ms: l.e2e_ms,
                blocks: l.block_hashes.len() as u32,
                reused: reused as u32,
                outcome: l.outcome.into(),
                slo_met: l.slo_met,
            });
        }
    }
    assert_eq!(
        covered,
        Duration::from_millis(finish(lines.len() - 1) - oldest * pane_ms)
    );
    let exact = Shape::of(&samples, Some(covered.as_secs_f64()));
    assert_eq!(live.requests, samples.len());
    assert!(live.requests > 3000 && live.requests < 4000);
    for (got, want) in [
        (live.rate_mean, exact.rate_mean),
        (live.stream_share, exact.stream_share),
        (live.burstiness.unwrap(), exact.burstiness.unwrap()),
        (live.prefix_reuse.unwrap(), exact.prefix_reuse.unwrap()),
        (live.duration_s, exact.duration_s),
    ] {
        assert_eq!(got, want);
    }
    assert!(exact.prefix_reuse.unwrap() > 0.1, "{exact:?}");
    let (c, e) = (live.concurrency.unwrap(), exact.concurrency.unwrap());
    assert!((c - e).abs() <= 1e-9 * e, "{c} {e}");
    assert_eq!(live.rate_peak, exact.rate_peak);
    assert_eq!(
        (&live.models, &live.apis, &live.outcomes),
        (&exact.models, &exact.apis, &exact.outcomes)
    );
    assert_eq!(
        (live.slo_met, live.slo_missed),
        (exact.slo_met, exact.slo_missed)
    );
    // Lengths: the binned counts of the exact ones; PSI equal, KS and percentiles within
    // their bounds, against a baseline binned the same way.
    let base = Shape::of(
        &samples_of(&profile_of(&synthetic(1, 3000, 180.0, 0, 200))),
        None,
    );
    assert!(
        exact.input.max().unwrap() > 2000.0,
        "lengths past the exact range"
    );
    for (l, x, b) in [
        (&live.input, &exact.input, &base.input),
        (&live.output, &exact.output, &base.output),
    ] {
        assert_eq!(*l, binned(x));
        assert_eq!(psi(&binned(b), l), psi(b, x));
        let widest = |c: &stats::Counts| {
            binned(c).iter().map(|(_, k)| k).max().unwrap() as f64 / c.len() as f64
        };
        let bound = widest(b).max(widest(x));
        let (got, want) = (ks(&binned(b), l).unwrap(), ks(b, x).unwrap());
        assert!(
            got <= want && want - got <= bound,
            "KS {got} {want} ± {bound}"
        );
        for q in [0.5, 0.9, 0.99] {
            let (got, want) = (l.percentile(q).unwrap(), x.percentile(q).unwrap());
            assert!(
                got <= want && want - got <= want / 128.0,
                "P{q} {got} {want}"
            );
        }
    }
}

/// Four times the requests in the window: the summaries hold the same bytes.
#[test]
fn the_summaries_do_not_grow_with_the_requests_in_the_window() {
    let template = synthetic(5, 64, 180.0, 0, 1);
    let bytes = |per_ms: u64| {
        let mut w = Window::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let mut n = 0u64;
        // Two windows' worth at `per_ms` requests a millisecond, each with blocks of
        // its own (so the reuse table fills) and the template's lengths and mix.
        for ms in 0..120_000u64 {
            for k in 0..per_ms {
                let mut l = template[(n % 64) as usize].clone();
                l.arrival_ms = ms as i64;
                l.block_hashes = vec![n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n + 1];
                w.observe(&l, t0 + Duration::from_micros(ms * 1000 + k));
                n += 1;
            }
        }
        let (shape, _) = w.shape(t0 + Duration::from_secs(120));
        (shape.requests, w.heap_bytes())
    };
    let (small, small_bytes) = bytes(1);
    let (large, large_bytes) = bytes(4);
    assert!(small >= 60_000 && large >= 4 * 60_000, "{small} {large}");
    assert_eq!(small_bytes, large_bytes);
    // A request held as a line would cost more than 100 bytes: a fraction of that here.
    assert!(large_bytes < large * 100, "{large_bytes}");
}

/// The monitor's resident memory with `GOODPUT_DRIFT_REQUESTS` (default 2,000,000)
/// requests in a one-hour window, snapshot lines bounded by `GOODPUT_DRIFT_KEEP` (default
/// `window_max_requests`). Reads the process's RSS, so run it alone:
/// `GOODPUT_DRIFT_REQUESTS=10000000 cargo test --lib window_rss -- --ignored --nocapture`.
#[test]
#[ignore = "measures the process's RSS: run alone (docs/PERFORMANCE.md, Live drift window)"]
fn window_rss_does_not_grow_with_requests() {
    let var = |k: &str| std::env::var(k).ok().map(|v| v.parse::<u64>().unwrap());
    let n = var("GOODPUT_DRIFT_REQUESTS").unwrap_or(2_000_000);
    let base = profile_of(&synthetic(1, 300, 180.0, 0, 200));
    let mut cfg = config();
    cfg.window = Duration::from_secs(3600);
    if let Some(k) = var("GOODPUT_DRIFT_KEEP") {
        cfg.window_max_requests = k as usize;
    }
    let mut m = Monitor::new(&cfg, &base);
    let template = synthetic(5, 64, 180.0, 0, 1);
    let kib = |field: &str| -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before = kib("VmRSS:");
    let t0 = Instant::now();
    let gap_ns = 3_600_000_000_000 / n;
    for i in 0..n {
        let mut l = template[(i % 64) as usize].clone();
        l.arrival_ms = (i * gap_ns / 1_000_000) as i64;
        l.block_hashes = vec![i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i + 1];
        m.observe(&l, t0 + Duration::from_nanos(i * gap_ns));
    }
    let s = m.evaluate(t0 + Duration::from_secs(3600));
    let grown = kib("VmHWM:") - before;
    eprintln!(
        "{} requests in the window, {} kept for the snapshot: peak RSS {grown} KiB above the start",
        s.live_requests,
        m.window_lines().count()
    );
    assert_eq!(s.live_requests as u64, n);
    // The window's 17 MiB and the snapshot's 50,000 lines, whatever `n` is.
    assert!(grown < 64 * 1024, "{grown} KiB");
}
