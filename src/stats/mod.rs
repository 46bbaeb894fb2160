//! The aggregator side of the measurement path: it receives what the data path saw,
//! builds each [`crate::measure::RequestRecord`], and is the one end-of-request place that
//! updates the metrics, writes the access log and keeps the recent-requests ring; and the
//! [`engine`] of sliding windows behind the SLO, goodput, cost and capacity views.

mod access;
mod aggregator;
pub mod engine;
mod labels;
mod live;
mod metrics;
mod phases;
mod profiling;
mod recent;
mod sink;

pub use aggregator::{Aggregator, AggregatorMetrics};
pub use labels::ModelLabels;
pub use live::{Live, engine_config};
pub use metrics::WindowMetrics;
pub use phases::{InferenceMetrics, PHASE_BUCKETS, PhaseMetrics};
pub use profiling::{DriftView, Profiling};
pub use recent::Recent;
pub use sink::Sink;
