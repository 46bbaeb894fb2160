//! Reload: same windows and buckets keep the data; other changes start fresh.

use super::*;

#[test]
fn reload_keeps_classes_by_name_and_applies_new_targets_and_cost() {
    let (mut e, base) = engine(config());
    for i in 0..30 {
        e.observe(&ob(base, 1.0 + f64::from(i)));
        e.observe(&Observation {
            class: "batch",
            ..ob(base, 1.0 + f64::from(i))
        });
    }
    let mut cfg = config();
    cfg.classes = vec![
        class("new", 0.9, vec![]),
        class("interactive", 0.5, vec![p95_ttft(50.0)]),
        class(DEFAULT_CLASS, 0.99, vec![]),
    ];
    cfg.cost = Some(CostConfig {
        currency: "EUR".into(),
        per_hour: 24.0,
        components: vec![],
        usage: Default::default(),
    });
    cfg.history = secs(120.0);
    assert!(e.reconfigure(cfg));
    let now = base + MIN;
    let s = e.summary(MIN, now).unwrap();
    let names: Vec<&str> = s.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["new", "interactive", DEFAULT_CLASS]);
    let i = group(&s, "interactive");
    assert_eq!(i.rates.requests, 30, "data kept");
    assert_eq!(i.attainment_target, Some(0.5));
    assert_eq!(i.percentile_targets[0].holds, Some(false));
    assert_eq!(group(&s, "new").rates.requests, 0);
    assert_eq!(
        s.overall.group.rates.requests, 30,
        "batch was removed, and its data with it"
    );
    assert_eq!(s.overall.cost.unwrap().currency, "EUR");
    // History now 2 minutes: series keep at most 2 points.
    e.advance(base + secs(600.0));
    let s = e.summary(MIN, base + secs(600.0)).unwrap();
    assert_eq!(s.overall.group.stability.points.len(), 2);
}

#[test]
fn reload_with_other_windows_or_buckets_starts_fresh() {
    let (mut e, base) = engine(config());
    e.observe(&ob(base, 1.0));
    assert!(!e.reconfigure(EngineConfig {
        windows: vec![MIN],
        ..config()
    }));
    assert_eq!(
        e.summary(MIN, base + MIN)
            .unwrap()
            .overall
            .group
            .rates
            .requests,
        0
    );
    e.observe(&ob(base, 2.0));
    assert!(!e.reconfigure(EngineConfig {
        input_buckets: vec![1000],
        ..config()
    }));
    assert_eq!(e.memory_bytes(), Engine::new(config()).memory_bytes());
}
