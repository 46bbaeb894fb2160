//! Every exported metric's name, help text and unit in one place ([`names`]), and the label
//! sets they carry. Each subsystem owns the struct of its handles and registers it with
//! [`Spec::register`], in one registry that the wiring (`run`) creates and passes down (no
//! globals): `measure::RequestMetrics`, `stats::WindowMetrics`, `profile::ProfileMetrics`,
//! `calibrate::CalibrationMetrics`, `otlp::OtlpMetrics`, `proxy::LimitMetrics`,
//! `tokenize::Fallbacks`, `admin::AdminMetrics` and `run::ReloadMetrics`. Names follow
//! `<namespace>_<name>_<unit>[_total]`; the unit and `_total` suffixes are added by
//! prometheus-client from the registration. Where the OpenTelemetry GenAI semantic
//! conventions define a metric, its name is used. docs/METRICS.md lists every name.

use std::sync::Arc;

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{
        MetricType,
        family::{Family, MetricConstructor},
        histogram::{Histogram, NativeHistogramConfig},
    },
    registry::{Metric, Registry, Unit},
};

/// The unit a metric is registered with (its name then ends in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricUnit {
    Seconds,
    Ratio,
}

/// One exported metric: its name (without the suffixes the library adds), help text and
/// unit.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub name: &'static str,
    pub help: &'static str,
    pub unit: Option<MetricUnit>,
}

impl Spec {
    /// Registers `metric` under this name, help text and unit. Its `# HELP` and `# TYPE`
    /// lines are written even while it has no series, as they always were: dashboards and
    /// the documentation check read them from a fresh instance.
    pub fn register(&self, registry: &mut Registry, metric: impl Metric) {
        let metric = Described(metric);
        match self.unit {
            None => registry.register(self.name, self.help, metric),
            Some(MetricUnit::Seconds) => {
                registry.register_with_unit(self.name, self.help, Unit::Seconds, metric)
            }
            Some(MetricUnit::Ratio) => registry.register_with_unit(
                self.name,
                self.help,
                Unit::Other("ratio".into()),
                metric,
            ),
        }
    }
}

/// A metric whose descriptor is encoded even when it has no series (the library leaves
/// an empty family out of the exposition; the protobuf exposition drops them itself).
#[derive(Debug)]
struct Described<M>(M);

impl<M: EncodeMetric> EncodeMetric for Described<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// Boundaries of the client-inference latencies (`gen_ai.client.inference.*`, on `/metrics`
/// and over OTLP): 1 ms to 20 minutes, because reasoning calls run for many minutes.
pub const INFERENCE_BUCKETS: [f64; 20] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68, 655.36, 1200.0,
];

/// A family of histograms that all share one shape.
pub type HistogramFamily<L> = Family<L, Histogram, HistogramShape>;

/// How native buckets are kept (`[metrics]`): boundaries grow by `2^(2^-schema)`, and a
/// series holding more than `max_buckets` halves its resolution (schema - 1) until it fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeBuckets {
    pub schema: i8,
    pub max_buckets: u32,
}

impl NativeBuckets {
    /// The largest relative error of a value read back from its bucket at `schema`: half
    /// the bucket's width around its (geometric) middle, `(f - 1) / (f + 1)` with
    /// `f = 2^(2^-schema)`.
    pub fn relative_error(schema: i8) -> f64 {
        let f = 2f64.powf(2f64.powi(-i32::from(schema)));
        (f - 1.0) / (f + 1.0)
    }
}

/// The SLO thresholds (seconds) each latency metric's classic buckets get as edges, so the
/// share of a series at or under a threshold is read from a bucket, never interpolated.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyThresholds {
    pub ttft: Vec<f64>,
    pub tpot: Vec<f64>,
    pub itl: Vec<f64>,
    pub e2e: Vec<f64>,
}

/// What the latency histograms are built with: native buckets (`None`: classic only) and
/// the thresholds their classic buckets include.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramOptions {
    pub native: Option<NativeBuckets>,
    pub thresholds: LatencyThresholds,
}

/// The histograms of one family: classic edges, plus native buckets when set.
#[derive(Clone, Debug)]
pub struct HistogramShape {
    classic: Arc<[f64]>,
    native: Option<NativeHistogramConfig>,
}

impl HistogramShape {
    /// Classic buckets at `edges` only.
    pub fn classic(edges: &[f64]) -> HistogramShape {
        HistogramShape {
            classic: edges.into(),
            native: None,
        }
    }

    /// Classic buckets at `edges` and at every one of `thresholds` not among them, beside
    /// native buckets as `native` says.
    pub fn latency(
        edges: &[f64],
        thresholds: &[f64],
        native: Option<NativeBuckets>,
    ) -> HistogramShape {
        HistogramShape {
            classic: with_edges(edges, thresholds).into(),
            native: native.map(|n| {
                NativeHistogramConfig::with_schema(n.schema).max_buckets(n.max_buckets as usize)
            }),
        }
    }

    /// The classic edges, ascending.
    pub fn edges(&self) -> &[f64] {
        &self.classic
    }
}

impl MetricConstructor<Histogram> for HistogramShape {
    fn new_metric(&self) -> Histogram {
        let edges = self.classic.iter().copied();
        match self.native {
            Some(native) => Histogram::new_classic_and_native(edges, native),
            None => Histogram::new(edges),
        }
    }
}

