//! Unit cost (docs/DESIGN.md, "Unit cost"): the configured cost per hour times the window's
//! seconds (the same span the rates use), plus what the window's traffic costs at the
//! usage prices (tokens in, cached and out, requests), divided by millions of tokens. Raw tokens are all
//! output tokens (raw throughput's numerator). The wasted share is the share of output
//! tokens, hence of spend, that went to requests which missed their SLO; tokens of client
//! aborts (no verdict) count in the denominator only, as spend that was neither.

use serde::{Serialize, Serializer, ser::SerializeMap};

use super::{config::CostConfig, slice::Counts};
use crate::config::cost::{UsagePrices, Used};

/// Hours per month for "per month" figures (8,760 h / 12), as `[cost]` amortizes with.
pub use crate::config::cost::HOURS_PER_MONTH;

#[derive(Debug, Clone, Serialize)]
pub struct CostSummary {
    pub currency: String,
    /// Sum of the components.
    pub per_hour: f64,
    /// Each configured component per hour, in config order.
    #[serde(serialize_with = "as_map")]
    pub components: Vec<(String, f64)>,
    /// The usage prices, when any is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsagePrices>,
    /// Of `window_cost`, what the window's traffic cost at the usage prices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_usage_cost: Option<f64>,
    /// Cost of the window's span: its hours, and its traffic at the usage prices.
    pub window_cost: f64,
    pub cost_per_million_effective_tokens: Option<f64>,
    pub cost_per_million_raw_tokens: Option<f64>,
    /// Window cost per request finished in the window, and per request that met its SLO.
    pub cost_per_request: Option<f64>,
    pub cost_per_effective_request: Option<f64>,
    /// Output tokens of SLO-missing requests / all output tokens.
    pub wasted_share: Option<f64>,
    /// `window_cost × wasted_share`.
    pub wasted_cost: Option<f64>,
    /// `per_hour × 730 / max stable concurrency`.
    pub cost_per_stable_user_per_month: Option<f64>,
}

fn as_map<S: Serializer>(v: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(v.len()))?;
    for (k, x) in v {
        m.serialize_entry(k, x)?;
    }
    m.end()
}

fn finite(x: f64) -> Option<f64> {
    Some(x).filter(|x| x.is_finite())
}

/// Cost per million `tokens`; `None` without tokens.
pub fn per_million(cost: f64, tokens: u64) -> Option<f64> {
    (tokens > 0)
        .then(|| cost / tokens as f64 * 1e6)
        .and_then(finite)
}

/// What `counts`' traffic cost at the usage prices.
pub fn usage_cost(cfg: &CostConfig, counts: &Counts) -> f64 {
    let used = Used {
        requests: counts.requests as f64,
        input_tokens: counts.input_tokens as f64,
        cached_input_tokens: counts.cached_input_tokens as f64,
        output_tokens: counts.output_tokens as f64,
    };
    finite(cfg.usage.cost(used)).unwrap_or(0.0)
}

/// Cost of `span_s` seconds that carried `counts`: the hours and the usage.
pub fn window_cost(cfg: &CostConfig, span_s: f64, counts: &Counts) -> f64 {
    finite(cfg.per_hour * span_s / 3600.0).unwrap_or(0.0) + usage_cost(cfg, counts)
}

pub fn summarize(
    cfg: &CostConfig,
    span_s: f64,
    counts: &Counts,
    max_stable: Option<u32>,
) -> CostSummary {
    let window_cost = window_cost(cfg, span_s, counts);
    // Per hour at the window's pace: the hours, and the usage the window's traffic ran up.
    let per_hour_at_pace = if span_s > 0.0 {
        window_cost / span_s * 3600.0
    } else {
        cfg.per_hour
    };
    let wasted_share = super::slice::ratio(counts.missed_tokens, counts.output_tokens);
    CostSummary {
        currency: cfg.currency.clone(),
        per_hour: cfg.per_hour,
        components: cfg.components.clone(),
        usage: cfg.usage.any().then_some(cfg.usage),
        window_usage_cost: cfg.usage.any().then(|| usage_cost(cfg, counts)),
        window_cost,
        cost_per_million_effective_tokens: per_million(window_cost, counts.met_tokens),
        cost_per_million_raw_tokens: per_million(window_cost, counts.output_tokens),
        cost_per_request: per_million(window_cost, counts.requests).map(|c| c / 1e6),
        cost_per_effective_request: per_million(window_cost, counts.met).map(|c| c / 1e6),
        wasted_share,
        wasted_cost: wasted_share.map(|s| s * window_cost),
        cost_per_stable_user_per_month: max_stable
            .filter(|c| *c > 0)
            .and_then(|c| finite(per_hour_at_pace * HOURS_PER_MONTH / f64::from(c))),
    }
}
