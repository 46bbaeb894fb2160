//! Capacity: a synthetic population whose latency and attainment degrade above
//! concurrency 8, thin levels, lucky high levels, the pooled view.

use super::*;

/// Interactive requests at concurrency 1..=16, 40 each, except level 6 (5, all missed):
/// - c ≤ 8: TTFT 200 ms, all met, 500 tokens in 10 s → throughput c × 50 tokens/s;
/// - c > 8: TTFT 1.5 s, half missed, e2e 10 s × c / 8 → throughput flat at 400 tokens/s;
/// - c = 12: the same slowness but all met (a lucky level);
/// - c = 20: 5 requests, all met (too few samples).
fn population(e: &mut Engine, base: Instant) {
    let mut at = 10.0;
    let mut emit = |e: &mut Engine, c: u32, n: usize, met: &dyn Fn(usize) -> bool| {
        for i in 0..n {
            let slow = c > 8;
            at += 0.1;
            e.observe(&Observation {
                concurrency_at_start: c,
                slo_met: Some(met(i)),
                ttft_ms: Some(if slow { 1500.0 } else { 200.0 }),
                tpot_ms: Some(if slow { 60.0 } else { 20.0 }),
                e2e_ms: if slow {
                    10_000.0 * f64::from(c) / 8.0
                } else {
                    10_000.0
                },
                output_tokens: Some(500),
                ..ob(base, at)
            });
        }
    };
    for c in 1..=16u32 {
        match c {
            6 => emit(e, c, 5, &|_| false),
            12 => emit(e, c, 40, &|_| true),
            9.. => emit(e, c, 40, &|i| i % 2 == 0),
            _ => emit(e, c, 40, &|_| true),
        }
    }
    emit(e, 20, 5, &|_| true);
}

#[test]
fn finds_the_knee_and_max_stable_concurrency_at_8() {
    let (mut e, base) = engine(config());
    population(&mut e, base);
    let now = base + secs(200.0);
    let cap = e.capacity(Some("interactive"), now).unwrap();
    assert_eq!(cap.class, "interactive");
    assert_eq!(cap.attainment_target, Some(0.99));
    assert_eq!(cap.window, "1h");
    assert_eq!(cap.max_stable_concurrency, Some(8));
    assert_eq!(cap.knee, Some(8));
    // The gauges' knee is the curve's, and separate from max stable concurrency.
    let g = e.gauges(now);
    assert!(g.knee_concurrency.contains(&("interactive", Some(8))));
    let overall = e.capacity(None, now).unwrap().knee;
    assert!(g.knee_concurrency.contains(&("overall", overall)));
    let level = |c: u32| cap.levels.iter().find(|l| l.concurrency == c).unwrap();
    assert_close(level(4).throughput_tokens_per_s.unwrap(), 200.0);
    assert_close(level(10).throughput_tokens_per_s.unwrap(), 400.0);
    assert_hdr(level(1).ttft_p95_ms, 200.0);
    assert_hdr(level(10).ttft_p95_ms, 1500.0);
    assert_hdr(level(10).tpot_p95_ms, 60.0);
    assert_eq!(level(10).attainment, Some(0.5));
    let thin = level(6);
    assert_eq!(
        (thin.samples, thin.enough_samples, thin.stable),
        (5, false, false)
    );
    assert!(level(7).stable && level(8).stable);
    assert!(
        !level(9).stable && !level(12).stable,
        "a lucky level above a failing one"
    );
    assert_eq!(level(12).attainment, Some(1.0));
    let range = level(17);
    assert_eq!(
        (range.concurrency_max, range.samples, range.enough_samples),
        (Some(24), 5, false)
    );
    assert_eq!(cap.levels.len(), 17);

    let s = e.summary(MIN, now).unwrap();
    assert_eq!(group(&s, "interactive").max_stable_concurrency, Some(8));
    assert_eq!(s.overall.group.max_stable_concurrency, Some(8));
    assert_eq!(
        e.gauges(now).max_stable_concurrency[0],
        ("interactive", Some(8))
    );
    let cost = s.overall.cost.unwrap();
    assert_close(
        cost.cost_per_stable_user_per_month.unwrap(),
        12.0 * 730.0 / 8.0,
    );
}

