//! `GET /metrics`: the simulator as an engine sees itself, in vLLM's names and text format,
//! made from the same ground truth as [`super::Truth`]. It gives the demo and the tests a
//! real engine-side endpoint for self-calibration ([`crate::calibrate`]).
//!
//! What is observed, per finished generation (completed, HTTP 200), labelled `model_name`
//! with the model the reply carried:
//! - `vllm:e2e_request_latency_seconds`: head received → last bytes handed to hyper;
//! - `vllm:time_to_first_token_seconds`: head received → first content event (streams only:
//!   a non-streamed reply has no token times here);
//! - `vllm:request_time_per_output_token_seconds`: (last − first) / (tokens − 1);
//! - `vllm:inter_token_latency_seconds`: each gap between content events;
//! - `vllm:request_queue_time_seconds` (always 0: the simulator has no queue, its load
//!   stretches latencies instead), `vllm:request_prefill_time_seconds` (= TTFT),
//!   `vllm:request_decode_time_seconds` (first → last event) and
//!   `vllm:request_inference_time_seconds` (their sum).
//!
//! Load gauges as vLLM names them ([`load_lines`]): `vllm:num_requests_waiting` and
//! `vllm:num_preemptions_total` are 0 (no queue, nothing preempted), and
//! `vllm:kv_cache_usage_perc` is in-flight requests over the configured concurrency knee
//! (capped at 1): the simulator's stand-in for a cache that fills as the batch grows.
//!
//! One lock per finished request; nothing per token. [`super::Sim::restart_metrics`] zeroes
//! everything, as an engine restart does.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

/// The load gauges of a simulator with `running` requests in flight (see the module doc).
pub(crate) fn load_lines(running: usize, knee: Option<u32>) -> String {
    let kv = knee.map_or(0.0, |k| (running as f64 / f64::from(k.max(1))).min(1.0));
    format!(
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting 0.0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc {kv}\n\
         # HELP vllm:num_preemptions_total Cumulative number of preemptions.\n\
         # TYPE vllm:num_preemptions_total counter\n\
         vllm:num_preemptions_total 0.0\n"
    )
}

/// vLLM's TTFT buckets (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's per-token buckets (seconds).
const TOKEN_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-phase buckets (seconds).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Distinct `model_name` values kept; requests for further models share `other`.
const MAX_MODELS: usize = 16;

/// The histograms, in exposition order.
const FAMILIES: [(&str, &str, &[f64]); 8] = [
    (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS,
    ),
    (
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        REQUEST_BUCKETS,
    ),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        TOKEN_BUCKETS,
    ),
    (
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        TOKEN_BUCKETS,
    ),
    (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_BUCKETS,
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_BUCKETS,
    ),
    (
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_BUCKETS,
    ),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        REQUEST_BUCKETS,
    ),
];
const TTFT: usize = 0;
const E2E: usize = 1;
const TPOT: usize = 2;
const ITL: usize = 3;
const QUEUE: usize = 4;
const PREFILL: usize = 5;
const DECODE: usize = 6;
const INFERENCE: usize = 7;

#[derive(Debug, Clone)]
struct Hist {
    /// Per bucket (not cumulative), plus +Inf last.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Hist {
    fn new(bounds: &[f64]) -> Hist {
        Hist {
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe_n(&mut self, bounds: &[f64], v: f64, n: u64) {
        let i = bounds.iter().position(|&b| v <= b).unwrap_or(bounds.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += n;
        }
        self.sum += v * n as f64;
        self.count += n;
    }
}

/// One zeroed histogram per family.
fn zeroed() -> Vec<Hist> {
    FAMILIES.iter().map(|(_, _, b)| Hist::new(b)).collect()
}

/// What one finished request contributes (seconds).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Finished {
    pub e2e: f64,
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
    /// Gaps between content events: their sum and number.
    pub itl_sum: f64,
    pub itl_gaps: u64,
    pub decode: f64,
}

#[derive(Debug, Default)]
pub(crate) struct EngineMetrics {
    models: Mutex<BTreeMap<String, Vec<Hist>>>,
}

impl EngineMetrics {
    /// Zeroed series for the served model from the start, as vLLM registers them at
    /// start-up: a scraper sees the histograms before the first request has finished.
    pub(crate) fn serving(model: &str) -> EngineMetrics {
        let metrics = EngineMetrics::default();
        metrics
            .models
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(model.to_owned(), zeroed());
        metrics
    }

