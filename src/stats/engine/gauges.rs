//! The cheap refresh for Prometheus gauges: per (class, window) attainment and rates, per
//! class max stable concurrency, per window cost per million effective tokens. Counters
//! only (no histogram is merged), borrowing names from the engine, so the integrator can
//! call it on every scrape.

use std::time::Instant;

use super::{
    Engine,
    cost::{per_million, window_cost},
    slice::Counts,
    summary::per_s,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Gauges<'a> {
    /// In configured order.
    pub windows: Vec<WindowGauges<'a>>,
    /// `(class, max stable concurrency)` in config order (the capacity window).
    pub max_stable_concurrency: Vec<(&'a str, Option<u32>)>,
    pub overall_max_stable_concurrency: Option<u32>,
    /// `(class, knee)` in config order, then `("overall", knee)` (the capacity window).
    pub knee_concurrency: Vec<(&'a str, Option<u32>)>,
    /// The cost currency, when a `[cost]` section is configured.
    pub currency: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WindowGauges<'a> {
    /// Label, e.g. "5m".
    pub window: &'a str,
    /// In config order.
    pub classes: Vec<ClassGauges<'a>>,
    /// All classes together (`class` is "overall").
    pub overall: ClassGauges<'a>,
    pub cost_per_million_effective_tokens: Option<f64>,
    pub cost_per_million_raw_tokens: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClassGauges<'a> {
    pub class: &'a str,
    pub attainment: Option<f64>,
    pub effective_tokens_per_s: f64,
    pub raw_tokens_per_s: f64,
    pub request_goodput_per_s: f64,
}

fn row<'a>(class: &'a str, c: &Counts, span_s: f64) -> ClassGauges<'a> {
    ClassGauges {
        class,
        attainment: c.attainment(),
        effective_tokens_per_s: per_s(c.met_tokens, span_s),
        raw_tokens_per_s: per_s(c.output_tokens, span_s),
        request_goodput_per_s: per_s(c.met, span_s),
    }
}

impl Engine {
    /// Every gauge value at `now`.
    pub fn gauges(&self, now: Instant) -> Gauges<'_> {
        let windows = self
            .windows
            .iter()
            .enumerate()
            .map(|(w, win)| {
                let view = self.view(w, now);
                let span_s = view.map_or(0.0, |v| v.span_s);
                let mut all = Counts::default();
                let classes = self
                    .classes
                    .iter()
                    .map(|class| {
                        let mut c = Counts::default();
                        if let (Some(Some(ring)), Some(v)) = (class.rings.get(w), view) {
                            ring.range(v.lo, v.hi).for_each(|s| c.add(&s.counts));
                        }
                        all.add(&c);
                        row(&class.cfg.name, &c, span_s)
                    })
                    .collect();
                let cost = self.cost.as_ref().map(|cfg| window_cost(cfg, span_s, &all));
                WindowGauges {
                    window: &win.label,
                    classes,
                    overall: row("overall", &all, span_s),
                    cost_per_million_effective_tokens: cost
                        .and_then(|c| per_million(c, all.met_tokens)),
                    cost_per_million_raw_tokens: cost
                        .and_then(|c| per_million(c, all.output_tokens)),
                }
            })
            .collect();
        let (per_class, overall) = self.stable_levels(now);
        let (knees, overall_knee) = self.knees(now);
        Gauges {
            knee_concurrency: self
                .classes()
                .zip(knees)
                .chain(std::iter::once(("overall", overall_knee)))
                .collect(),
            windows,
            max_stable_concurrency: self.classes().zip(per_class).collect(),
            overall_max_stable_concurrency: overall,
            currency: self.cost.as_ref().map(|c| c.currency.as_str()),
        }
    }
}
