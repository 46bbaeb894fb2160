//! The windowed SLO, goodput, cost and capacity gauges ([`WindowMetrics`]), refreshed by
//! the aggregator. Names and help texts are in [`crate::metrics::names`].

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::{ClassLabel, ClassWindow, CurrencyLabel, WindowCurrency, names};

/// The windowed SLO, goodput, cost and capacity gauges the aggregator refreshes.
#[derive(Clone, Debug)]
pub struct WindowMetrics {
    pub attainment: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub attainment_target: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    pub effective_tps: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub raw_tps: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub request_goodput: Family<ClassWindow, Gauge<f64, AtomicU64>>,
    pub max_stable: Family<ClassLabel, Gauge>,
    pub knee: Family<ClassLabel, Gauge>,
    pub cost_per_m_effective: Family<WindowCurrency, Gauge<f64, AtomicU64>>,
    pub cost_per_hour: Family<CurrencyLabel, Gauge<f64, AtomicU64>>,
}

impl WindowMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> WindowMetrics {
        let m = WindowMetrics {
            attainment: Family::default(),
            attainment_target: Family::default(),
            effective_tps: Family::default(),
            raw_tps: Family::default(),
            request_goodput: Family::default(),
            max_stable: Family::default(),
            knee: Family::default(),
            cost_per_m_effective: Family::default(),
            cost_per_hour: Family::default(),
        };
        names::ATTAINMENT.register(registry, m.attainment.clone());
        names::ATTAINMENT_TARGET.register(registry, m.attainment_target.clone());
        names::EFFECTIVE_TPS.register(registry, m.effective_tps.clone());
        names::RAW_TPS.register(registry, m.raw_tps.clone());
        names::REQUEST_GOODPUT.register(registry, m.request_goodput.clone());
        names::MAX_STABLE.register(registry, m.max_stable.clone());
        names::KNEE.register(registry, m.knee.clone());
        names::COST_PER_M_EFFECTIVE.register(registry, m.cost_per_m_effective.clone());
        names::COST_PER_HOUR.register(registry, m.cost_per_hour.clone());
        m
    }
}
