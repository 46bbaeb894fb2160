//! Unit tests of [`super`].

use super::*;

fn point(t_s: f64, e2e: (f64, f64), kv: f64, waiting: f64, running: f64) -> Point {
    let c = |sum: f64, count: f64| Some(Cumulative { sum, count });
    Point {
        t_s,
        phases: [
            c(e2e.0 * 0.1, e2e.1),
            c(e2e.0 * 0.3, e2e.1),
            c(e2e.0 * 0.6, e2e.1),
            c(e2e.0, e2e.1),
        ],
        kv_cache_usage: Some(kv),
        requests_waiting: Some(waiting),
        requests_running: Some(running),
        preemptions_total: Some(t_s.floor()),
    }
}

#[test]
fn a_window_takes_deltas_between_its_own_scrapes() {
    let points = [
        point(0.0, (0.0, 0.0), 0.1, 0.0, 2.0),
        point(1.0, (10.0, 10.0), 0.2, 1.0, 4.0),
        point(2.0, (30.0, 20.0), 0.6, 3.0, 4.0),
        point(3.0, (60.0, 30.0), 0.4, 0.0, 4.0),
        point(4.0, (100.0, 40.0), 0.1, 0.0, 2.0),
    ];
    let r = Acc::window(&points, 0.5, 3.5).resources(Some(3500.0));
    assert_eq!(r.scrapes, 3);
    // (60 − 10) s over (30 − 10) requests.
    assert_eq!(r.engine_requests, 20);
    assert!((r.engine_e2e_ms.unwrap() - 2500.0).abs() < 1e-6);
    assert!((r.queue_ms.unwrap() - 250.0).abs() < 1e-6);
    assert!((r.decode_ms.unwrap() - 1500.0).abs() < 1e-6);
    assert!((r.outside_engine_ms.unwrap() - 1000.0).abs() < 1e-6);
    assert_eq!(r.kv_cache_usage_peak, Some(0.6));
    assert!((r.kv_cache_usage_mean.unwrap() - 0.4).abs() < 1e-9);
    assert_eq!(r.requests_waiting_peak, Some(3.0));
    assert_eq!(r.requests_running_mean, Some(4.0));
    assert_eq!(r.batch_jitter, Some(0.0));
    assert_eq!(r.preemptions, Some(2.0));
    assert!(!r.engine_restarted);
}

#[test]
fn a_restart_skips_its_interval_and_says_so() {
    let points = [
        point(0.0, (50.0, 10.0), 0.1, 0.0, 2.0),
        point(1.0, (60.0, 12.0), 0.1, 0.0, 2.0),
        // Restarted: counters from zero.
        point(2.0, (1.0, 1.0), 0.1, 0.0, 2.0),
        point(3.0, (3.0, 2.0), 0.1, 0.0, 2.0),
    ];
    let r = Acc::window(&points, 0.0, 3.0).resources(None);
    assert!(r.engine_restarted);
    // (10 + 2) s over (2 + 1) requests.
    assert_eq!(r.engine_requests, 3);
    assert!((r.engine_e2e_ms.unwrap() - 4000.0).abs() < 1e-6);
    assert_eq!(r.outside_engine_ms, None);
}

#[test]
fn merged_windows_equal_one_computation_over_both() {
    let points: Vec<Point> = (0..10)
        .map(|i| {
            let t = f64::from(i);
            point(t, (t * t, t * 2.0), t / 10.0, t, 1.0 + t % 3.0)
        })
        .collect();
    let (a, b) = (
        Acc::window(&points, 0.0, 4.0),
        Acc::window(&points, 5.0, 9.0),
    );
    let mut m = a;
    m.merge(&b);
    let r = m.resources(None);
    assert_eq!(r.scrapes, 10);
    // Deltas 0→4 and 5→9: (16 + 81 − 25) s over (8 + 18 − 10) requests.
    assert_eq!(r.engine_requests, 16);
    assert!((r.engine_e2e_ms.unwrap() - 72.0 / 16.0 * 1e3).abs() < 1e-6);
    assert_eq!(r.kv_cache_usage_peak, Some(0.9));
    let all = Acc::window(&points, 0.0, 9.0).resources(None);
    assert_eq!(r.kv_cache_usage_mean, all.kv_cache_usage_mean);
    assert!((r.batch_jitter.unwrap() - all.batch_jitter.unwrap()).abs() < 1e-12);
}

const LIMITS: SoakLimits = SoakLimits {
    max_kv_growth: 0.1,
    max_waiting_growth: 5.0,
    max_jitter_growth: 0.25,
};

#[test]
fn a_steady_soak_holds_and_a_growing_one_fails_naming_what_grew() {
    let steady: Vec<Point> = (0..20)
        .map(|i| point(f64::from(i), (0.0, 0.0), 0.5, 1.0, 8.0))
        .collect();
    let s = soak(&steady, 0.0, 19.0, LIMITS);
    assert_eq!(s.holds, Some(true), "{s:?}");
    assert!(s.reasons.is_empty());
    let growing: Vec<Point> = (0..20)
        .map(|i| {
            let t = f64::from(i);
            point(t, (0.0, 0.0), 0.3 + t * 0.02, t, 8.0)
        })
        .collect();
    let s = soak(&growing, 0.0, 19.0, LIMITS);
    assert_eq!(s.holds, Some(false));
    assert_eq!(s.reasons.len(), 2, "{:?}", s.reasons);
    assert!(s.reasons[0].starts_with("KV-cache usage grew from 0.340 to 0.640"));
    assert!(s.reasons[1].starts_with("requests waiting grew"));
}

#[test]
fn jitter_that_grows_fails_and_too_few_scrapes_say_so() {
    let jittery: Vec<Point> = (0..16)
        .map(|i| {
            let running = if i < 8 {
                8.0
            } else if i % 2 == 0 {
                2.0
            } else {
                14.0
            };
            point(f64::from(i), (0.0, 0.0), 0.5, 0.0, running)
        })
        .collect();
    let s = soak(&jittery, 0.0, 15.0, LIMITS);
    assert_eq!(s.holds, Some(false));
    assert_eq!(s.batch_jitter_first, Some(0.0));
    assert!((s.batch_jitter_last.unwrap() - 0.75).abs() < 1e-9);
    assert!(s.reasons[0].starts_with("batch jitter grew"));
    let few = soak(&jittery[..5], 0.0, 15.0, LIMITS);
    assert_eq!(few.holds, None);
    assert!(few.reasons[0].contains("too few"));
}
