//! Self-calibration (`[calibration]`): the upstream engine's own latency histograms next to
//! the proxy's measurements of the same requests, so operators see the time spent outside
//! the engine (network, gateway queues, the proxy itself).
//!
//! A background task scrapes the engine's Prometheus endpoint every `interval`, keeps the
//! `_sum`/`_count` of the engine's request-latency histograms per model, and at each scrape
//! compares the engine's mean over the interval since the previous scrape with the proxy's
//! mean over the same interval (the aggregator adds every finished request to
//! [`ProxyTotals`], one uncontended lock per record). Nothing here touches the data path:
//! a slow, failing or absent endpoint costs a counter and a log line on each change of state.
//!
//! # Layout
//! - [`dcgm`]: NVIDIA dcgm-exporter's text, per GPU (GPU utilization beside KV-cache use).
//! - `exposition`: a reader of the Prometheus text format, one sample line at a time.
//! - `engines`: which engine families mean which quantity (vLLM, SGLang), and the
//!   extraction of their cumulative sums and counts per model.
//! - `proxy`: [`ProxyTotals`], the proxy's own cumulative sums and counts.
//! - `compare`: deltas between scrapes, counter resets, the comparison, the JSON status.
//! - `attribution`: where time goes per model (queue, prefill, decode, outside the engine)
//!   beside the engine's load signals.
//! - `scraper`: [`Calibrator`], the task: HTTP, timing, metrics, logs.

mod attribution;
mod compare;
pub mod dcgm;
mod engines;
pub mod exposition;
mod metrics;
mod proxy;
mod scraper;

use serde::Serialize;

pub use attribution::Attribution;
pub use compare::{CalibrationView, Comparison, Status};
pub use engines::{Engine, EngineKind, Extracted, Load};
pub use metrics::CalibrationMetrics;
pub use proxy::ProxyTotals;
pub use scraper::{Calibrator, ScrapeError, Scraper};

/// What is compared: the proxy's definitions (docs/DESIGN.md) against the engine's histogram of
/// the same name, plus the engine-only phases that explain where its time went. A closed
/// set: safe as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    /// Time to first token.
    Ttft,
    /// End-to-end request latency.
    E2e,
    /// Time per output token, one value per request.
    Tpot,
    /// Inter-token latency, one value per gap.
    Itl,
    /// Engine only: waiting in the engine's scheduler queue.
    Queue,
    /// Engine only: prefill.
    Prefill,
    /// Engine only: decode.
    Decode,
    /// Engine only: prefill + decode.
    Inference,
}

impl Quantity {
    pub const ALL: [Quantity; 8] = [
        Quantity::Ttft,
        Quantity::E2e,
        Quantity::Tpot,
        Quantity::Itl,
        Quantity::Queue,
        Quantity::Prefill,
        Quantity::Decode,
        Quantity::Inference,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Quantity::Ttft => "ttft",
            Quantity::E2e => "e2e",
            Quantity::Tpot => "tpot",
            Quantity::Itl => "itl",
            Quantity::Queue => "queue",
            Quantity::Prefill => "prefill",
            Quantity::Decode => "decode",
            Quantity::Inference => "inference",
        }
    }

    /// Whether the proxy measures this quantity itself (the others are engine-internal).
    pub fn measured_by_proxy(self) -> bool {
        matches!(
            self,
            Quantity::Ttft | Quantity::E2e | Quantity::Tpot | Quantity::Itl
        )
    }
}

/// A cumulative histogram sum (seconds) and count, as an engine or the proxy exposes it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cumulative {
    pub sum: f64,
    pub count: f64,
}

impl Cumulative {
    fn add(&mut self, other: Cumulative) {
        self.sum += other.sum;
        self.count += other.count;
    }
}
