//! The summary document (`GET /api/v1/summary?window=5m`): per class, per model and
//! overall. Field names of [`Group`], [`Rates`] and [`Overall`] are a contract with users'
//! tooling: extend, never rename.
//!
//! Window seconds (the denominator of every rate and of the window's cost): the span the
//! window's slices cover up to `now` (W to W + W/12, see `ring`). While the engine is
//! younger than that, the time since the first thing it saw (its epoch: the first
//! in-flight sample, or the first observation's `started`), since slices start there; so
//! the first minutes after start are not under-reported.
//! `overall` is the sum of the classes: every observation is in exactly one class.

use std::time::{Duration, Instant};

use serde::{Serialize, Serializer, ser::SerializeMap};

use super::{
    Engine, WindowState,
    config::{FinishReason, LatencyMetric, MissCause, PercentileTarget},
    cost::{self, CostSummary},
    hist::{Merged, Percentiles},
    slice::{ClassAgg, Counts, FlightSlice, ratio},
    stability::{self, Series, Stability},
};
use crate::measure::Outcome;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The window's label, e.g. "5m".
    pub window: String,
    /// Seconds the rates divide by (see the module doc).
    pub window_seconds: f64,
    pub overall: Overall,
    pub classes: Vec<Group>,
    /// Per model label: counters and rates only (latency percentiles per model are in the
    /// Prometheus histograms).
    pub models: Vec<ModelGroup>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Overall {
    /// `name` is "overall"; `attainment_target` is the traffic-weighted class target.
    #[serde(flatten)]
    pub group: Group,
    /// `null` without a `[cost]` section or without effective tokens.
    pub cost_per_million_effective_tokens: Option<f64>,
    pub cost: Option<CostSummary>,
    pub in_flight: InFlight,
}

/// One class (or overall) over the window.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub name: String,
    #[serde(flatten)]
    pub rates: Rates,
    pub attainment_target: Option<f64>,
    pub percentile_targets: Vec<TargetStatus>,
    /// The class's `error_rate_max` target, and whether `error_rate` stays within it
    /// (`null` without a target or without requests). A class above it fails as it
    /// does below its attainment target.
    pub error_rate_max: Option<f64>,
    pub error_rate_holds: Option<bool>,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub ttft_ms_by_input: ByInput,
    /// E2E per output-length bucket ("<=128", "<=512", "<=2k", ">2k").
    pub e2e_ms_by_output: ByInput,
    /// TTFT of prefix-cache hits (`hit`: the upstream reported cached input tokens) and
    /// misses (`miss`: it reported none cached).
    pub ttft_ms_by_cache: ByInput,
    /// From the capacity view (always over the longest window).
    pub max_stable_concurrency: Option<u32>,
    pub stability: Stability,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelGroup {
    pub name: String,
    #[serde(flatten)]
    pub rates: Rates,
}

/// Counters and rates. Attainment = met / (met + missed): client aborts and client errors
/// have no verdict. Error, rejection, client error and timeout rates are shares of all
/// requests; errors are `upstream_error`, `upstream_reset` and `proxy_error`, rejections
/// `rejected` (429, 503: the system refused the work).
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub requests: u64,
    pub slo_met: u64,
    pub slo_missed: u64,
    pub client_aborts: u64,
    pub attainment: Option<f64>,
    pub output_tokens: u64,
    pub effective_output_tokens: u64,
    pub effective_goodput_tokens_per_s: f64,
    pub raw_output_tokens_per_s: f64,
    pub request_goodput_per_s: f64,
    pub outcomes: OutcomeCounts,
    pub error_rate: Option<f64>,
    pub timeout_rate: Option<f64>,
    pub rejection_rate: Option<f64>,
    pub client_error_rate: Option<f64>,
    /// Misses by why: `ttft`, `tpot`, `e2e` (the target broken) or the failed outcome
    /// (`rejected`, `upstream_error`, `upstream_reset`, `timeout`, `proxy_error`); every
    /// reason present.
    pub miss_reasons: MissReasons,
    /// Requests by the finish reason the upstream reported; every reason present.
    pub finish_reasons: FinishReasons,
    /// Share of requests with a finish reason that stopped at `length` (truncated).
    pub truncation_rate: Option<f64>,
    pub input_tokens: u64,
    pub input_tokens_per_s: f64,
    /// Input tokens the upstream served from its prefix cache, where it reports them.
    pub cached_input_tokens: u64,
}

/// Misses per [`MissCause`], keyed by its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissReasons(Counts);

impl MissReasons {
    pub fn get(&self, c: MissCause) -> u64 {
        self.0.misses(c)
    }
}

impl Serialize for MissReasons {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(MissCause::ALL.len()))?;
        for c in MissCause::ALL {
            m.serialize_entry(c.as_str(), &self.get(c))?;
        }
        m.end()
    }
}

/// Requests per [`FinishReason`], keyed by its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishReasons(Counts);

impl FinishReasons {
    pub fn get(&self, r: FinishReason) -> u64 {
        self.0.finishes(r)
    }
}

