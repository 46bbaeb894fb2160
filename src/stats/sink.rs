//! Where else judged records and the live gauges go: an export the wiring hands the
//! aggregator (OpenTelemetry, `otlp::Exporter`), so the aggregator knows none of them.

use super::engine::Gauges;
use crate::measure::RequestRecord;

/// A consumer of judged records and of the windowed gauges, fed by the aggregator off the
/// data path. Dropped when the aggregator ends (an export then sends what is left).
pub trait Sink: Send {
    /// One judged request, under its bounded `model` label; `gaps`: its inter-token gaps
    /// in microseconds.
    fn observe(&self, record: &RequestRecord, model: &str, gaps: &[u32]);

    /// Whether [`Sink::refresh`] is wanted (computing the gauges is not free).
    fn wants_gauges(&self) -> bool;

    /// The windowed gauges, at most once a second.
    fn refresh(&self, gauges: &Gauges<'_>);
}
