//! The shadow's own metrics: mirrored requests by outcome, copies not sent or not
//! finished by reason, and mirrored requests under way (from the copy being taken to its
//! record being written, [`ShadowMetrics::hold`]). Names in [`crate::metrics::names`].

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::answers::PairResult;
use crate::{
    measure::{Held, Outcome},
    metrics::names,
};

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
    /// The answer outgrew `shadow.max_answer_bytes` and was cut (the record says
    /// `shadow_cut = "too_large"`).
    TooLarge,
    /// `shadow.record_queue` records were already waiting: this one was not written.
    Backlog,
    /// The proxy stopped while the copy was under way, or its record was still waiting.
    Shutdown,
    /// The answers' comparison queue was full: an answer (the primary's or a copy's) was
    /// not compared. Its record is written as usual.
    AnswerBacklog,
}

impl DropReason {
    pub const ALL: [DropReason; 9] = [
        DropReason::InFlight,
        DropReason::BodyTooLarge,
        DropReason::BodyIncomplete,
        DropReason::Unreachable,
        DropReason::Timeout,
        DropReason::TooLarge,
        DropReason::Backlog,
        DropReason::Shutdown,
        DropReason::AnswerBacklog,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::InFlight => "in_flight",
            DropReason::BodyTooLarge => "body_too_large",
            DropReason::BodyIncomplete => "body_incomplete",
            DropReason::Unreachable => "unreachable",
            DropReason::Timeout => "timeout",
            DropReason::TooLarge => "too_large",
            DropReason::Backlog => "backlog",
            DropReason::Shutdown => "shutdown",
            DropReason::AnswerBacklog => "answer_backlog",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// Results of comparing a candidate's answer with the primary's. Closed set.
pub const ANSWER_RESULTS: [&str; 3] = ["same", "differs", "close"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct ShadowMetrics {
    pub requests: Family<OutcomeLabel, Counter>,
    pub dropped: Family<ReasonLabel, Counter>,
    pub in_flight: Gauge,
    pub answer_pairs: Family<ResultLabel, Counter>,
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
        for result in ANSWER_RESULTS {
            let _ = m.answer_pairs.get_or_create(&ResultLabel { result });
        }
        for r in DropReason::ALL {
            let _ = m.dropped.get_or_create(&ReasonLabel { reason: r.as_str() });
        }
        names::SHADOW_REQUESTS.register(registry, m.requests.clone());
        names::SHADOW_DROPPED.register(registry, m.dropped.clone());
        names::SHADOW_ANSWER_PAIRS.register(registry, m.answer_pairs.clone());
        names::SHADOW_IN_FLIGHT.register(registry, m.in_flight.clone());
        m
    }

    /// A candidate's answer was compared with the primary's (and, with log-probabilities,
    /// its tokens with the secondary's).
    pub fn compared(&self, result: PairResult) {
        self.answer_pairs
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    pub fn dropped(&self, reason: DropReason) {
        self.counter(reason).inc();
    }

    /// The drop counter of `reason`, to be counted elsewhere (the shadow's recorder).
    pub fn counter(&self, reason: DropReason) -> Counter {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .clone()
    }

    /// A copy is taken: it is in flight until its record is written or it is given up.
    /// Lost on the way (a task the runtime drops at exit, a record still queued at
    /// shutdown), it counts as `shutdown`.
    pub fn hold(&self) -> Held {
        Held::new(self.in_flight.clone(), self.counter(DropReason::Shutdown))
    }

    /// The copy holding `held` ends without a record, for `reason`.
    pub fn give_up(&self, held: Held, reason: DropReason) {
        self.dropped(reason);
        held.settle();
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
            .map(|r| (r.as_str(), self.counter(*r).get()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_in_flight_until_it_is_written_or_given_up() {
        let m = ShadowMetrics::default();
        let (written, unreachable, lost) = (m.hold(), m.hold(), m.hold());
        assert_eq!(m.in_flight.get(), 3);
        written.settle();
        m.give_up(unreachable, DropReason::Unreachable);
        assert_eq!(m.in_flight.get(), 1);
        drop(lost);
        assert_eq!(m.in_flight.get(), 0);
        let drops: Vec<_> = m.drops().into_iter().filter(|(_, n)| *n > 0).collect();
        assert_eq!(drops, [("unreachable", 1), ("shutdown", 1)]);
    }

    #[test]
    fn every_reason_is_exported_from_the_start() {
        let mut registry = Registry::default();
        let _ = ShadowMetrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        for r in DropReason::ALL {
            let series = format!(
                "goodput_shadow_dropped_total{{reason=\"{}\"}} 0",
                r.as_str()
            );
            assert!(text.contains(&series), "{series}: {text}");
        }
    }
}
