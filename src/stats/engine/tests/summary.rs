//! Hand-computed summaries: attainment, goodput, raw throughput, cost, wasted share,
//! percentiles, input buckets, in-flight, targets, classes and models, the JSON contract.

use super::*;

/// Seven requests in the first minute, summary at exactly 60 s (span = 60 s):
/// interactive: met 100 + met 200 tokens, missed 300 (slow), client abort 50 (no verdict);
/// batch: met 400, timeout (missed, 0 tokens), upstream error (missed, 0 tokens).
fn seven(base: Instant) -> Vec<Observation<'static>> {
    let i = |at, met, tokens, outcome| Observation {
        slo_met: met,
        output_tokens: Some(tokens),
        outcome,
        ..ob(base, at)
    };
    let b = |at, met, tokens, outcome| Observation {
        class: "batch",
        ..i(at, met, tokens, outcome)
    };
    vec![
        i(5.0, Some(true), 100, Outcome::Ok),
        i(15.0, Some(true), 200, Outcome::Ok),
        i(25.0, Some(false), 300, Outcome::Ok),
        i(35.0, None, 50, Outcome::ClientAbort),
        b(45.0, Some(true), 400, Outcome::Ok),
        b(50.0, Some(false), 0, Outcome::Timeout),
        b(55.0, Some(false), 0, Outcome::UpstreamError),
    ]
}

#[test]
fn attainment_goodput_throughput_and_cost_are_hand_computed() {
    let (mut e, base) = engine(config());
    seven(base).iter().for_each(|o| e.observe(o));
    let s = e.summary(MIN, base + MIN).unwrap();
    assert_eq!(s.window, "1m");
    assert_close(s.window_seconds, 60.0);

    let i = &group(&s, "interactive").rates;
    assert_eq!(
        (i.requests, i.slo_met, i.slo_missed, i.client_aborts),
        (4, 2, 1, 1)
    );
    assert_close(i.attainment.unwrap(), 2.0 / 3.0);
    assert_close(i.effective_goodput_tokens_per_s, 300.0 / 60.0);
    assert_close(i.raw_output_tokens_per_s, 650.0 / 60.0);
    assert_close(i.request_goodput_per_s, 2.0 / 60.0);

    let b = &group(&s, "batch").rates;
    assert_eq!((b.requests, b.slo_met, b.slo_missed), (3, 1, 2));
    assert_close(b.attainment.unwrap(), 1.0 / 3.0);
    assert_close(b.effective_goodput_tokens_per_s, 400.0 / 60.0);
    assert_close(b.error_rate.unwrap(), 1.0 / 3.0);
    assert_close(b.timeout_rate.unwrap(), 1.0 / 3.0);

    let o = &s.overall;
    assert_eq!(o.group.name, "overall");
    assert_eq!(
        (
            o.group.rates.requests,
            o.group.rates.slo_met,
            o.group.rates.slo_missed
        ),
        (7, 3, 3)
    );
    assert_close(o.group.rates.attainment.unwrap(), 0.5);
    assert_close(o.group.rates.effective_goodput_tokens_per_s, 700.0 / 60.0);
    assert_close(o.group.rates.raw_output_tokens_per_s, 1050.0 / 60.0);
    assert_close(o.group.rates.error_rate.unwrap(), 1.0 / 7.0);
    // Traffic-weighted target: (3 × 0.99 + 3 × 0.9) / 6.
    assert_close(
        o.group.attainment_target.unwrap(),
        (3.0 * 0.99 + 3.0 * 0.9) / 6.0,
    );

    // 12/h for 60 s = 0.2; per million effective = 0.2 / 700 × 1e6; raw = 0.2 / 1050 × 1e6.
    let c = o.cost.as_ref().unwrap();
    assert_close(c.window_cost, 0.2);
    assert_close(
        c.cost_per_million_effective_tokens.unwrap(),
        0.2 / 700.0 * 1e6,
    );
    assert_close(
        o.cost_per_million_effective_tokens.unwrap(),
        0.2 / 700.0 * 1e6,
    );
    assert_close(c.cost_per_million_raw_tokens.unwrap(), 0.2 / 1050.0 * 1e6);
    assert_close(c.wasted_share.unwrap(), 300.0 / 1050.0);
    assert_close(c.wasted_cost.unwrap(), 0.2 * 300.0 / 1050.0);
    // 7 requests finished, 3 met their SLO.
    assert_close(c.cost_per_request.unwrap(), 0.2 / 7.0);
    assert_close(c.cost_per_effective_request.unwrap(), 0.2 / 3.0);
    assert_eq!(
        c.cost_per_stable_user_per_month, None,
        "too few samples for a stable level"
    );

    let g = e.gauges(base + MIN);
    let one = &g.windows[0];
    assert_eq!(one.window, "1m");
    assert_close(one.classes[0].effective_tokens_per_s, 5.0);
    assert_close(one.overall.raw_tokens_per_s, 1050.0 / 60.0);
    assert_close(
        one.cost_per_million_effective_tokens.unwrap(),
        0.2 / 700.0 * 1e6,
    );
    assert_eq!(g.currency, Some("USD"));
    assert_eq!(g.max_stable_concurrency[0], ("interactive", None));
}

