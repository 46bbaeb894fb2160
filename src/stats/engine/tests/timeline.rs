//! The timeline: one point per closed slice of the shortest window, all classes together,
//! bounded by `timeline_points`, kept across a reload that keeps the windows.

use super::*;

#[test]
fn one_point_per_closed_slice_of_the_shortest_window() {
    let (mut e, base) = engine(EngineConfig {
        timeline_points: 4,
        ..config()
    });
    // Slice 0 (0–5 s): two interactive requests, one batch miss; slice 1: nothing;
    // slice 2: one request.
    e.observe(&ob(base, 1.0));
    e.observe(&Observation {
        ttft_ms: Some(300.0),
        ..ob(base, 2.0)
    });
    e.observe(&Observation {
        class: "batch",
        slo_met: Some(false),
        output_tokens: Some(50),
        ..ob(base, 3.0)
    });
    e.sample_in_flight(base + secs(4.0), 3);
    assert!(
        e.timeline(base + secs(4.5), None).points.is_empty(),
        "nothing closed yet"
    );
    e.observe(&ob(base, 11.0));
    e.advance(base + secs(15.0));
    let t = e.timeline(base + secs(16.0), None);
    assert_close(t.slice_seconds, 5.0);
    assert_eq!(t.capacity, 4);
    assert_eq!(t.points.len(), 3, "slices 0, 1 and 2");
    let p = &t.points[0];
    assert_eq!((p.requests, p.slo_met, p.slo_missed), (3, 2, 1));
    assert_eq!(p.attainment, Some(2.0 / 3.0));
    assert_eq!((p.output_tokens, p.effective_output_tokens), (250, 200));
    assert_close(p.raw_output_tokens_per_s, 50.0);
    assert_close(p.effective_goodput_tokens_per_s, 40.0);
    assert_close(p.request_goodput_per_s, 0.4);
    assert_eq!(p.ttft_ms.count, 3);
    assert_hdr(p.ttft_ms.max, 300.0);
    assert_close(p.ended_s_ago, 11.0);
    assert_eq!(p.in_flight_peak, Some(3));
    let idle = &t.points[1];
    assert_eq!(idle.requests, 0);
    assert_eq!(idle.attainment, None);
    assert_eq!(idle.ttft_ms.p50, None);
    assert_eq!(t.points[2].requests, 1);
    assert_close(t.points[2].ended_s_ago, 1.0);
    // `limit` takes the newest.
    let last = e.timeline(base + secs(16.0), Some(1));
    assert_eq!(last.points.len(), 1);
    assert_eq!(last.points[0].requests, 1);
    // A long idle stretch: still at most `timeline_points`, all zero.
    e.advance(base + secs(3600.0));
    let t = e.timeline(base + secs(3600.0), None);
    assert_eq!(t.points.len(), 4);
    assert!(t.points.iter().all(|p| p.requests == 0));
}

#[test]
fn reload_resizes_the_timeline_and_zero_keeps_none() {
    let (mut e, base) = engine(config());
    for s in 0..10 {
        e.observe(&ob(base, f64::from(s) * 5.0 + 1.0));
    }
    e.advance(base + secs(50.0));
    assert_eq!(e.timeline(base + secs(50.0), None).points.len(), 10);
    assert!(e.reconfigure(EngineConfig {
        timeline_points: 3,
        ..config()
    }));
    let t = e.timeline(base + secs(50.0), None);
    assert_eq!(t.points.len(), 3);
    assert!(t.points.iter().all(|p| p.requests == 1), "the newest kept");
    assert!(e.reconfigure(EngineConfig {
        timeline_points: 0,
        ..config()
    }));
    e.advance(base + secs(80.0));
    assert!(e.timeline(base + secs(80.0), None).points.is_empty());
}