#[test]
fn the_knee_follows_throughput_when_latency_holds() {
    // No percentile targets, all met: only the throughput rule decides. Throughput
    // c × 50 up to 4, then +10 per added concurrency (< 25 = half the initial 50).
    let (mut e, base) = engine(EngineConfig {
        classes: vec![class("flat", 0.9, vec![])],
        ..config()
    });
    for c in 1..=8u32 {
        let thr = if c <= 4 {
            50.0 * f64::from(c)
        } else {
            200.0 + 10.0 * f64::from(c - 4)
        };
        for i in 0..20 {
            // tokens per request = throughput × e2e / c with e2e 10 s.
            let tokens = (thr * 10.0 / f64::from(c)).round() as u64;
            e.observe(&Observation {
                class: "flat",
                concurrency_at_start: c,
                e2e_ms: 10_000.0,
                output_tokens: Some(tokens),
                ..ob(base, 10.0 + f64::from(c) + f64::from(i) / 100.0)
            });
        }
    }
    let cap = e.capacity(Some("flat"), base + secs(100.0)).unwrap();
    assert_eq!(cap.knee, Some(4));
    assert_eq!(cap.max_stable_concurrency, Some(8));
    let g = e.gauges(base + secs(100.0));
    assert!(g.knee_concurrency.contains(&("flat", Some(4))), "{g:?}");
    assert!(g.max_stable_concurrency.contains(&("flat", Some(8))));
    assert_eq!(e.capacity(Some(DEFAULT_CLASS), base).unwrap().knee, None);
}

#[test]
fn overall_pools_classes_against_the_traffic_weighted_target() {
    let (mut e, base) = engine(config());
    let mut at = 1.0;
    let mut put = |e: &mut Engine, class: &'static str, c: u32, met: usize, missed: usize| {
        for i in 0..(met + missed) {
            at += 0.01;
            e.observe(&Observation {
                class,
                concurrency_at_start: c,
                slo_met: Some(i < met),
                ..ob(base, at)
            });
        }
    };
    // Level 1: interactive 99/100 (meets 0.99), batch 90/100 (meets 0.9): pooled
    // 189/200 = 0.945 against (100 × 0.99 + 100 × 0.9) / 200 = 0.945: holds.
    put(&mut e, "interactive", 1, 99, 1);
    put(&mut e, "batch", 1, 90, 10);
    // Level 2: interactive 100/100, batch 80/100 (misses 0.9): pooled 0.9 < 0.945.
    put(&mut e, "interactive", 2, 100, 0);
    put(&mut e, "batch", 2, 80, 20);
    let now = base + secs(10.0);
    let cap = |c| e.capacity(c, now).unwrap().max_stable_concurrency;
    assert_eq!(
        (cap(Some("interactive")), cap(Some("batch")), cap(None)),
        (Some(2), Some(1), Some(1))
    );
    let overall = e.capacity(None, now).unwrap();
    assert_eq!(overall.class, "overall");
    assert_close(
        overall.attainment_target.unwrap(),
        (200.0 * 0.99 + 200.0 * 0.9) / 400.0,
    );
    let v = serde_json::to_value(&overall).unwrap();
    for k in ["class", "levels", "max_stable_concurrency", "knee"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    for k in [
        "concurrency",
        "samples",
        "attainment",
        "ttft_p95_ms",
        "tpot_p95_ms",
        "throughput_tokens_per_s",
        "stable",
    ] {
        assert!(v["levels"][0].get(k).is_some(), "missing levels[].{k}");
    }
}

#[test]
fn aborts_have_no_verdict_and_levels_leave_with_the_window() {
    let (mut e, base) = engine(config());
    for i in 0..30 {
        e.observe(&Observation {
            slo_met: None,
            outcome: Outcome::ClientAbort,
            concurrency_at_start: 3,
            ..ob(base, 1.0 + f64::from(i))
        });
    }
    let cap = e.capacity(Some("interactive"), base + secs(60.0)).unwrap();
    assert_eq!((cap.levels[0].requests, cap.levels[0].samples), (30, 0));
    assert_eq!(cap.max_stable_concurrency, None);
    // The capacity window is the longest (1h, 10 min slices): gone after 1h10m.
    let later = e
        .capacity(Some("interactive"), base + secs(4200.0))
        .unwrap();
    assert!(later.levels.is_empty());
}
