//! Hostile input: NaN and infinite latencies, zero and huge durations, saturating counters,
//! instants out of order, degenerate configs; plus a property test over random traffic.

use proptest::prelude::*;

use super::*;

/// No NaN or infinity anywhere in a value's Debug form (JSON would hide them as null).
#[track_caller]
fn assert_finite(v: &impl std::fmt::Debug) {
    let dbg = format!("{v:?}");
    for bad in ["NaN", ": inf", "(inf)", "-inf"] {
        assert!(!dbg.contains(bad), "{bad} in {dbg}");
    }
}

fn check_everything(e: &Engine, now: Instant) {
    let windows: Vec<Duration> = e.windows().map(|(_, d)| d).collect();
    for w in windows {
        let s = e.summary(w, now).unwrap();
        assert_finite(&s);
        serde_json::to_string(&s).unwrap();
    }
    for class in e.classes().map(Some).chain([None]) {
        let c = e.capacity(class, now).unwrap();
        assert_finite(&c);
        serde_json::to_string(&c).unwrap();
    }
    assert_finite(&e.gauges(now));
}

#[test]
fn extreme_values_neither_panic_nor_make_nan() {
    let (mut e, base) = engine(config());
    let gaps = [0, 1, u32::MAX];
    let weird = [
        Observation {
            ttft_ms: Some(f64::NAN),
            tpot_ms: Some(f64::INFINITY),
            e2e_ms: f64::NEG_INFINITY,
            ..ob(base, 1.0)
        },
        Observation {
            e2e_ms: 0.0,
            ttft_ms: Some(0.0),
            output_tokens: Some(u64::MAX),
            input_tokens: Some(u64::MAX),
            concurrency_at_start: u32::MAX,
            itl_us: &gaps,
            ..ob(base, 2.0)
        },
        Observation {
            e2e_ms: 1e300,
            output_tokens: Some(0),
            concurrency_at_start: 0,
            ..ob(base, 3.0)
        },
        Observation {
            e2e_ms: f64::NAN,
            output_tokens: None,
            input_tokens: None,
            ..ob(base, 4.0)
        },
        Observation {
            started: base + secs(9.0),
            ..ob(base, 5.0)
        },
        Observation {
            ttft_ms: Some(-3.0),
            tpot_ms: Some(1e20),
            slo_met: Some(false),
            ..ob(base, 0.0)
        },
    ];
    for _ in 0..2 {
        weird.iter().for_each(|o| e.observe(o));
    }
    if let Some(before) = base.checked_sub(secs(10.0)) {
        e.observe(&Observation {
            started: before,
            finished: before,
            ..ob(base, 0.0)
        });
    }
    e.sample_in_flight(base + secs(6.0), u64::MAX);
    e.sample_in_flight(base + secs(7.0), u64::MAX);
    check_everything(&e, base + secs(8.0));
    check_everything(&e, base);
    let s = e.summary(MIN, base + secs(8.0)).unwrap();
    assert_eq!(s.overall.group.rates.output_tokens, u64::MAX, "saturates");
    assert_eq!(s.overall.in_flight.peak, Some(u64::MAX));
    assert_hdr(s.overall.group.tpot_ms.max, 3_600_000.0);
    let far = base + Duration::from_secs(1000 * 86_400);
    e.advance(far);
    e.sample_in_flight(far, 3);
    check_everything(&e, far);
    check_everything(&e, base);
}

#[test]
fn degenerate_configs_are_survivable() {
    let cfg = EngineConfig {
        windows: vec![Duration::ZERO, Duration::ZERO, Duration::from_nanos(1)],
        classes: vec![],
        input_buckets: vec![],
        min_samples: 0,
        history: Duration::ZERO,
        timeline_points: 0,
        cost: Some(CostConfig {
            currency: "EUR".into(),
            per_hour: f64::NAN,
            components: vec![],
            usage: Default::default(),
        }),
    };
    let (mut e, base) = engine(cfg);
    assert_eq!(
        e.windows().collect::<Vec<_>>(),
        [("1s", Duration::from_secs(1))]
    );
    assert_eq!(e.classes().collect::<Vec<_>>(), [DEFAULT_CLASS]);
    for i in 0..50 {
        e.observe(&ob(base, f64::from(i) * 0.1));
    }
    check_everything(&e, base + secs(5.0));
    let s = e.summary(Duration::from_secs(1), base + secs(5.0)).unwrap();
    assert_eq!(s.overall.group.ttft_ms_by_input.0.len(), 1);
    assert_eq!(s.overall.group.ttft_ms_by_input.0[0].0, "all");
    assert_eq!(s.overall.cost_per_million_effective_tokens, None);
    assert!(e.summary(Duration::ZERO, base).is_none());
    // min_samples 0 still needs one sample to call a level stable.
    assert_eq!(
        e.capacity(None, base + secs(5.0))
            .unwrap()
            .max_stable_concurrency,
        Some(1)
    );
}

#[test]
fn a_default_class_in_the_middle_moves_last() {
    let e = Engine::new(EngineConfig {
        classes: vec![class(DEFAULT_CLASS, 0.5, vec![]), class("a", 0.9, vec![])],
        ..config()
    });
    assert_eq!(e.classes().collect::<Vec<_>>(), ["a", DEFAULT_CLASS]);
}

fn outcome() -> impl Strategy<Value = (Outcome, Option<bool>)> {
    prop_oneof![
        Just((Outcome::Ok, Some(true))),
        Just((Outcome::Ok, Some(false))),
        Just((Outcome::ClientAbort, None)),
        Just((Outcome::Timeout, Some(false))),
        Just((Outcome::UpstreamReset, Some(false))),
    ]
}

proptest! {
    // No regression files: they would land in the shared source tree.
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(64)
    })]
    #[test]
    fn random_traffic_keeps_invariants(
        reqs in prop::collection::vec(
            (0.0..4000.0f64, 0usize..4, outcome(), prop::option::of(-10.0..1e7f64),
             0.0..1e6f64, prop::option::of(0u64..1_000_000), 0u32..2000, any::<bool>()),
            0..120),
        after_s in 0.0..4000.0f64,
    ) {
        // Queries look at the present: `now` is not before the newest observation.
        let now_s = reqs.iter().map(|r| r.0).fold(0.0, f64::max) + after_s;
        let (mut e, base) = engine(config());
        let names = ["interactive", "batch", "default", "unknown"];
        for (at, ci, (outcome, met), ttft, e2e, tokens, conc, long) in reqs {
            e.observe(&Observation {
                class: names[ci],
                outcome,
                slo_met: met,
                ttft_ms: ttft,
                e2e_ms: e2e,
                output_tokens: tokens,
                input_tokens: tokens,
                concurrency_at_start: conc,
                long_in_flight_at_start: long,
                ..ob(base, at)
            });
        }
        let now = base + secs(now_s);
        check_everything(&e, now);
        let s = e.summary(M5, now).unwrap();
        let mut sum = 0;
        for g in s.classes.iter().chain([&s.overall.group]) {
            let r = &g.rates;
            prop_assert!(r.slo_met + r.slo_missed + r.client_aborts <= r.requests);
            prop_assert!(r.attainment.is_none_or(|a| (0.0..=1.0).contains(&a)));
            prop_assert!(r.effective_goodput_tokens_per_s <= r.raw_output_tokens_per_s);
            if g.name != "overall" {
                sum += r.requests;
            }
        }
        prop_assert_eq!(sum, s.overall.group.rates.requests);
        let model_sum: u64 = s.models.iter().map(|m| m.rates.requests).sum();
        prop_assert_eq!(model_sum, sum);
    }
}
