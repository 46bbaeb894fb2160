//! Self-calibration's metrics ([`CalibrationMetrics`]): the engine's means beside the
//! proxy's, scrape health, and where the engine's requests spent their time. Names and help
//! texts are in [`crate::metrics::names`].

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::{
    CalibrationLabels, CalibrationSampleLabels, EngineModel, ModelPhase, ScrapeResultLabel, names,
};

/// Self-calibration against the engine's own metrics and the attribution of where time
/// goes (`[calibration]`).
#[derive(Clone, Debug)]
pub struct CalibrationMetrics {
    pub calibration_engine: Family<CalibrationLabels, Gauge<f64, AtomicU64>>,
    pub calibration_proxy: Family<CalibrationLabels, Gauge<f64, AtomicU64>>,
    pub calibration_difference: Family<CalibrationLabels, Gauge<f64, AtomicU64>>,
    pub calibration_samples: Family<CalibrationSampleLabels, Gauge>,
    pub calibration_scrapes: Family<ScrapeResultLabel, Counter>,
    pub calibration_resets: Counter,
    pub calibration_up: Gauge,
    pub attribution: Family<ModelPhase, Gauge<f64, AtomicU64>>,
    pub engine_kv_cache: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub engine_waiting: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub engine_running: Family<EngineModel, Gauge<f64, AtomicU64>>,
    pub engine_preemptions: Family<EngineModel, Gauge<f64, AtomicU64>>,
}

impl CalibrationMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> CalibrationMetrics {
        let m = CalibrationMetrics {
            calibration_engine: Family::default(),
            calibration_proxy: Family::default(),
            calibration_difference: Family::default(),
            calibration_samples: Family::default(),
            calibration_scrapes: Family::default(),
            calibration_resets: Counter::default(),
            calibration_up: Gauge::default(),
            attribution: Family::default(),
            engine_kv_cache: Family::default(),
            engine_waiting: Family::default(),
            engine_running: Family::default(),
            engine_preemptions: Family::default(),
        };
        names::CALIBRATION_ENGINE.register(registry, m.calibration_engine.clone());
        names::CALIBRATION_PROXY.register(registry, m.calibration_proxy.clone());
        names::CALIBRATION_DIFFERENCE.register(registry, m.calibration_difference.clone());
        names::CALIBRATION_SAMPLES.register(registry, m.calibration_samples.clone());
        names::CALIBRATION_SCRAPES.register(registry, m.calibration_scrapes.clone());
        names::CALIBRATION_RESETS.register(registry, m.calibration_resets.clone());
        names::CALIBRATION_UP.register(registry, m.calibration_up.clone());
        names::ATTRIBUTION.register(registry, m.attribution.clone());
        names::ENGINE_KV_CACHE.register(registry, m.engine_kv_cache.clone());
        names::ENGINE_WAITING.register(registry, m.engine_waiting.clone());
        names::ENGINE_RUNNING.register(registry, m.engine_running.clone());
        names::ENGINE_PREEMPTIONS.register(registry, m.engine_preemptions.clone());
        m
    }
}
