//! Latency by kind of request: TTFT by input length, e2e by output length (the live
//! summary's buckets), TTFT of prefix-cache hits and misses, and short requests' TTFT
//! with a long one in flight and without.

use serde::Serialize;

use super::{Pcts, Sample};
use crate::stats::engine::{OUTPUT_BUCKETS, bucket_labels, bucket_of};

#[derive(Debug, Clone, Serialize)]
pub struct InputBucket {
    pub bucket: String,
    pub requests: usize,
    pub ttft_ms: Pcts,
}

/// Short requests' TTFT with and without a long request in flight.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ShortTtft {
    /// Short means at most this many input tokens.
    pub short_max_input_tokens: Option<u64>,
    pub with_long_in_flight: Pcts,
    pub without: Pcts,
}

pub(super) fn short_ttft(samples: &[&Sample], bounds: &[u64]) -> ShortTtft {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for s in samples {
        let short = s.input_tokens().is_some_and(|n| bucket_of(bounds, n) == 0);
        match (short, s.ttft_ms(), s.long_in_flight) {
            (true, Some(t), true) => with.push(t),
            (true, Some(t), false) => without.push(t),
            _ => {}
        }
    }
    ShortTtft {
        short_max_input_tokens: bounds.first().copied(),
        with_long_in_flight: Pcts::of(with),
        without: Pcts::of(without),
    }
}

pub(super) fn by_input(samples: &[&Sample], bounds: &[u64]) -> Vec<InputBucket> {
    let labels = bucket_labels(bounds);
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    let mut counts = vec![0usize; labels.len()];
    for s in samples {
        if let Some(n) = s.input_tokens() {
            let b = bucket_of(bounds, n).min(labels.len() - 1);
            counts[b] += 1;
            ttfts[b].extend(s.ttft_ms());
        }
    }
    labels
        .into_iter()
        .zip(counts)
        .zip(ttfts)
        .filter(|((_, n), _)| *n > 0)
        .map(|((bucket, requests), v)| InputBucket {
            bucket,
            requests,
            ttft_ms: Pcts::of(v),
        })
        .collect()
}

/// Requests of one output-length bucket and their e2e.
#[derive(Debug, Clone, Serialize)]
pub struct OutputBucket {
    pub bucket: String,
    pub requests: usize,
    pub e2e_ms: Pcts,
}

/// E2E by output length, in the live summary's buckets (`<=128`, `<=512`, `<=2k`, `>2k`).
pub(super) fn by_output(samples: &[&Sample]) -> Vec<OutputBucket> {
    let labels = bucket_labels(&OUTPUT_BUCKETS);
    let mut e2e: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    for s in samples {
        if let Some(n) = s.output_tokens() {
            e2e[bucket_of(&OUTPUT_BUCKETS, n).min(labels.len() - 1)].push(s.e2e_ms);
        }
    }
    labels
        .into_iter()
        .zip(e2e)
        .filter(|(_, v)| !v.is_empty())
        .map(|(bucket, v)| OutputBucket {
            bucket,
            requests: v.len(),
            e2e_ms: Pcts::of(v),
        })
        .collect()
}

/// TTFT of prefix-cache hits (the target reported cached input tokens) and misses (it
/// reported none); requests whose target reports nothing are in neither.
#[derive(Debug, Clone, Serialize, Default)]
pub struct CacheTtft {
    pub hit: Pcts,
    pub miss: Pcts,
}

pub(super) fn by_cache(samples: &[&Sample]) -> CacheTtft {
    let (mut hit, mut miss) = (Vec::new(), Vec::new());
    for s in samples {
        match (s.cache_hit, s.ttft_ms()) {
            (Some(true), Some(t)) => hit.push(t),
            (Some(false), Some(t)) => miss.push(t),
            _ => {}
        }
    }
    CacheTtft {
        hit: Pcts::of(hit),
        miss: Pcts::of(miss),
    }
}
