//! What one time slice holds for one class (counters plus latency distributions), for one
//! model (counters only), and for the in-flight samples; and their query-time sums.

use super::{
    config::{FinishReason, MissCause, Observation},
    hist::{Hist, Merged},
    ring::Slice,
};
use crate::measure::Outcome;

/// Request and token counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    /// Indexed like [`Outcome::ALL`].
    pub outcomes: [u64; Outcome::ALL.len()],
    pub met: u64,
    pub missed: u64,
    /// All output tokens (raw throughput, spend).
    pub output_tokens: u64,
    /// Output tokens of requests that met their SLO (effective goodput).
    pub met_tokens: u64,
    /// Output tokens of requests that missed it (wasted spend).
    pub missed_tokens: u64,
    /// Input tokens of every request that reported or was counted for them.
    pub input_tokens: u64,
    /// Input tokens the upstream reported as served from its prefix cache.
    pub cached_input_tokens: u64,
    /// Misses by cause, indexed like [`MissCause::ALL`].
    pub misses: [u64; MissCause::ALL.len()],
    /// Requests by finish reason, indexed like [`FinishReason::ALL`].
    pub finishes: [u64; FinishReason::ALL.len()],
}

fn bump<const N: usize, T: PartialEq>(counts: &mut [u64; N], all: &[T; N], x: &T) {
    if let Some(n) = all
        .iter()
        .position(|a| a == x)
        .and_then(|i| counts.get_mut(i))
    {
        *n = n.saturating_add(1);
    }
}

fn add_all<const N: usize>(a: &mut [u64; N], b: &[u64; N]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
}

fn outcome_index(o: Outcome) -> usize {
    Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0)
}

impl Counts {
    pub fn record(&mut self, obs: &Observation<'_>) {
        let tokens = obs.output_tokens.unwrap_or(0);
        self.requests = self.requests.saturating_add(1);
        if let Some(n) = self.outcomes.get_mut(outcome_index(obs.outcome)) {
            *n = n.saturating_add(1);
        }
        self.output_tokens = self.output_tokens.saturating_add(tokens);
        self.input_tokens = self
            .input_tokens
            .saturating_add(obs.input_tokens.unwrap_or(0));
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(obs.cached_input_tokens.unwrap_or(0));
        if let Some(c) = obs.miss_cause {
            bump(&mut self.misses, &MissCause::ALL, &c);
        }
        if let Some(r) = obs.finish_reason {
            bump(&mut self.finishes, &FinishReason::ALL, &r);
        }
        match obs.slo_met {
            Some(true) => {
                self.met = self.met.saturating_add(1);
                self.met_tokens = self.met_tokens.saturating_add(tokens);
            }
            Some(false) => {
                self.missed = self.missed.saturating_add(1);
                self.missed_tokens = self.missed_tokens.saturating_add(tokens);
            }
            None => {}
        }
    }

    pub fn add(&mut self, o: &Counts) {
        self.requests = self.requests.saturating_add(o.requests);
        for (a, b) in self.outcomes.iter_mut().zip(o.outcomes) {
            *a = a.saturating_add(b);
        }
        self.met = self.met.saturating_add(o.met);
        self.missed = self.missed.saturating_add(o.missed);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.met_tokens = self.met_tokens.saturating_add(o.met_tokens);
        self.missed_tokens = self.missed_tokens.saturating_add(o.missed_tokens);
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(o.cached_input_tokens);
        add_all(&mut self.misses, &o.misses);
        add_all(&mut self.finishes, &o.finishes);
    }

    pub fn misses(&self, c: MissCause) -> u64 {
        let i = MissCause::ALL.iter().position(|x| *x == c);
        i.and_then(|i| self.misses.get(i)).copied().unwrap_or(0)
    }

    pub fn finishes(&self, r: FinishReason) -> u64 {
        let i = FinishReason::ALL.iter().position(|x| *x == r);
        i.and_then(|i| self.finishes.get(i)).copied().unwrap_or(0)
    }