#[test]
fn cost_per_stable_user_uses_max_stable_concurrency() {
    let (mut e, base) = engine(config());
    for n in 0..40 {
        let conc = 1 + n % 2;
        e.observe(&Observation {
            concurrency_at_start: conc,
            ..ob(base, 1.0 + n as f64)
        });
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    assert_eq!(s.overall.group.max_stable_concurrency, Some(2));
    assert_eq!(group(&s, "interactive").max_stable_concurrency, Some(2));
    let c = s.overall.cost.unwrap();
    assert_close(
        c.cost_per_stable_user_per_month.unwrap(),
        12.0 * 730.0 / 2.0,
    );
}

#[test]
fn percentiles_are_within_hdr_precision() {
    let (mut e, base) = engine(config());
    let gaps: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
    // TTFT 1..=1000 ms spread over 50 s (several slices, some sparse, merged).
    for v in 1..=1000u32 {
        let mut o = ob(base, 1.0 + f64::from(v) / 20.0);
        o.ttft_ms = Some(f64::from(v));
        o.e2e_ms = f64::from(v) * 10.0;
        o.itl_us = if v == 1 { &gaps } else { &[] };
        e.observe(&o);
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    let t = &group(&s, "interactive").ttft_ms;
    assert_eq!(t.count, 1000);
    for (got, want) in [
        (t.p50, 500.0),
        (t.p90, 900.0),
        (t.p95, 950.0),
        (t.p99, 990.0),
        (t.max, 1000.0),
    ] {
        assert_hdr(got, want);
    }
    assert_hdr(group(&s, "interactive").e2e_ms.p99, 9900.0);
    let itl = &s.overall.group.itl_ms;
    assert_eq!(itl.count, 100);
    assert_hdr(itl.p50, 50.0);
    assert_hdr(itl.max, 100.0);
    assert_eq!(group(&s, "batch").ttft_ms.p50, None, "no samples → null");
}

#[test]
fn ttft_by_input_and_short_requests_with_long_in_flight() {
    let (mut e, base) = engine(config());
    for n in 0..20 {
        let at = 1.0 + n as f64;
        let short_alone = Observation {
            ttft_ms: Some(100.0),
            input_tokens: Some(800),
            ..ob(base, at)
        };
        let short_long = Observation {
            ttft_ms: Some(400.0),
            input_tokens: Some(1024),
            long_in_flight_at_start: true,
            ..ob(base, at)
        };
        let long = Observation {
            ttft_ms: Some(2000.0),
            input_tokens: Some(100_000),
            ..ob(base, at)
        };
        let mid = Observation {
            ttft_ms: Some(300.0),
            input_tokens: Some(4000),
            ..ob(base, at)
        };
        let unknown = Observation {
            input_tokens: None,
            ..ob(base, at)
        };
        for o in [short_alone, short_long, long, mid, unknown] {
            e.observe(&o);
        }
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    let g = group(&s, "interactive");
    let by: Vec<(&str, u64)> = g
        .ttft_ms_by_input
        .0
        .iter()
        .map(|(k, p)| (k.as_str(), p.count))
        .collect();
    assert_eq!(
        by,
        [
            ("<=1k", 40),
            ("<=4k", 20),
            ("<=16k", 0),
            ("<=64k", 0),
            (">64k", 20)
        ]
    );
    assert_hdr(g.ttft_ms_by_input.0[4].1.p95, 2000.0);
    assert_hdr(g.stability.short_ttft_with_long_in_flight.p95, 400.0);
    assert_hdr(g.stability.short_ttft_without.p95, 100.0);
    assert_eq!(g.stability.short_ttft_without.count, 20);
    assert_eq!(
        g.ttft_ms.count, 100,
        "unknown input still counts in plain TTFT"
    );
}

#[test]
fn in_flight_mean_and_peak_and_percentile_targets() {
    let (mut e, base) = engine(config());
    for (i, n) in [2u64, 4, 6, 20].into_iter().enumerate() {
        e.sample_in_flight(base + secs(10.0 * (i + 1) as f64), n);
    }
    for n in 0..10 {
        e.observe(&Observation {
            ttft_ms: Some(100.0 * (n + 1) as f64),
            ..ob(base, 2.0 + n as f64)
        });
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    let f = s.overall.in_flight;
    assert_eq!(
        (f.samples, f.peak),
        (5, Some(20)),
        "the epoch sample (0) counts too"
    );
    assert_close(f.mean.unwrap(), 32.0 / 5.0);
    let t = &group(&s, "interactive").percentile_targets[0];
    assert_eq!(
        (t.metric, t.quantile, t.max_ms),
        (LatencyMetric::Ttft, 0.95, 800.0)
    );
    assert_hdr(t.value_ms, 1000.0);
    assert_eq!(t.holds, Some(false));
    assert_eq!(group(&s, "batch").percentile_targets.len(), 0);
}

#[test]
fn classes_and_models_are_separate_and_unknown_classes_go_to_default() {
    let (mut e, base) = engine(config());
    e.observe(&Observation {
        output_tokens: Some(10),
        ..ob(base, 1.0)
    });
    e.observe(&Observation {
        class: "batch",
        model: "qwen",
        output_tokens: Some(20),
        ..ob(base, 2.0)
    });
    e.observe(&Observation {
        class: "nope",
        model: "other",
        output_tokens: Some(40),
        ..ob(base, 3.0)
    });
    let s = e.summary(M5, base + MIN).unwrap();
    let tokens = |n: &str| group(&s, n).rates.output_tokens;
    assert_eq!(
        (
            tokens("interactive"),
            tokens("batch"),
            tokens(DEFAULT_CLASS)
        ),
        (10, 20, 40)
    );
    assert_eq!(
        s.classes
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["interactive", "batch", "default"]
    );
    let models: Vec<(&str, u64)> = s
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.rates.output_tokens))
        .collect();
    assert_eq!(models, [("llama", 10), ("other", 40), ("qwen", 20)]);
    assert!(
        e.summary(Duration::from_secs(120), base + MIN).is_none(),
        "not a configured window"
    );
    assert!(e.capacity(Some("nope"), base).is_none());
}

#[test]
fn young_engine_rates_use_its_age() {
    let (mut e, base) = engine(config());
    e.observe(&Observation {
        output_tokens: Some(100),
        ..ob(base, 10.0)
    });
    let s = e.summary(HOUR, base + secs(20.0)).unwrap();
    assert_close(s.window_seconds, 20.0);
    assert_close(s.overall.group.rates.raw_output_tokens_per_s, 5.0);
    assert_close(s.overall.cost.unwrap().window_cost, 12.0 * 20.0 / 3600.0);
    // Once older than the window: the covered span (W plus the current partial slice).
    let s = e.summary(MIN, base + secs(62.5)).unwrap();
    assert_close(s.window_seconds, 62.5);
    let s = e.summary(MIN, base + secs(122.5)).unwrap();
    assert_close(s.window_seconds, 62.5);
    assert_eq!(s.overall.group.rates.requests, 0);
    assert_eq!(s.overall.group.rates.raw_output_tokens_per_s, 0.0);
}

#[test]
fn empty_engine_summarizes_to_nulls_and_zeros() {
    let e = Engine::new(config());
    let now = Instant::now();
    let s = e.summary(MIN, now).unwrap();
    assert_eq!(s.window_seconds, 0.0);
    assert_eq!(s.overall.group.rates.attainment, None);
    assert_eq!(s.overall.cost_per_million_effective_tokens, None);
    assert_eq!(s.overall.in_flight.mean, None);
    assert_eq!(e.gauges(now).windows.len(), 3);
    assert!(e.capacity(None, now).unwrap().levels.is_empty());
}

#[test]
fn json_keeps_the_contract_field_names() {
    let (mut e, base) = engine(config());
    seven(base).iter().for_each(|o| e.observe(o));
    let v = serde_json::to_value(e.summary(MIN, base + MIN).unwrap()).unwrap();
    assert_eq!(v["window"], "1m");
    let contract = [
        "requests",
        "slo_met",
        "attainment",
        "effective_goodput_tokens_per_s",
        "raw_output_tokens_per_s",
        "max_stable_concurrency",
        "request_goodput_per_s",
        "outcomes",
        "error_rate",
        "timeout_rate",
        "client_aborts",
        "itl_ms",
        "ttft_ms_by_input",
        "attainment_target",
        "percentile_targets",
        "stability",
    ];
    let overall = &v["overall"];
    for obj in [overall, &v["classes"][0]] {
        for k in contract {
            assert!(obj.get(k).is_some(), "missing {k}");
        }
        for k in ["ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"] {
            for p in ["p50", "p90", "p95", "p99", "max"] {
                assert!(obj[k].get(p).is_some(), "missing {k}.{p}");
            }
        }
    }
    assert_eq!(v["classes"][0]["name"], "interactive");
    assert_eq!(overall["name"], "overall");
    assert!(overall["cost_per_million_effective_tokens"].is_number());
    assert_eq!(overall["outcomes"]["client_abort"], 1);
    assert_eq!(overall["outcomes"]["upstream_reset"], 0);
    assert!(overall["ttft_ms_by_input"]["<=1k"]["p95"].is_number());
    assert!(overall["ttft_ms_by_input"][">64k"]["p95"].is_null());
    assert_eq!(overall["cost"]["components"]["hardware"], 10.0);
    for k in [
        "currency",
        "per_hour",
        "window_cost",
        "cost_per_million_raw_tokens",
        "wasted_share",
    ] {
        assert!(overall["cost"].get(k).is_some(), "missing cost.{k}");
    }
    assert!(
        overall["cost"]
            .get("cost_per_stable_user_per_month")
            .is_some()
    );
    for k in ["mean", "peak"] {
        assert!(overall["in_flight"].get(k).is_some());
    }
    let st = &overall["stability"];
    for k in [
        "points",
        "throughput_drift",
        "p99_ttft_jitter",
        "short_ttft_with_long_in_flight",
        "short_ttft_without",
    ] {
        assert!(st.get(k).is_some(), "missing stability.{k}");
    }
    assert!(
        v["classes"][0].get("cost").is_none(),
        "cost is overall only"
    );
    assert_eq!(v["classes"][0]["percentile_targets"][0]["metric"], "ttft");
}

#[test]
fn rejections_and_client_errors_are_rated_and_error_rate_max_is_checked() {
    let mut cfg = config();
    cfg.classes[1].error_rate_max = Some(0.2);
    let (mut e, base) = engine(cfg);
    let b = |at, met, outcome| Observation {
        class: "batch",
        slo_met: met,
        outcome,
        ..ob(base, at)
    };
    for o in [
        b(5.0, Some(true), Outcome::Ok),
        b(10.0, Some(false), Outcome::Rejected),
        b(15.0, None, Outcome::ClientError),
        b(20.0, Some(false), Outcome::UpstreamError),
    ] {
        e.observe(&o);
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    let g = group(&s, "batch");
    assert_close(g.rates.attainment.unwrap(), 1.0 / 3.0);
    assert_close(g.rates.rejection_rate.unwrap(), 0.25);
    assert_close(g.rates.client_error_rate.unwrap(), 0.25);
    assert_close(g.rates.error_rate.unwrap(), 0.25);
    assert_eq!(
        (g.error_rate_max, g.error_rate_holds),
        (Some(0.2), Some(false))
    );
    let i = group(&s, "interactive");
    assert_eq!((i.error_rate_max, i.error_rate_holds), (None, None));
    let json = serde_json::to_value(&s).unwrap();
    let batch = &json["classes"][1];
    for key in [
        "rejection_rate",
        "error_rate",
        "error_rate_max",
        "error_rate_holds",
    ] {
        assert!(batch.get(key).is_some(), "{key} in {batch}");
    }
    assert_eq!(batch["outcomes"]["rejected"], 1);
}

#[test]
fn misses_by_cause_finish_reasons_and_input_rate() {
    let (mut e, base) = engine(config());
    let i = |at, met, cause, finish| Observation {
        slo_met: met,
        miss_cause: cause,
        finish_reason: finish,
        input_tokens: Some(600),
        ..ob(base, at)
    };
    for o in [
        i(5.0, Some(true), None, Some(FinishReason::Stop)),
        i(
            10.0,
            Some(false),
            Some(MissCause::Ttft),
            Some(FinishReason::Length),
        ),
        i(
            15.0,
            Some(false),
            Some(MissCause::Ttft),
            Some(FinishReason::Stop),
        ),
        i(20.0, Some(false), Some(MissCause::Rejected), None),
    ] {
        e.observe(&o);
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    let r = &group(&s, "interactive").rates;
    assert_eq!(r.miss_reasons.get(MissCause::Ttft), 2);
    assert_eq!(r.miss_reasons.get(MissCause::Rejected), 1);
    assert_eq!(r.miss_reasons.get(MissCause::Tpot), 0);
    assert_eq!(r.finish_reasons.get(FinishReason::Stop), 2);
    assert_close(r.truncation_rate.unwrap(), 1.0 / 3.0);
    assert_eq!(r.input_tokens, 2400);
    assert_close(r.input_tokens_per_s, 2400.0 / 60.0);
    assert_eq!(s.overall.group.rates.miss_reasons.get(MissCause::Ttft), 2);
    let json = serde_json::to_value(&s).unwrap();
    let g = &json["classes"][0];
    assert_eq!(g["miss_reasons"]["ttft"], 2, "{g}");
    assert_eq!(g["miss_reasons"]["upstream_reset"], 0);
    assert_eq!(g["finish_reasons"]["length"], 1);
    assert!(g["input_tokens_per_s"].is_number());
}

#[test]
fn e2e_by_output_length_and_ttft_by_prefix_cache() {
    let (mut e, base) = engine(config());
    let i = |at, out, e2e, cached| Observation {
        output_tokens: Some(out),
        e2e_ms: e2e,
        ttft_ms: Some(if cached == Some(0) { 300.0 } else { 40.0 }),
        cached_input_tokens: cached,
        ..ob(base, at)
    };
    for o in [
        i(5.0, 100, 1000.0, Some(0)),
        i(10.0, 400, 4000.0, Some(512)),
        i(15.0, 3000, 30000.0, None),
    ] {
        e.observe(&o);
    }
    let s = e.summary(MIN, base + MIN).unwrap();
    let g = group(&s, "interactive");
    let by_out: Vec<(&str, Option<f64>)> = g
        .e2e_ms_by_output
        .0
        .iter()
        .map(|(k, p)| (k.as_str(), p.p50))
        .collect();
    assert_eq!(by_out.len(), 4);
    assert_eq!(by_out[3].0, ">2k");
    assert_hdr(by_out[0].1, 1000.0);
    assert_hdr(by_out[1].1, 4000.0);
    assert_eq!(by_out[2].1, None);
    assert_hdr(by_out[3].1, 30000.0);
    let cache = &g.ttft_ms_by_cache.0;
    assert_eq!((cache[0].0.as_str(), cache[1].0.as_str()), ("hit", "miss"));
    assert_hdr(cache[0].1.p50, 40.0);
    assert_hdr(cache[1].1.p50, 300.0);
    assert_eq!(g.rates.cached_input_tokens, 512);
    let json = serde_json::to_value(&s).unwrap();
    assert!(json["classes"][0]["e2e_ms_by_output"]["<=128"]["p50"].is_number());
    assert!(json["classes"][0]["ttft_ms_by_cache"]["miss"]["p50"].is_number());
}

/// Usage prices alone (a hosted API), then beside the hours, on the same seven requests:
/// 3,500 input tokens (500 each), 1,050 output tokens, 7 requests in 60 s.
#[test]
fn usage_prices_cost_the_window_s_traffic() {
    let usage = crate::config::cost::UsagePrices {
        per_million_input_tokens: Some(2.0),
        per_million_output_tokens: Some(10.0),
        per_request: Some(0.01),
        ..Default::default()
    };
    let mut cfg = config();
    cfg.cost = Some(CostConfig {
        currency: "USD".into(),
        per_hour: 0.0,
        components: vec![],
        usage,
    });
    let (mut e, base) = engine(cfg);
    seven(base).iter().for_each(|o| e.observe(o));
    let s = e.summary(MIN, base + MIN).unwrap();
    let c = s.overall.cost.as_ref().unwrap();
    // 3,500 × 2 / 1e6 + 1,050 × 10 / 1e6 + 7 × 0.01 = 0.007 + 0.0105 + 0.07.
    let used = 0.0875;
    assert_close(c.window_usage_cost.unwrap(), used);
    assert_close(c.window_cost, used);
    assert_close(
        c.cost_per_million_effective_tokens.unwrap(),
        used / 700.0 * 1e6,
    );
    assert_close(c.cost_per_million_raw_tokens.unwrap(), used / 1050.0 * 1e6);
    assert_close(c.cost_per_request.unwrap(), used / 7.0);
    let g = e.gauges(base + MIN);
    assert_close(
        g.windows[0].cost_per_million_effective_tokens.unwrap(),
        used / 700.0 * 1e6,
    );

    // Beside 12 per hour (0.2 for the minute).
    let mut cfg = config();
    if let Some(c) = cfg.cost.as_mut() {
        c.usage = usage;
    }
    let (mut e, base) = engine(cfg);
    seven(base).iter().for_each(|o| e.observe(o));
    let s = e.summary(MIN, base + MIN).unwrap();
    let c = s.overall.cost.as_ref().unwrap();
    assert_close(c.window_cost, 0.2 + used);
    assert_close(
        c.cost_per_million_effective_tokens.unwrap(),
        (0.2 + used) / 700.0 * 1e6,
    );
    let json = serde_json::to_value(c).unwrap();
    assert_eq!(json["usage"]["per_million_output_tokens"], 10.0);
}
