//! The aggregator side of the measurement path: it receives what the data path saw,
//! builds each [`crate::measure::RequestRecord`], and is the one end-of-request place that
//! updates the metrics, writes the access log and keeps the recent-requests ring.

mod aggregator;
mod labels;
mod recent;

pub use aggregator::Aggregator;
pub use labels::ModelLabels;
pub use recent::Recent;
