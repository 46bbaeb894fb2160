//! Memory: idle classes cost nothing; 3 windows × 5 classes under load stay inside the
//! documented bound.

use super::*;
use crate::stats::engine::{capacity::LEVELS, hist::DENSE_BYTES};

#[test]
fn an_idle_class_allocates_no_slices() {
    let (mut e, base) = engine(config());
    let idle_before = e.memory_bytes();
    for i in 0..100 {
        e.observe(&ob(base, f64::from(i)));
    }
    let batch = &e.classes[1];
    assert_eq!(batch.cfg.name, "batch");
    assert!(batch.rings.iter().all(Option::is_none));
    assert!(batch.capacity.is_none());
    assert!(batch.series.iter().all(|s| s.heap_bytes() == 0));
    assert!(e.classes[0].rings.iter().all(Option::is_some));
    assert!(e.memory_bytes() > idle_before);
    // Its summary still has the class, with nulls.
    let s = e.summary(MIN, base + secs(100.0)).unwrap();
    assert_eq!(group(&s, "batch").rates.requests, 0);
    assert_eq!(group(&s, "batch").ttft_ms.p50, None);
}

/// 5 classes, 65 minutes, each class one streaming request per second with 300 ITL gaps,
/// inputs in two buckets, concurrency over 8 levels: the "typical" case of the module doc.
#[test]
fn three_windows_by_five_classes_stay_inside_the_bound() {
    let names = ["a", "b", "c", "d", DEFAULT_CLASS];
    let cfg = EngineConfig {
        classes: names.iter().map(|n| class(n, 0.99, vec![])).collect(),
        ..config()
    };
    let (mut e, base) = engine(cfg);
    let gaps: Vec<u32> = (0..300).map(|i| 20_000 + i * 7).collect();
    for s in 0..3900u32 {
        for (i, name) in names.iter().enumerate() {
            e.observe(&Observation {
                class: name,
                itl_us: &gaps,
                input_tokens: Some(if s % 3 == 0 { 3000 } else { 500 }),
                long_in_flight_at_start: s % 5 == 0,
                concurrency_at_start: 1 + (s + i as u32) % 8,
                ttft_ms: Some(f64::from(50 + s % 400)),
                ..ob(base, 1.0 + f64::from(s))
            });
        }
    }
    let bytes = e.memory_bytes();
    let mb = bytes as f64 / 1e6;
    // Documented: ≈ 18 MB typical for 3 windows × 5 classes.
    assert!(mb < 20.0, "{mb:.1} MB");
    // Hard worst case: every histogram of every slot dense, every level dense.
    let per_class_window = 13 * 16 * DENSE_BYTES;
    let per_class_capacity = 7 * LEVELS * 2 * DENSE_BYTES;
    let worst = 5 * (3 * per_class_window + per_class_capacity) + 2_000_000;
    assert!(bytes < worst, "{bytes} >= {worst}");
    eprintln!(
        "3 windows × 5 classes, typical load: {mb:.1} MB; worst-case bound {} MB",
        worst / 1_000_000
    );
}