impl Serialize for FinishReasons {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(FinishReason::ALL.len()))?;
        for r in FinishReason::ALL {
            m.serialize_entry(r.as_str(), &self.get(r))?;
        }
        m.end()
    }
}

/// Requests per outcome, keyed by [`Outcome::as_str`], every outcome present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeCounts(Counts);

impl OutcomeCounts {
    pub fn get(&self, o: Outcome) -> u64 {
        self.0.outcome(o)
    }
}

impl Serialize for OutcomeCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(Outcome::ALL.len()))?;
        for o in Outcome::ALL {
            m.serialize_entry(o.as_str(), &self.get(o))?;
        }
        m.end()
    }
}

/// TTFT per input-length bucket, keyed by label ("<=1k", ..., ">64k"), in bucket order.
#[derive(Debug, Clone, PartialEq)]
pub struct ByInput(pub Vec<(String, Percentiles)>);

impl Serialize for ByInput {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// A percentile target and whether it holds over the window (`null` without samples).
#[derive(Debug, Clone, Serialize)]
pub struct TargetStatus {
    pub metric: LatencyMetric,
    pub quantile: f64,
    pub max_ms: f64,
    pub value_ms: Option<f64>,
    pub holds: Option<bool>,
}

/// In-flight concurrency from the ~100 ms samples over the window.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InFlight {
    pub mean: Option<f64>,
    pub peak: Option<u64>,
    pub samples: u64,
}

/// What a group is, besides its numbers.
struct Spec<'a> {
    name: &'a str,
    target: Option<f64>,
    targets: &'a [PercentileTarget],
    error_rate_max: Option<f64>,
    max_stable: Option<u32>,
    series: &'a Series,
}

/// Which slices a window covers at `now` and how many seconds that is.
#[derive(Debug, Clone, Copy)]
pub(super) struct View {
    pub lo: u64,
    pub hi: u64,
    pub span_s: f64,
}

