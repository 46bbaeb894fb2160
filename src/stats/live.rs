//! The live SLO view: the windowed [`Engine`] behind a lock shared by the aggregator (which
//! feeds it) and the admin API (which reads it), its configuration built from the validated
//! `[slo]` and `[cost]` sections, and the Prometheus gauges refreshed from it.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Instant,
};

use super::{
    WindowMetrics,
    engine::{self, Engine, EngineConfig},
};
use crate::{
    config::Config,
    metrics::{ClassLabel, ClassWindow, CurrencyLabel, WindowCurrency},
};

/// The engine, shared. Cheap to clone.
#[derive(Clone)]
pub struct Live {
    engine: Arc<Mutex<Engine>>,
}

impl Live {
    pub fn new(cfg: &Config) -> Live {
        Live {
            engine: Arc::new(Mutex::new(Engine::new(engine_config(cfg)))),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The engine's view of the configuration.
pub fn engine_config(cfg: &Config) -> EngineConfig {
    let s = &cfg.slo;
    EngineConfig {
        windows: s.windows.clone(),
        classes: s
            .all_classes()
            .map(|c| engine::ClassConfig {
                name: c.name.to_string(),
                attainment: c.attainment,
                error_rate_max: c.error_rate_max,
                percentile_targets: c
                    .percentiles
                    .iter()
                    .map(|p| engine::PercentileTarget {
                        metric: p.metric,
                        quantile: p.quantile,
                        max_ms: p.max_ms,
                    })
                    .collect(),
            })
            .collect(),
        input_buckets: s.input_buckets.clone(),
        min_samples: s.min_samples,
        history: s.history,
        timeline_points: s.timeline_points,
        cost: cfg.cost.as_ref().map(|c| engine::CostConfig {
            currency: c.currency.clone(),
            per_hour: c.per_hour,
            components: c.components.clone(),
            usage: c.usage,
        }),
    }
}

fn set_or_remove<L>(
    family: &prometheus_client::metrics::family::Family<
        L,
        prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    >,
    labels: L,
    value: Option<f64>,
) where
    L: Clone + std::hash::Hash + Eq + prometheus_client::encoding::EncodeLabelSet + std::fmt::Debug,
{
    match value {
        Some(v) if v.is_finite() => {
            family.get_or_create(&labels).set(v);
        }
        _ => {
            family.remove(&labels);
        }
    }
}

/// Refreshes the `target="shadow"` series of the attainment and goodput gauges from the
/// shadow's answers, per configured window and class (and `overall`).
pub fn refresh_shadow_gauges(
    book: &crate::shadow::Book,
    windows: &[(String, std::time::Duration)],
    m: &WindowMetrics,
    now: Instant,
) {
    for (label, window) in windows {
        let secs = window.as_secs_f64().max(1e-9);
        for (class, t) in book.totals(*window, now) {
            let labels = ClassWindow {
                class,
                window: label.clone(),
                target: "shadow",
            };
            let attainment = (t.judged > 0).then(|| t.met as f64 / t.judged as f64);
            set_or_remove(&m.attainment, labels.clone(), attainment);
            set_or_remove(
                &m.effective_tps,
                labels.clone(),
                Some(t.effective_tokens as f64 / secs),
            );
            set_or_remove(&m.raw_tps, labels.clone(), Some(t.raw_tokens as f64 / secs));
            set_or_remove(&m.request_goodput, labels, Some(t.met as f64 / secs));
        }
    }
}

/// Refreshes every windowed gauge from the engine.
pub fn refresh_gauges(engine: &Engine, cfg: &Config, m: &WindowMetrics, now: Instant) {
    let g = engine.gauges(now);
    for w in &g.windows {
        for c in w.classes.iter().chain(std::iter::once(&w.overall)) {
            let labels = ClassWindow {
                class: c.class.to_owned(),
                window: w.window.to_owned(),
                target: "primary",
            };
            set_or_remove(&m.attainment, labels.clone(), c.attainment);
            set_or_remove(
                &m.effective_tps,
                labels.clone(),
                Some(c.effective_tokens_per_s),
            );
            set_or_remove(&m.raw_tps, labels.clone(), Some(c.raw_tokens_per_s));
            set_or_remove(&m.request_goodput, labels, Some(c.request_goodput_per_s));
        }
        if let Some(currency) = g.currency {
            let labels = WindowCurrency {
                window: w.window.to_owned(),
                currency: currency.to_owned(),
            };
            set_or_remove(
                &m.cost_per_m_effective,
                labels,
                w.cost_per_million_effective_tokens,
            );
        }
    }
    let stable = g
        .max_stable_concurrency
        .iter()
        .copied()
        .chain(std::iter::once((
            "overall",
            g.overall_max_stable_concurrency,
        )));
    for (class, value) in stable {
        let labels = ClassLabel {
            class: class.to_owned(),
        };
        match value {
            Some(v) => {
                m.max_stable.get_or_create(&labels).set(i64::from(v));
            }
            None => {
                m.max_stable.remove(&labels);
            }
        }
    }
    for (class, value) in g.knee_concurrency.iter().copied() {
        let labels = ClassLabel {
            class: class.to_owned(),
        };
        match value {
            Some(v) => {
                m.knee.get_or_create(&labels).set(i64::from(v));
            }
            None => {
                m.knee.remove(&labels);
            }
        }
    }
    for c in cfg.slo.all_classes() {
        m.attainment_target
            .get_or_create(&ClassLabel {
                class: c.name.to_string(),
            })
            .set(c.attainment);
    }
    if let Some(cost) = &cfg.cost {
        m.cost_per_hour
            .get_or_create(&CurrencyLabel {
                currency: cost.currency.clone(),
            })
            .set(cost.per_hour);
    }
}