/// `edges` with each finite positive `extra` value inserted, ascending, without repeats.
fn with_edges(edges: &[f64], extra: &[f64]) -> Vec<f64> {
    let mut all: Vec<f64> = edges
        .iter()
        .chain(extra.iter().filter(|v| v.is_finite() && **v > 0.0))
        .copied()
        .collect();
    all.sort_by(f64::total_cmp);
    all.dedup();
    all
}

pub mod names;

/// A model or class name in a label set: shared, so that a request's labels cost a
/// reference count, not a string (the names come interned: [`crate::slo::SloClass`]'s
/// and the aggregator's model labels).
pub type Name = std::sync::Arc<str>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelApi {
    pub model: Name,
    pub api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub model: Name,
    pub api: &'static str,
    pub class: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub model: Name,
    pub api: &'static str,
    pub outcome: &'static str,
    pub class: Name,
    /// `met`, `missed`, or `excluded` (client aborts and client errors, not counted in
    /// attainment).
    pub slo: &'static str,
    /// The response status's class: `2xx`, `4xx`, `5xx` (`1xx`, `3xx`, or `none` when no
    /// response head was sent).
    pub status_class: &'static str,
}

/// A request that is no generation (`api` = `unknown`, `embeddings`, `upgrade`), passed
/// through unjudged; `status_class` as on [`RequestLabels`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassthroughLabels {
    pub api: &'static str,
    pub status_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model: Name,
    pub api: &'static str,
    pub class: Name,
    pub gen_ai_token_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassSlo {
    pub class: Name,
    pub slo: &'static str,
}

/// A class and a bounded reason: a miss cause (`ttft`, `tpot`, `e2e`, `rejected`,
/// `upstream_error`, `upstream_reset`, `timeout`, `proxy_error`) or a finish reason
/// (`stop`, `length`, `tool_calls`, `content_filter`, `other`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassReason {
    pub class: Name,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassWindow {
    pub class: String,
    pub window: String,
    /// `primary`, or `shadow` for a candidate's mirrored answers (`[shadow]`).
    pub target: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowCurrency {
    pub window: String,
    pub currency: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CurrencyLabel {
    pub currency: String,
}

/// Why a token count fell back: `queue_full`, `tokenize_error`, `text_limit`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// An OTLP signal: `metrics` or `traces`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    pub signal: &'static str,
}

/// Why a profile record was dropped: `queue_full`, `disk`, `closed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropReasonLabel {
    pub reason: &'static str,
}

/// A drift dimension (`input_length`, `output_length`, `arrival_rate`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DimensionLabel {
    pub dimension: &'static str,
}

/// What the upstream says it is (`goodput_upstream_info`): `unknown` where it did not
/// say, long values (a weights path) hashed, so the set stays small.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamInfoLabels {
    pub engine: String,
    pub version: String,
    pub model: String,
    pub revision: String,
}

/// A drift dimension and the statistic measuring it (`psi`, `ks`, `tvd`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    pub dimension: &'static str,
    pub statistic: &'static str,
}

/// An engine model (`model_name`, `""` when it gives none) and a calibrated quantity
/// (`ttft`, `e2e`, `tpot`, `itl`, `queue`, `prefill`, `decode`, `inference`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CalibrationLabels {
    pub model: String,
    pub metric: &'static str,
}

/// As [`CalibrationLabels`], and whose observations: `engine` or `proxy`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CalibrationSampleLabels {
    pub model: String,
    pub metric: &'static str,
    pub source: &'static str,
}

/// How a calibration scrape ended: `ok`, `unreachable`, `timeout`, `http_error`,
/// `transport_error`, `too_large`, `invalid`, `no_engine_metrics`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScrapeResultLabel {
    pub result: &'static str,
}

/// The bound that turned work away, named by its config key: `server.max_connections`,
/// `server.http2_max_control_frames_per_second`, `server.max_request_header_bytes`, `server.request_body_timeout`,
/// `upstream.max_connections`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: &'static str,
}

/// A share of the open-files budget: `open_files` (the whole), `client_connections`,
/// `upstream_connections`, `reserve`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShareLabel {
    pub share: &'static str,
}

/// What a connection closed for room was waiting for: `first_request` (it never sent a
/// complete request head) or `next_request` (idle between requests).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabel {
    pub waiting: &'static str,
}

/// An engine model (`model_name`, `""` when it gives none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineModel {
    pub model: String,
}

/// An engine model and where its requests' time went: `queue`, `prefill`, `decode`,
/// `outside_engine`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelPhase {
    pub model: String,
    pub phase: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_become_edges_in_order() {
        let shape = HistogramShape::latency(&[0.1, 0.5, 1.0], &[0.25, 0.5, f64::NAN, -1.0], None);
        assert_eq!(shape.edges(), &[0.1, 0.25, 0.5, 1.0]);
    }

    #[test]
    fn schema_six_keeps_within_one_percent() {
        assert!(NativeBuckets::relative_error(6) < 0.01);
        assert!(NativeBuckets::relative_error(5) > 0.01);
        assert!((NativeBuckets::relative_error(3) - 0.0433).abs() < 1e-3);
    }

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for spec in names::ALL {
            assert!(seen.insert(spec.name), "{} twice", spec.name);
            assert!(
                spec.name.starts_with("goodput_") || spec.name.starts_with("gen_ai_"),
                "{}",
                spec.name
            );
            assert!(
                spec.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                spec.name
            );
            assert!(
                !spec.help.is_empty() && !spec.help.ends_with('.'),
                "{}",
                spec.name
            );
        }
    }
}