    pub fn outcome(&self, o: Outcome) -> u64 {
        self.outcomes.get(outcome_index(o)).copied().unwrap_or(0)
    }

    /// met / (met + missed); `None` when no request had a verdict.
    pub fn attainment(&self) -> Option<f64> {
        ratio(self.met, self.met.saturating_add(self.missed))
    }
}

/// `a / b`, `None` when `b` is 0.
pub fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

impl Slice for Counts {
    fn reset(&mut self) {
        *self = Counts::default();
    }
    fn heap_bytes(&self) -> usize {
        0
    }
}

/// One class in one time slice.
#[derive(Debug, Default)]
pub struct ClassSlice {
    pub counts: Counts,
    pub ttft: Hist,
    pub tpot: Hist,
    pub itl: Hist,
    pub e2e: Hist,
    /// TTFT of short-input requests (first input bucket) that arrived while a long-input
    /// request was in flight. With `short_alone` this is also the first bucket of
    /// `ttft_by_input`, so it is not stored twice.
    pub short_with_long: Hist,
    pub short_alone: Hist,
    /// TTFT of the input buckets after the first.
    pub ttft_longer: Vec<Hist>,
    /// E2E per output-length bucket ([`OUTPUT_BUCKETS`]).
    pub e2e_by_output: Vec<Hist>,
    /// TTFT of requests the upstream served partly from its prefix cache, and of those it
    /// reported no cached tokens for (requests it says nothing about are in neither).
    pub ttft_cache_hit: Hist,
    pub ttft_cache_miss: Hist,
}

/// Upper bounds (output tokens) of the buckets E2E is broken down by: a short chat answer,
/// a long-form answer, a long generation (code, documents), and longer (reasoning runs).
/// E2E grows with output length, so a percentile over all of them says little.
pub const OUTPUT_BUCKETS: [u64; 3] = [128, 512, 2048];

impl ClassSlice {
    pub fn new(buckets: usize) -> ClassSlice {
        let longer = buckets.saturating_sub(1);
        ClassSlice {
            ttft_longer: (0..longer).map(|_| Hist::Empty).collect(),
            e2e_by_output: (0..=OUTPUT_BUCKETS.len()).map(|_| Hist::Empty).collect(),
            ..Default::default()
        }
    }

    /// `bucket`: the request's input-length bucket, when its input length is known.
    pub fn record(&mut self, obs: &Observation<'_>, bucket: Option<usize>) {
        self.counts.record(obs);
        if let Some(ttft) = obs.ttft_ms {
            self.ttft.record_ms(ttft);
            match bucket {
                Some(0) if obs.long_in_flight_at_start => self.short_with_long.record_ms(ttft),
                Some(0) => self.short_alone.record_ms(ttft),
                Some(b) => {
                    if let Some(h) = self.ttft_longer.get_mut(b - 1) {
                        h.record_ms(ttft);
                    }
                }
                None => {}
            }
        }
        if let Some(tpot) = obs.tpot_ms {
            self.tpot.record_ms(tpot);
        }
        self.e2e.record_ms(obs.e2e_ms);
        if let Some(n) = obs.output_tokens
            && let Some(h) = self
                .e2e_by_output
                .get_mut(super::label::bucket_of(&OUTPUT_BUCKETS, n))
        {
            h.record_ms(obs.e2e_ms);
        }
        match (obs.ttft_ms, obs.cached_input_tokens) {
            (Some(ttft), Some(0)) => self.ttft_cache_miss.record_ms(ttft),
            (Some(ttft), Some(_)) => self.ttft_cache_hit.record_ms(ttft),
            _ => {}
        }
        for &gap in obs.itl_us {
            self.itl.record_us(u64::from(gap));
        }
    }

    fn hists(&self) -> impl Iterator<Item = &Hist> {
        [
            &self.ttft,
            &self.tpot,
            &self.itl,
            &self.e2e,
            &self.short_with_long,
            &self.short_alone,
            &self.ttft_cache_hit,
            &self.ttft_cache_miss,
        ]
        .into_iter()
        .chain(&self.ttft_longer)
        .chain(&self.e2e_by_output)
    }
}

