//! The shadow's own metrics: mirrored requests by outcome, copies not sent or not
//! finished by reason, and mirrored requests under way. Names in [`crate::metrics::names`].

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{measure::Outcome, metrics::names};

/// Why a mirrored copy was not sent, or not read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// `shadow.max_in_flight` copies were already under way.
    InFlight,
    /// The body was larger than `measure.request_inspect_limit`.
    BodyTooLarge,
    /// The client's body failed or ended early: there was nothing complete to copy.
    BodyIncomplete,
    /// The candidate could not be reached (connection refused, DNS, TLS).
    Unreachable,
    /// `shadow.timeout` passed before the answer's end (the record says `timeout`).
    Timeout,
    /// The proxy stopped while the copy was under way.
    Shutdown,
}

impl DropReason {
    pub const ALL: [DropReason; 6] = [
        DropReason::InFlight,
        DropReason::BodyTooLarge,
        DropReason::BodyIncomplete,
        DropReason::Unreachable,
        DropReason::Timeout,
        DropReason::Shutdown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::InFlight => "in_flight",
            DropReason::BodyTooLarge => "body_too_large",
            DropReason::BodyIncomplete => "body_incomplete",
            DropReason::Unreachable => "unreachable",
            DropReason::Timeout => "timeout",
            DropReason::Shutdown => "shutdown",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct ShadowMetrics {
    pub requests: Family<OutcomeLabel, Counter>,
    pub dropped: Family<ReasonLabel, Counter>,
    pub in_flight: Gauge,
}

impl ShadowMetrics {
    /// Registers the families; every outcome and reason is exported from the start (at 0),
    /// so that rates over them are defined before the first one.
    pub fn register(registry: &mut Registry) -> ShadowMetrics {
        let m = ShadowMetrics::default();
        for o in Outcome::ALL {
            let _ = m.requests.get_or_create(&OutcomeLabel {
                outcome: o.as_str(),
            });
        }
        for r in DropReason::ALL {
            let _ = m.dropped.get_or_create(&ReasonLabel { reason: r.as_str() });
        }
        names::SHADOW_REQUESTS.register(registry, m.requests.clone());
        names::SHADOW_DROPPED.register(registry, m.dropped.clone());
        names::SHADOW_IN_FLIGHT.register(registry, m.in_flight.clone());
        m
    }

    pub fn dropped(&self, reason: DropReason) {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub fn answered(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Drops counted so far, by reason (for the API).
    pub fn drops(&self) -> Vec<(&'static str, u64)> {
        DropReason::ALL
            .iter()
            .map(|r| {
                let n = self
                    .dropped
                    .get_or_create(&ReasonLabel { reason: r.as_str() })
                    .get();
                (r.as_str(), n)
            })
            .collect()
    }
}