pub(super) fn per_s(n: u64, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

impl Rates {
    pub(super) fn new(c: &Counts, span_s: f64) -> Rates {
        let errors = [
            Outcome::UpstreamError,
            Outcome::UpstreamReset,
            Outcome::ProxyError,
        ]
        .into_iter()
        .map(|o| c.outcome(o))
        .fold(0u64, u64::saturating_add);
        Rates {
            requests: c.requests,
            slo_met: c.met,
            slo_missed: c.missed,
            client_aborts: c.outcome(Outcome::ClientAbort),
            attainment: c.attainment(),
            output_tokens: c.output_tokens,
            effective_output_tokens: c.met_tokens,
            effective_goodput_tokens_per_s: per_s(c.met_tokens, span_s),
            raw_output_tokens_per_s: per_s(c.output_tokens, span_s),
            request_goodput_per_s: per_s(c.met, span_s),
            outcomes: OutcomeCounts(*c),
            error_rate: ratio(errors, c.requests),
            timeout_rate: ratio(c.outcome(Outcome::Timeout), c.requests),
            rejection_rate: ratio(c.outcome(Outcome::Rejected), c.requests),
            client_error_rate: ratio(c.outcome(Outcome::ClientError), c.requests),
            miss_reasons: MissReasons(*c),
            finish_reasons: FinishReasons(*c),
            truncation_rate: ratio(
                c.finishes(FinishReason::Length),
                c.finishes.iter().fold(0u64, |a, b| a.saturating_add(*b)),
            ),
            input_tokens: c.input_tokens,
            input_tokens_per_s: per_s(c.input_tokens, span_s),
            cached_input_tokens: c.cached_input_tokens,
        }
    }
}

fn target_status(t: &PercentileTarget, agg: &ClassAgg) -> TargetStatus {
    let h = match t.metric {
        LatencyMetric::Ttft => &agg.ttft,
        LatencyMetric::Tpot => &agg.tpot,
        LatencyMetric::Itl => &agg.itl,
        LatencyMetric::E2e => &agg.e2e,
    };
    let value_ms = h.quantile_ms(t.quantile);
    TargetStatus {
        metric: t.metric,
        quantile: t.quantile,
        max_ms: t.max_ms,
        value_ms,
        holds: value_ms.map(|v| v <= t.max_ms),
    }
}

impl Engine {
    /// The window's slices at `now`; `None` before the engine saw anything.
    pub(super) fn view(&self, w: usize, now: Instant) -> Option<View> {
        let epoch = self.epoch?;
        let g = self.windows.get(w)?.geom;
        let hi = g.index(epoch, now);
        let lo = g.oldest(hi);
        let start = g.start(epoch, lo);
        Some(View {
            lo,
            hi,
            span_s: now.saturating_duration_since(start).as_secs_f64(),
        })
    }

    /// The window index of a configured window length.
    pub(super) fn window_index(&self, window: Duration) -> Option<usize> {
        self.windows.iter().position(|w| w.geom.window == window)
    }

    /// The summary over `window` (one of the configured lengths; `None` otherwise).
    pub fn summary(&self, window: Duration, now: Instant) -> Option<Summary> {
        let w = self.window_index(window)?;
        let win = self.windows.get(w)?;
        let view = self.view(w, now).unwrap_or(View {
            lo: 1,
            hi: 0,
            span_s: 0.0,
        });
        let buckets = self.bucket_labels.len();
        let empty = Series::default();
        let stable = self.stable_levels(now);
        let mut all = ClassAgg::new(buckets);
        let mut weight = 0.0;
        let mut classes = Vec::with_capacity(self.classes.len());
        for (ci, class) in self.classes.iter().enumerate() {
            let mut agg = ClassAgg::new(buckets);
            if let Some(Some(ring)) = class.rings.get(w) {
                ring.range(view.lo, view.hi).for_each(|s| agg.add_slice(s));
            }
            let samples = agg.counts.met.saturating_add(agg.counts.missed);
            weight += samples as f64 * class.cfg.attainment;
            let spec = Spec {
                name: &class.cfg.name,
                target: Some(class.cfg.attainment),
                targets: &class.cfg.percentile_targets,
                error_rate_max: class.cfg.error_rate_max,
                max_stable: stable.0.get(ci).copied().flatten(),
                series: class.series.get(w).unwrap_or(&empty),
            };
            classes.push(self.group(win, spec, &agg, &view, now));
            all.add_agg(&agg);
        }
        let samples = all.counts.met.saturating_add(all.counts.missed);
        let target = (samples > 0).then(|| weight / samples as f64);
        let spec = Spec {
            name: "overall",
            target,
            targets: &[],
            error_rate_max: None,
            max_stable: stable.1,
            series: &win.series,
        };
        let group = self.group(win, spec, &all, &view, now);
        let cost = self
            .cost
            .as_ref()
            .map(|c| cost::summarize(c, view.span_s, &all.counts, stable.1));
        let mut flight = FlightSlice::default();
        for s in win.flight.range(view.lo, view.hi) {
            flight.sum = flight.sum.saturating_add(s.sum);
            flight.samples = flight.samples.saturating_add(s.samples);
            flight.peak = flight.peak.max(s.peak);
        }
        let models = self
            .models
            .iter()
            .map(|(name, m)| {
                let mut c = Counts::default();
                if let Some(Some(ring)) = m.rings.get(w) {
                    ring.range(view.lo, view.hi).for_each(|s| c.add(s));
                }
                ModelGroup {
                    name: name.clone(),
                    rates: Rates::new(&c, view.span_s),
                }
            })
            .filter(|m| m.rates.requests > 0)
            .collect();
        Some(Summary {
            window: win.label.clone(),
            window_seconds: view.span_s,
            overall: Overall {
                group,
                cost_per_million_effective_tokens: cost
                    .as_ref()
                    .and_then(|c| c.cost_per_million_effective_tokens),
                cost,
                in_flight: InFlight {
                    mean: ratio(flight.sum, flight.samples),
                    peak: (flight.samples > 0).then_some(flight.peak),
                    samples: flight.samples,
                },
            },
            classes,
            models,
        })
    }

    fn group(
        &self,
        win: &WindowState,
        spec: Spec<'_>,
        agg: &ClassAgg,
        view: &View,
        now: Instant,
    ) -> Group {
        let mut short = Merged::default();
        short.add_merged(&agg.short_with_long);
        short.add_merged(&agg.short_alone);
        let by_input = std::iter::once(&short)
            .chain(&agg.ttft_longer)
            .map(Merged::percentiles);
        let by_input = self.bucket_labels.iter().cloned().zip(by_input).collect();
        let (g, epoch) = (win.geom, self.epoch);
        let end = move |i: u64| epoch.map_or(now, |e| g.start(e, (i + 1).saturating_mul(g.n)));
        let short = (&agg.short_with_long, &agg.short_alone);
        let stability = stability::stability(&win.label, spec.series, end, now, short);
        let Spec {
            name,
            target,
            targets,
            max_stable,
            error_rate_max,
            ..
        } = spec;
        let rates = Rates::new(&agg.counts, view.span_s);
        // Rates compared to targets tolerate float rounding, as attainment's do.
        let error_rate_holds = error_rate_max
            .zip(rates.error_rate)
            .map(|(max, rate)| rate <= max + 1e-9);
        Group {
            name: name.to_owned(),
            rates,
            attainment_target: target,
            percentile_targets: targets.iter().map(|t| target_status(t, agg)).collect(),
            error_rate_max,
            error_rate_holds,
            ttft_ms: agg.ttft.percentiles(),
            tpot_ms: agg.tpot.percentiles(),
            itl_ms: agg.itl.percentiles(),
            e2e_ms: agg.e2e.percentiles(),
            ttft_ms_by_input: ByInput(by_input),
            e2e_ms_by_output: ByInput(
                super::label::bucket_labels(&super::slice::OUTPUT_BUCKETS)
                    .into_iter()
                    .zip(agg.e2e_by_output.iter().map(Merged::percentiles))
                    .collect(),
            ),
            ttft_ms_by_cache: ByInput(vec![
                ("hit".into(), agg.ttft_cache_hit.percentiles()),
                ("miss".into(), agg.ttft_cache_miss.percentiles()),
            ]),
            max_stable_concurrency: max_stable,
            stability,
        }
    }
}