impl Slice for ClassSlice {
    fn reset(&mut self) {
        self.counts = Counts::default();
        for h in [
            &mut self.ttft,
            &mut self.tpot,
            &mut self.itl,
            &mut self.e2e,
            &mut self.short_with_long,
            &mut self.short_alone,
            &mut self.ttft_cache_hit,
            &mut self.ttft_cache_miss,
        ] {
            h.reset();
        }
        self.ttft_longer.iter_mut().for_each(Hist::reset);
        self.e2e_by_output.iter_mut().for_each(Hist::reset);
    }
    fn heap_bytes(&self) -> usize {
        let longer = (self.ttft_longer.capacity() + self.e2e_by_output.capacity())
            * std::mem::size_of::<Hist>();
        longer + self.hists().map(Hist::heap_bytes).sum::<usize>()
    }
}

/// A class (or all classes) over a window: the sum of its slices.
#[derive(Debug, Default)]
pub struct ClassAgg {
    pub counts: Counts,
    pub ttft: Merged,
    pub tpot: Merged,
    pub itl: Merged,
    pub e2e: Merged,
    pub short_with_long: Merged,
    pub short_alone: Merged,
    pub ttft_longer: Vec<Merged>,
    pub e2e_by_output: Vec<Merged>,
    pub ttft_cache_hit: Merged,
    pub ttft_cache_miss: Merged,
}

impl ClassAgg {
    pub fn new(buckets: usize) -> ClassAgg {
        let longer = buckets.saturating_sub(1);
        ClassAgg {
            ttft_longer: (0..longer).map(|_| Merged::default()).collect(),
            e2e_by_output: (0..=OUTPUT_BUCKETS.len())
                .map(|_| Merged::default())
                .collect(),
            ..Default::default()
        }
    }

    pub fn add_slice(&mut self, s: &ClassSlice) {
        self.counts.add(&s.counts);
        self.ttft.add(&s.ttft);
        self.tpot.add(&s.tpot);
        self.itl.add(&s.itl);
        self.e2e.add(&s.e2e);
        self.short_with_long.add(&s.short_with_long);
        self.short_alone.add(&s.short_alone);
        for (m, h) in self.ttft_longer.iter_mut().zip(&s.ttft_longer) {
            m.add(h);
        }
        for (m, h) in self.e2e_by_output.iter_mut().zip(&s.e2e_by_output) {
            m.add(h);
        }
        self.ttft_cache_hit.add(&s.ttft_cache_hit);
        self.ttft_cache_miss.add(&s.ttft_cache_miss);
    }

    pub fn add_agg(&mut self, o: &ClassAgg) {
        self.counts.add(&o.counts);
        self.ttft.add_merged(&o.ttft);
        self.tpot.add_merged(&o.tpot);
        self.itl.add_merged(&o.itl);
        self.e2e.add_merged(&o.e2e);
        self.short_with_long.add_merged(&o.short_with_long);
        self.short_alone.add_merged(&o.short_alone);
        for (m, h) in self.ttft_longer.iter_mut().zip(&o.ttft_longer) {
            m.add_merged(h);
        }
        for (m, h) in self.e2e_by_output.iter_mut().zip(&o.e2e_by_output) {
            m.add_merged(h);
        }
        self.ttft_cache_hit.add_merged(&o.ttft_cache_hit);
        self.ttft_cache_miss.add_merged(&o.ttft_cache_miss);
    }
}

/// In-flight samples in one slice.
#[derive(Debug, Default, Clone, Copy)]
pub struct FlightSlice {
    pub sum: u64,
    pub samples: u64,
    pub peak: u64,
}

impl FlightSlice {
    pub fn record(&mut self, in_flight: u64) {
        self.sum = self.sum.saturating_add(in_flight);
        self.samples = self.samples.saturating_add(1);
        self.peak = self.peak.max(in_flight);
    }
}

impl Slice for FlightSlice {
    fn reset(&mut self) {
        *self = FlightSlice::default();
    }
    fn heap_bytes(&self) -> usize {
        0
    }
}
