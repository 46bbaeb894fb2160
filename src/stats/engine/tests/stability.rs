//! Stability series: one closed point per window-length interval, throughput drift and
//! P99 TTFT jitter, bounded by `history`.

use super::*;

/// Minute m (0-based) gets 10 requests of 60·(m+1) tokens with TTFT 100 ms, or 300 ms in
/// odd minutes: throughput 10·(m+1) tokens/s, p99 alternating 100 / 300.
fn five_minutes(e: &mut Engine, base: Instant) {
    for m in 0..5u32 {
        for i in 0..10u32 {
            let at = f64::from(m) * 60.0 + 1.0 + f64::from(i) * 5.0;
            e.observe(&Observation {
                output_tokens: Some(60 * u64::from(m + 1)),
                ttft_ms: Some(if m % 2 == 1 { 300.0 } else { 100.0 }),
                slo_met: Some(i != 0 || m != 4),
                ..ob(base, at)
            });
        }
    }
}

#[test]
fn one_point_per_closed_interval_with_drift_and_jitter() {
    let (mut e, base) = engine(config());
    five_minutes(&mut e, base);
    // Nothing closes minute 4 until time moves past it.
    let s = e.summary(MIN, base + secs(290.0)).unwrap();
    assert_eq!(s.overall.group.stability.points.len(), 4);
    e.advance(base + secs(300.0));
    let now = base + secs(310.0);
    let s = e.summary(MIN, now).unwrap();
    let st = &group(&s, "interactive").stability;
    assert_eq!(st.interval, "1m");
    let thr: Vec<f64> = st
        .points
        .iter()
        .map(|p| p.throughput_tokens_per_s)
        .collect();
    assert_eq!(thr, [10.0, 20.0, 30.0, 40.0, 50.0]);
    let ago: Vec<f64> = st.points.iter().map(|p| p.ended_s_ago).collect();
    assert_eq!(ago, [250.0, 190.0, 130.0, 70.0, 10.0]);
    assert_eq!(st.points[4].attainment, Some(0.9));
    assert_eq!(st.points[0].requests, 10);
    assert_close(st.points[0].duration_s, 60.0);
    // A straight line from 10 to 50 around a mean of 30.
    assert_close(st.throughput_drift.unwrap(), 40.0 / 30.0);
    // P99s 100, 300, 100, 300, 100 (within HDR precision): mean 180, σ ≈ 97.98.
    let jitter = st.p99_ttft_jitter.unwrap();
    assert!((jitter - 97.98 / 180.0).abs() < 0.01, "{jitter}");
    assert_hdr(st.points[1].p99_ttft_ms, 300.0);
    // Overall has the same points (one class), the 5m series none closed yet.
    assert_eq!(s.overall.group.stability.points.len(), 5);
    let s5 = e.summary(M5, now).unwrap();
    assert_eq!(s5.overall.group.stability.points.len(), 1);
    assert_close(
        s5.overall.group.stability.points[0].throughput_tokens_per_s,
        30.0,
    );
}

#[test]
fn idle_intervals_are_zero_points_and_history_is_bounded() {
    let (mut e, base) = engine(EngineConfig {
        history: secs(600.0),
        ..config()
    });
    e.observe(&ob(base, 1.0));
    // Twenty idle minutes later: ten points kept (history / 1m), all zero but the none.
    e.observe(&ob(base, 1201.0));
    let s = e.summary(MIN, base + secs(1210.0)).unwrap();
    let st = &s.overall.group.stability;
    assert_eq!(st.points.len(), 10);
    assert!(
        st.points
            .iter()
            .all(|p| p.requests == 0 && p.throughput_tokens_per_s == 0.0)
    );
    assert_eq!(st.points.last().map(|p| p.ended_s_ago), Some(10.0));
    assert_eq!(st.throughput_drift, None, "zero mean");
    assert_eq!(st.p99_ttft_jitter, None);
    // The 1h series keeps history / 1h = 0 points.
    let s = e.summary(HOUR, base + secs(7300.0)).unwrap();
    assert!(s.overall.group.stability.points.is_empty());
}