    pub(crate) fn observe(&self, model: &str, f: &Finished) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if models.contains_key(model) || models.len() < MAX_MODELS {
            model
        } else {
            "other"
        };
        let hists = models.entry(key.to_owned()).or_insert_with(zeroed);
        let mut observe = |i: usize, v: f64, n: u64| {
            if let (Some(h), Some((_, _, b))) = (hists.get_mut(i), FAMILIES.get(i)) {
                h.observe_n(b, v, n);
            }
        };
        observe(E2E, f.e2e, 1);
        let prefill = f.ttft.unwrap_or(0.0);
        if let Some(ttft) = f.ttft {
            observe(TTFT, ttft, 1);
        }
        if let Some(tpot) = f.tpot {
            observe(TPOT, tpot, 1);
        }
        if f.itl_gaps > 0 {
            // Buckets by the mean gap; the sum stays exact, as SGLang records it too.
            let mean = f.itl_sum / f.itl_gaps as f64;
            observe(ITL, mean, f.itl_gaps);
        }
        observe(QUEUE, 0.0, 1);
        observe(PREFILL, prefill, 1);
        observe(DECODE, f.decode, 1);
        observe(INFERENCE, prefill + f.decode, 1);
    }

    /// Forgets everything, as a restarted engine would.
    pub(crate) fn reset(&self) {
        self.models
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub(crate) fn render(&self, running: usize) -> String {
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::with_capacity(4096 + models.len() * 8192);
        let _ = writeln!(
            out,
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running {running}.0"
        );
        for (i, (name, help, bounds)) in FAMILIES.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (model, hists) in models.iter() {
                let Some(h) = hists.get(i) else { continue };
                let model = escape(model);
                let mut cumulative = 0;
                for (b, c) in bounds.iter().zip(&h.counts) {
                    cumulative += c;
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{le=\"{b:?}\",model_name=\"{model}\"}} {cumulative}.0"
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{{le=\"+Inf\",model_name=\"{model}\"}} {}.0\n\
                     {name}_count{{model_name=\"{model}\"}} {}.0\n\
                     {name}_sum{{model_name=\"{model}\"}} {:?}",
                    h.count, h.count, h.sum
                );
            }
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_histograms_that_add_up() {
        let m = EngineMetrics::default();
        let f = Finished {
            e2e: 0.5,
            ttft: Some(0.05),
            tpot: Some(0.01),
            itl_sum: 0.09,
            itl_gaps: 9,
            decode: 0.09,
        };
        m.observe("a\"b", &f);
        m.observe(
            "a\"b",
            &Finished {
                ttft: None,
                tpot: None,
                itl_gaps: 0,
                ..f
            },
        );
        let text = m.render(3);
        assert!(text.contains("vllm:num_requests_running 3.0"), "{text}");
        assert!(
            text.contains("vllm:e2e_request_latency_seconds_count{model_name=\"a\\\"b\"} 2.0"),
            "{text}"
        );
        assert!(text.contains("vllm:e2e_request_latency_seconds_sum{model_name=\"a\\\"b\"} 1.0"));
        assert!(text.contains("vllm:time_to_first_token_seconds_count{model_name=\"a\\\"b\"} 1.0"));
        assert!(text.contains("vllm:inter_token_latency_seconds_count{model_name=\"a\\\"b\"} 9.0"));
        assert!(text.contains(
            "vllm:e2e_request_latency_seconds_bucket{le=\"0.5\",model_name=\"a\\\"b\"} 2.0"
        ));
        assert!(text.contains(
            "vllm:e2e_request_latency_seconds_bucket{le=\"0.3\",model_name=\"a\\\"b\"} 0.0"
        ));
        m.reset();
        assert!(!m.render(0).contains("_count"));
    }

    #[test]
    fn the_served_model_has_zeroed_series_from_the_start() {
        let text = EngineMetrics::serving("sim").render(0);
        for (name, _, _) in FAMILIES {
            assert!(
                text.contains(&format!("{name}_count{{model_name=\"sim\"}} 0.0")),
                "{text}"
            );
        }
    }

    #[test]
    fn models_are_capped() {
        let m = EngineMetrics::default();
        for i in 0..MAX_MODELS + 5 {
            m.observe(&format!("m{i}"), &Finished::default());
        }
        let text = m.render(0);
        assert!(text.contains("model_name=\"other\"} 5.0"), "{text}");
        assert!(!text.contains(&format!("m{}", MAX_MODELS)));
    }

    #[test]
    fn load_gauges_follow_the_knee() {
        let text = load_lines(8, Some(32));
        assert!(text.contains("vllm:kv_cache_usage_perc 0.25\n"), "{text}");
        assert!(text.contains("vllm:num_requests_waiting 0.0\n"));
        assert!(text.contains("vllm:num_preemptions_total 0.0\n"));
        assert!(load_lines(3, None).contains("vllm:kv_cache_usage_perc 0\n"));
        assert!(load_lines(99, Some(32)).contains("vllm:kv_cache_usage_perc 1\n"));
    }
}
