//! Engine tests over synthetic traffic. Time is `base + offset`: each test first samples
//! in-flight at `base`, which fixes the engine's epoch there, so slice boundaries and window
//! spans are round numbers that can be computed by hand.

mod capacity;
mod extremes;
mod memory;
mod reload;
mod stability;
mod summary;
mod timeline;
mod window;

use std::time::{Duration, Instant};

use super::*;
use crate::measure::Outcome;

pub const MIN: Duration = Duration::from_secs(60);
pub const M5: Duration = Duration::from_secs(300);
pub const HOUR: Duration = Duration::from_secs(3600);

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

pub fn class(name: &str, attainment: f64, targets: Vec<PercentileTarget>) -> ClassConfig {
    ClassConfig {
        error_rate_max: None,
        name: name.into(),
        attainment,
        percentile_targets: targets,
    }
}

pub fn p95_ttft(max_ms: f64) -> PercentileTarget {
    PercentileTarget {
        metric: LatencyMetric::Ttft,
        quantile: 0.95,
        max_ms,
    }
}

/// 1m / 5m / 1h; interactive (0.99, P95 TTFT ≤ 800 ms), batch (0.9), default; the usual
/// input buckets; 20 samples per level; 6h history; 12 USD per hour.
pub fn config() -> EngineConfig {
    EngineConfig {
        windows: vec![MIN, M5, HOUR],
        classes: vec![
            class("interactive", 0.99, vec![p95_ttft(800.0)]),
            class("batch", 0.9, vec![]),
            class(DEFAULT_CLASS, 0.99, vec![]),
        ],
        input_buckets: vec![1024, 4096, 16384, 65536],
        min_samples: 20,
        history: Duration::from_secs(6 * 3600),
        timeline_points: 720,
        cost: Some(CostConfig {
            currency: "USD".into(),
            per_hour: 12.0,
            components: vec![("hardware".into(), 10.0), ("power".into(), 2.0)],
            usage: Default::default(),
        }),
    }
}

/// An engine whose epoch is `base`.
pub fn engine(cfg: EngineConfig) -> (Engine, Instant) {
    let base = Instant::now();
    let mut e = Engine::new(cfg);
    e.sample_in_flight(base, 0);
    (e, base)
}

/// A met, OK interactive request of 100 output tokens finishing at `base + at_s`, with a
/// 1 s e2e (started 1 s earlier, or at `base` if that is sooner).
pub fn ob(base: Instant, at_s: f64) -> Observation<'static> {
    let finished = base + secs(at_s);
    Observation {
        started: finished
            .checked_sub(secs(1.0))
            .filter(|s| *s >= base)
            .unwrap_or(base),
        finished,
        class: "interactive",
        model: "llama",
        outcome: Outcome::Ok,
        slo_met: Some(true),
        ttft_ms: Some(100.0),
        tpot_ms: Some(20.0),
        e2e_ms: 1000.0,
        itl_us: &[],
        input_tokens: Some(500),
        output_tokens: Some(100),
        concurrency_at_start: 1,
        long_in_flight_at_start: false,
        miss_cause: None,
        finish_reason: Some(FinishReason::Stop),
        cached_input_tokens: None,
        engine_parts: Default::default(),
        miss_component: None,
    }
}

pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[track_caller]
pub fn assert_close(a: f64, b: f64) {
    assert!(close(a, b), "{a} != {b}");
}

/// Within HDR precision (2 significant figures: 1%).
#[track_caller]
pub fn assert_hdr(got: Option<f64>, want: f64) {
    let got = got.unwrap_or(f64::NAN);
    assert!(
        (got - want).abs() <= want * 0.01 + 0.001,
        "{got} not within 1% of {want}"
    );
}

pub fn group<'a>(s: &'a Summary, name: &str) -> &'a Group {
    s.classes.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn the_engine_can_move_into_the_aggregator_task() {
    fn send<T: Send + 'static>() {}
    send::<Engine>();
    send::<Summary>();
    send::<Capacity>();
}
