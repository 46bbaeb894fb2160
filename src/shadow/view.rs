//! `GET /api/v1/shadow`: the shadow's state, its drops, and per class the side-by-side
//! report of the pairs of a window.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{
    Book, Shadow,
    book::ClassReport,
    report::{ANSWERS_RULE, RULE},
};
use crate::slo::Slo;

/// What the admin server reads.
#[derive(Debug, Clone)]
pub struct View {
    pub shadow: Shadow,
    pub book: Book,
}

#[derive(Debug, Serialize)]
pub struct ShadowReport {
    pub window_s: f64,
    /// A `[shadow]` section is configured.
    pub configured: bool,
    /// Copies are being taken now (configured and enabled, or switched on by a trigger).
    pub enabled: bool,
    pub share: f64,
    /// Seconds left of a re-acceptance trigger's switch-on, if one is running.
    pub switched_on_for_s: Option<f64>,
    /// Copies dropped since start, by reason.
    pub dropped: std::collections::BTreeMap<&'static str, u64>,
    /// Pairs needed before a verdict (`slo.min_samples`).
    pub min_pairs: u64,
    pub rule: &'static str,
    pub answers_rule: &'static str,
    pub classes: Vec<ClassReport>,
}

impl View {
    /// The verdict per class over `window`, for a drift snapshot's header; `None` when no
    /// `[shadow]` is configured.
    pub fn verdicts(&self, window: Duration, slo: &Slo) -> Option<serde_json::Value> {
        if !self.shadow.state().configured {
            return None;
        }
        let report = self
            .book
            .report(window, Instant::now(), slo, self.shadow.thresholds());
        let answers: serde_json::Map<String, serde_json::Value> = report
            .iter()
            .map(|c| (c.class.clone(), serde_json::json!(c.answers.verdict)))
            .collect();
        let classes: serde_json::Map<String, serde_json::Value> = report
            .into_iter()
            .map(|c| (c.class, serde_json::json!(c.verdict)))
            .collect();
        // `classes` is the latency verdict, as before; `answers` the answers verdict.
        Some(serde_json::json!({
            "window_s": window.as_secs_f64(),
            "classes": classes,
            "answers": answers,
        }))
    }

    pub fn report(&self, window: Duration, slo: &Slo) -> ShadowReport {
        let state = self.shadow.state();
        ShadowReport {
            window_s: window.as_secs_f64(),
            configured: state.configured,
            enabled: state.enabled,
            share: state.share,
            switched_on_for_s: state.forced_for.map(|d| d.as_secs_f64()),
            dropped: self.shadow.metrics().drops().into_iter().collect(),
            min_pairs: slo.min_samples.max(1),
            rule: RULE,
            answers_rule: ANSWERS_RULE,
            classes: self
                .book
                .report(window, Instant::now(), slo, self.shadow.thresholds()),
        }
    }
}
