//! Window roll-over, slice reuse, late records.

use super::*;

#[test]
fn observations_leave_the_window_when_now_moves_past_it() {
    let (mut e, base) = engine(config());
    // Finishes at 7 s: slice 1 (5–10 s) of the 1m window (5 s slices).
    e.observe(&ob(base, 7.0));
    let requests = |e: &Engine, w, at: f64| {
        e.summary(w, base + secs(at))
            .unwrap()
            .overall
            .group
            .rates
            .requests
    };
    assert_eq!(requests(&e, MIN, 30.0), 1);
    // The window at `now` is slices k_now − 12 ..= k_now: slice 1 stays until k_now = 14.
    assert_eq!(requests(&e, MIN, 69.9), 1);
    assert_eq!(requests(&e, MIN, 70.0), 0);
    assert_eq!(requests(&e, M5, 70.0), 1, "still inside the 5m window");
    assert_eq!(
        requests(&e, M5, 325.0),
        0,
        "25 s slices: slice 0 leaves at slice 13"
    );
    assert_eq!(requests(&e, HOUR, 325.0), 1);
    // Querying does not need the engine to have advanced: stale slots are filtered by number.
    let g = e.gauges(base + secs(70.0));
    assert_eq!(g.windows[0].classes[0].raw_tokens_per_s, 0.0);
    assert!(g.windows[1].classes[0].raw_tokens_per_s > 0.0);
}

#[test]
fn slices_are_reused_not_grown() {
    // 1h of history: every series is full after 3 h, so memory is at its steady state.
    let (mut e, base) = engine(EngineConfig {
        history: HOUR,
        ..config()
    });
    for s in 0..(3 * 3600) {
        e.observe(&ob(base, 1.0 + s as f64));
    }
    let class = &e.classes[0];
    let allocated: Vec<usize> = class
        .rings
        .iter()
        .map(|r| r.as_ref().map_or(0, Ring::allocated))
        .collect();
    assert_eq!(allocated, [13, 13, 13], "n + 1 slots per window, reused");
    assert_eq!(class.capacity.as_ref().map(Ring::allocated), Some(7));
    let before = e.memory_bytes();
    for s in (3 * 3600)..(4 * 3600) {
        e.observe(&ob(base, 1.0 + s as f64));
    }
    assert_eq!(
        e.memory_bytes(),
        before,
        "a steady load does not grow memory"
    );
    // One request per second, the last at 14,400 s; at 14,402.5 s the 1m window covers
    // slices from 14,340 s: 61 requests over 62.5 s.
    let now = base + secs(4.0 * 3600.0 + 2.5);
    let s = e.summary(MIN, now).unwrap();
    assert_eq!(s.overall.group.rates.requests, 61);
    assert_close(s.window_seconds, 62.5);
    assert_close(s.overall.group.rates.raw_output_tokens_per_s, 6100.0 / 62.5);
}

#[test]
fn records_more_than_a_window_late_are_dropped_from_that_window_only() {
    let (mut e, base) = engine(config());
    e.observe(&ob(base, 100.0));
    // Handed over after one that finished at 100 s (1m slice 20). Slice 9 (45 s) is within
    // the 13 slices the 1m ring holds: counted. Slice 6 (30 s) is not: dropped from 1m,
    // counted in 5m and 1h.
    e.observe(&ob(base, 45.0));
    assert_eq!(e.late_dropped(), 0);
    e.observe(&ob(base, 30.0));
    assert_eq!(e.late_dropped(), 1);
    let requests = |w| {
        e.summary(w, base + secs(100.0))
            .unwrap()
            .overall
            .group
            .rates
            .requests
    };
    assert_eq!((requests(MIN), requests(M5), requests(HOUR)), (2, 3, 3));
    let s = e.summary(MIN, base + secs(100.0)).unwrap();
    assert_eq!(s.models[0].rates.requests, 2, "models agree with classes");
}

#[test]
fn without_samples_the_first_observation_starts_the_clock() {
    let base = Instant::now();
    let mut e = Engine::new(config());
    // Started at base + 4 s, finished at 10 s: the epoch is base + 4 s.
    e.observe(&Observation {
        started: base + secs(4.0),
        output_tokens: Some(60),
        ..ob(base, 10.0)
    });
    let s = e.summary(MIN, base + secs(16.0)).unwrap();
    assert_close(s.window_seconds, 12.0);
    assert_close(s.overall.group.rates.raw_output_tokens_per_s, 5.0);
}

#[test]
fn model_labels_are_capped() {
    let (mut e, base) = engine(config());
    let names: Vec<String> = (0..MAX_MODELS + 10).map(|i| format!("m{i}")).collect();
    for n in &names {
        e.observe(&Observation {
            model: n,
            ..ob(base, 1.0)
        });
    }
    assert_eq!(e.models.len(), MAX_MODELS + 1);
    let s = e.summary(MIN, base + secs(2.0)).unwrap();
    let other = s.models.iter().find(|m| m.name == "other").unwrap();
    assert_eq!(other.rates.requests, 10);
}
