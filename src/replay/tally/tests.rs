//! Unit tests of [`super`].

use super::*;

#[test]
fn percentiles_are_nearest_rank() {
    let p = Pcts::of((1..=100).map(f64::from).collect());
    assert_eq!(
        (p.p50, p.p95, p.p99, p.max),
        (Some(50.0), Some(95.0), Some(99.0), Some(100.0))
    );
    assert_eq!(p.count, 100);
    assert_eq!(Pcts::of(vec![f64::NAN]).p50, None);
    let json = serde_json::to_value(Pcts::of(vec![1.0])).unwrap();
    for key in ["p50", "p90", "p95", "p99", "max"] {
        assert_eq!(json[key], 1.0, "{key}");
    }
}

#[test]
fn itl_from_the_groups_is_within_its_stated_error_of_the_exact_computation() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut t = Tables::default();
    let slo = crate::config::load(
        None,
        &crate::config::Overrides {
            upstream: Some("http://127.0.0.1:1".into()),
            ..Default::default()
        },
    )
    .unwrap()
    .slo;
    let mut all_gaps: Vec<u32> = Vec::new();
    let mut by_class: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    let samples: Vec<Sample> = (0..300usize)
        .map(|i| {
            // Skewed: mostly 5–25 ms, some stalls up to 2 s, a few zeros.
            let gaps: Vec<u32> = (0..(i % 50))
                .map(|k| {
                    let r = next();
                    match (k + i) % 97 {
                        0 => 0,
                        1 => (r % 2_000_000) as u32,
                        _ => 5_000 + (r % 20_000) as u32,
                    }
                })
                .collect();
            let mut r = crate::profile::line::tests::record();
            r.slo_class = ["default", "batch"][i % 2].into();
            r.model = Some(["a", "b", "c"][i % 3].into());
            let mut s = Sample::of(&r, &mut t);
            (s.step, s.measured) = (i % 4, true);
            let key = super::super::tables::Key {
                step: s.step,
                slice: (i % 5) as u32,
                class: s.class,
                model: s.model,
            };
            s.itl = t.record(key, &gaps);
            all_gaps.extend(&gaps);
            by_class[i % 2].extend(&gaps);
            s
        })
        .collect();
    let exact = |g: &[u32]| Pcts::of(g.iter().map(|g| f64::from(*g) / 1000.0).collect());
    let refs: Vec<&Sample> = samples.iter().collect();
    let (h, e) = (t.gaps(refs.iter().map(|s| s.itl)).pcts(), exact(&all_gaps));
    assert_eq!(h.count, e.count);
    assert!(e.count > 5_000);
    assert_eq!(h.max, e.max);
    assert!((h.mean.unwrap() - e.mean.unwrap()).abs() < 1e-9);
    let close = |a: Option<f64>, b: Option<f64>| {
        let (a, b) = (a.unwrap(), b.unwrap());
        // Rounded up to the bucket: never below the exact value, at most 0.1% above.
        assert!(a >= b && a <= b * (1.0 + 1e-3) + 1e-3, "{a} vs exact {b}");
    };
    for (a, b) in [
        (h.p50, e.p50),
        (h.p90, e.p90),
        (h.p95, e.p95),
        (h.p99, e.p99),
    ] {
        close(a, b);
    }
    // The same through Stats::of, and a class's percentile over its groups only.
    let stats = Stats::of(&refs, 1.0, &slo, &t);
    assert_eq!(stats.itl_ms, h);
    let class = t.id("default").unwrap();
    let mine: Vec<GroupId> = refs
        .iter()
        .filter(|s| s.class == class)
        .map(|s| s.itl)
        .collect();
    let mut sorted: Vec<f64> = by_class[0].iter().map(|g| f64::from(*g) / 1000.0).collect();
    sorted.sort_by(f64::total_cmp);
    for q in [0.5, 0.9, 0.99, 0.999] {
        close(
            t.gaps(mine.iter().copied()).quantile_ms(q),
            quantile(&sorted, q),
        );
    }
    let none = t.gaps(std::iter::empty()).pcts();
    assert_eq!((none.count, none.p50, none.max), (0, None, None));
    // Without ITL: everything else the same.
    let mut without = Stats::without_itl(&refs, 1.0, &slo, &t);
    assert_eq!(without.itl_ms, Pcts::default());
    without.itl_ms = stats.itl_ms;
    assert_eq!(
        serde_json::to_value(&without).unwrap(),
        serde_json::to_value(&stats).unwrap()
    );
}

#[test]
fn a_finished_request_holds_a_tenth_of_its_record_and_gaps() {
    // What a finished request used to hold, at the least: its whole record (strings
    // not counted) and one u32 per gap. A typical request: 200 output tokens.
    let before = std::mem::size_of::<RequestRecord>() + 199 * std::mem::size_of::<u32>();
    let mut t = Tables::default();
    let mut r = crate::profile::line::tests::record();
    r.output_tokens = Some(200);
    let s = Sample::of(&r, &mut t);
    // No heap: names are ids, gaps are in the run's histograms, a probe's verdict is
    // the only thing boxed.
    assert!(s.probe.is_none());
    let now = std::mem::size_of::<Sample>();
    assert!(now <= 112, "Sample is {now} bytes");
    assert!(now * 10 <= before, "{now} bytes against {before}");
    // Absent values survive the packing.
    r.ttft_ms = None;
    r.input_tokens = None;
    let s = Sample::of(&r, &mut t);
    assert_eq!(
        (s.ttft_ms(), s.input_tokens(), s.lag_ms()),
        (None, None, None)
    );
    assert_eq!(s.output_tokens(), Some(200));
}
