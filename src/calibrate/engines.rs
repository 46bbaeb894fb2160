//! Which engine histograms mean which [`Quantity`], and the extraction of their cumulative
//! `_sum` and `_count` per model from a scrape.
//!
//! Names, from the engines' sources and docs:
//! - vLLM (V0 and V1): `vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`,
//!   `vllm:request_time_per_output_token_seconds` (one value per request, V1),
//!   `vllm:inter_token_latency_seconds` (per decode step; before it existed the same
//!   histogram was called `vllm:time_per_output_token_seconds`, which later releases still
//!   emit beside it as a deprecated alias), `vllm:request_queue_time_seconds`,
//!   `vllm:request_prefill_time_seconds`, `vllm:request_decode_time_seconds`,
//!   `vllm:request_inference_time_seconds`. Label `model_name`.
//! - SGLang: `sglang:time_to_first_token_seconds`, `sglang:e2e_request_latency_seconds`,
//!   `sglang:inter_token_latency_seconds`, `sglang:time_per_output_token_seconds` (older
//!   releases; one value per request), `sglang:queue_time_seconds`. Label `model_name`
//!   (some releases label the queue time by `dp_rank` only).
//!
//! Load signals (gauges and one counter), for the attribution of where time goes:
//! - vLLM: `vllm:kv_cache_usage_perc` (V1; `vllm:gpu_cache_usage_perc` before it, both a
//!   ratio in 0..1 despite the name), `vllm:num_requests_waiting`,
//!   `vllm:num_requests_running`, `vllm:num_preemptions_total` (counter).
//! - SGLang: `sglang:token_usage` (KV pool usage, 0..1), `sglang:num_queue_reqs`,
//!   `sglang:num_running_reqs`. SGLang exports no preemption counter.
//!
//! Series of one model that differ in other labels (vLLM's `engine` index for data
//! parallelism, SGLang's ranks) are added up. A series without `model_name` is kept under
//! the model `""`, which the comparison matches with the proxy's traffic of all models.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{Cumulative, Quantity, exposition};

pub use crate::config::calibration::EngineKind;

/// An engine whose metrics were recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }
}

/// The model label both engines use.
const MODEL_LABEL: &str = "model_name";

/// Histogram families by engine: quantity and preference (0 wins where an engine emits two
/// families for one quantity).
const FAMILIES: &[(&str, Engine, Quantity, u8)] = &[
    (
        "vllm:time_to_first_token_seconds",
        Engine::Vllm,
        Quantity::Ttft,
        0,
    ),
    (
        "vllm:e2e_request_latency_seconds",
        Engine::Vllm,
        Quantity::E2e,
        0,
    ),
    (
        "vllm:request_time_per_output_token_seconds",
        Engine::Vllm,
        Quantity::Tpot,
        0,
    ),
    (
        "vllm:inter_token_latency_seconds",
        Engine::Vllm,
        Quantity::Itl,
        0,
    ),
    (
        "vllm:time_per_output_token_seconds",
        Engine::Vllm,
        Quantity::Itl,
        1,
    ),
    (
        "vllm:request_queue_time_seconds",
        Engine::Vllm,
        Quantity::Queue,
        0,
    ),
    (
        "vllm:request_prefill_time_seconds",
        Engine::Vllm,
        Quantity::Prefill,
        0,
    ),
    (
        "vllm:request_decode_time_seconds",
        Engine::Vllm,
        Quantity::Decode,
        0,
    ),
    (
        "vllm:request_inference_time_seconds",
        Engine::Vllm,
        Quantity::Inference,
        0,
    ),
    (
        "sglang:time_to_first_token_seconds",
        Engine::Sglang,
        Quantity::Ttft,
        0,
    ),
    (
        "sglang:e2e_request_latency_seconds",
        Engine::Sglang,
        Quantity::E2e,
        0,
    ),
    (
        "sglang:time_per_output_token_seconds",
        Engine::Sglang,
        Quantity::Tpot,
        0,
    ),
    (
        "sglang:inter_token_latency_seconds",
        Engine::Sglang,
        Quantity::Itl,
        0,
    ),
    (
        "sglang:queue_time_seconds",
        Engine::Sglang,
        Quantity::Queue,
        0,
    ),
];

/// An engine load signal. KV-cache usage of several series of one model (data-parallel
/// ranks) is their maximum, the request counts and preemptions their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    KvCacheUsage,
    Waiting,
    Running,
    Preemptions,
}

const LOAD_FAMILIES: &[(&str, Engine, Signal)] = &[
    (
        "vllm:kv_cache_usage_perc",
        Engine::Vllm,
        Signal::KvCacheUsage,
    ),
    (
        "vllm:gpu_cache_usage_perc",
        Engine::Vllm,
        Signal::KvCacheUsage,
    ),
    ("vllm:num_requests_waiting", Engine::Vllm, Signal::Waiting),
    ("vllm:num_requests_running", Engine::Vllm, Signal::Running),
    (
        "vllm:num_preemptions_total",
        Engine::Vllm,
        Signal::Preemptions,
    ),
    ("sglang:token_usage", Engine::Sglang, Signal::KvCacheUsage),
    ("sglang:num_queue_reqs", Engine::Sglang, Signal::Waiting),
    ("sglang:num_running_reqs", Engine::Sglang, Signal::Running),
];

/// The engine's load at one scrape, per model (`""` where the engine names none).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    /// Share of the KV cache in use, 0..1.
    pub kv_cache_usage: Option<f64>,
    /// Requests waiting in the engine's queue.
    pub requests_waiting: Option<f64>,
    /// Requests being executed.
    pub requests_running: Option<f64>,
    /// Preemptions since the engine started (cumulative).
    pub preemptions_total: Option<f64>,
}

impl Load {
    fn add(&mut self, signal: Signal, v: f64) {
        let sum = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + v);
        match signal {
            Signal::KvCacheUsage => {
                self.kv_cache_usage = Some(self.kv_cache_usage.map_or(v, |u| u.max(v)));
            }
            Signal::Waiting => sum(&mut self.requests_waiting),
            Signal::Running => sum(&mut self.requests_running),
            Signal::Preemptions => sum(&mut self.preemptions_total),
        }
    }
}

/// Most distinct engine models tracked; the rest are ignored (and said so once per scrape
/// in [`Extracted::dropped_models`]) so a misbehaving endpoint cannot grow our label sets.
pub const MAX_MODELS: usize = 32;

/// Cumulative sums and counts by quantity and model.
pub type Series = HashMap<(Quantity, String), Cumulative>;

/// What one scrape yielded.
#[derive(Debug)]
pub struct Extracted {
    pub engine: Engine,
    pub series: Series,
    /// Models past [`MAX_MODELS`] that were ignored.
    pub dropped_models: usize,
    /// Load signals per model (the same models as `series`, plus `""`).
    pub load: BTreeMap<String, Load>,
}

/// Why a scrape yielded nothing to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    #[error("not a Prometheus text exposition (line {line}: {error})")]
    Invalid {
        line: usize,
        error: exposition::LineError,
    },
    #[error("no vLLM or SGLang latency histograms in the exposition")]
    NoEngineMetrics,
}

#[derive(Default)]
struct Partial {
    /// (quantity, model) → (preference, cumulative); a better preference replaces.
    series: HashMap<(Quantity, String), (u8, Cumulative)>,
    load: BTreeMap<String, Load>,
}

/// Finds the engine's histograms in `text`. Malformed lines are skipped when the rest is a
/// usable exposition; when no line is a sample the text is [`ExtractError::Invalid`].
pub fn extract(text: &str, kind: EngineKind) -> Result<Extracted, ExtractError> {
    let mut vllm = Partial::default();
    let mut sglang = Partial::default();
    let mut samples = 0usize;
    let mut first_error = None;
    for (i, line) in text.lines().enumerate() {
        let sample = match exposition::parse_line(line) {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(error) => {
                first_error.get_or_insert(ExtractError::Invalid { line: i + 1, error });
                continue;
            }
        };
        samples += 1;
        if let Some(&(_, engine, signal)) = LOAD_FAMILIES.iter().find(|(n, ..)| *n == sample.name) {
            if sample.value.is_finite() && sample.value >= 0.0 {
                let partial = match engine {
                    Engine::Vllm => &mut vllm,
                    Engine::Sglang => &mut sglang,
                };
                let model = sample.label(MODEL_LABEL).unwrap_or_default().to_owned();
                if partial.load.contains_key(&model) || partial.load.len() < MAX_MODELS + 1 {
                    partial
                        .load
                        .entry(model)
                        .or_default()
                        .add(signal, sample.value);
                }
            }
            continue;
        }
        let (family, is_sum) = if let Some(f) = sample.name.strip_suffix("_sum") {
            (f, true)
        } else if let Some(f) = sample.name.strip_suffix("_count") {
            (f, false)
        } else {
            continue;
        };
        let Some(&(_, engine, quantity, rank)) = FAMILIES.iter().find(|(n, ..)| *n == family)
        else {
            continue;
        };
        if !sample.value.is_finite() || sample.value < 0.0 {
            continue;
        }
        let partial = match engine {
            Engine::Vllm => &mut vllm,
            Engine::Sglang => &mut sglang,
        };
        let model = sample.label(MODEL_LABEL).unwrap_or_default().to_owned();
        let entry = partial
            .series
            .entry((quantity, model))
            .or_insert((rank, Cumulative::default()));
        if rank < entry.0 {
            *entry = (rank, Cumulative::default());
        }
        if rank == entry.0 {
            let add = if is_sum {
                Cumulative {
                    sum: sample.value,
                    count: 0.0,
                }
            } else {
                Cumulative {
                    sum: 0.0,
                    count: sample.value,
                }
            };
            entry.1.add(add);
        }
    }
    if samples == 0
        && let Some(e) = first_error
    {
        return Err(e);
    }
    let (engine, partial) = match kind {
        EngineKind::Vllm => (Engine::Vllm, vllm),
        EngineKind::Sglang => (Engine::Sglang, sglang),
        EngineKind::Auto if !vllm.series.is_empty() => (Engine::Vllm, vllm),
        EngineKind::Auto => (Engine::Sglang, sglang),
    };
    if partial.series.is_empty() {
        return Err(ExtractError::NoEngineMetrics);
    }
    let mut models: Vec<&str> = partial.series.keys().map(|(_, m)| m.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    let kept: Vec<String> = models
        .iter()
        .take(MAX_MODELS)
        .map(|m| (*m).to_owned())
        .collect();
    let dropped_models = models.len().saturating_sub(MAX_MODELS);
    let series = partial
        .series
        .into_iter()
        .filter(|((_, m), _)| kept.binary_search(m).is_ok())
        .map(|(k, (_, c))| (k, c))
        .collect();
    let load = partial
        .load
        .into_iter()
        .filter(|(m, _)| m.is_empty() || kept.binary_search(m).is_ok())
        .collect();
    Ok(Extracted {
        engine,
        series,
        dropped_models,
        load,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="llama",engine="0"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="llama",engine="0"} 4.0
vllm:time_to_first_token_seconds_count{model_name="llama",engine="0"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="llama",engine="0"} 0.4
vllm:time_to_first_token_seconds_count{model_name="llama",engine="1"} 6.0
vllm:time_to_first_token_seconds_sum{model_name="llama",engine="1"} 0.6
vllm:time_to_first_token_seconds_created{model_name="llama",engine="1"} 1.7e9
vllm:e2e_request_latency_seconds_count{model_name="llama"} 10.0
vllm:e2e_request_latency_seconds_sum{model_name="llama"} 20.0
vllm:time_per_output_token_seconds_count{model_name="llama"} 99.0
vllm:time_per_output_token_seconds_sum{model_name="llama"} 9.9
vllm:inter_token_latency_seconds_count{model_name="llama"} 100.0
vllm:inter_token_latency_seconds_sum{model_name="llama"} 1.0
vllm:request_queue_time_seconds_sum{model_name="llama"} 0.5
vllm:request_queue_time_seconds_count{model_name="llama"} 10
vllm:num_requests_running{model_name="llama"} 3.0
vllm:request_success_total{finished_reason="stop",model_name="llama"} 10.0
"#;

    fn get(e: &Extracted, q: Quantity, model: &str) -> Cumulative {
        e.series[&(q, model.to_owned())]
    }

    #[test]
    fn load_signals_per_model_max_kv_and_summed_counts() {
        let text = "vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 1.0\n\
            vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 1.0\n\
            vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.2\n\
            vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.6\n\
            vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 2.0\n\
            vllm:num_requests_waiting{model_name=\"m\",engine=\"1\"} 3.0\n\
            vllm:num_preemptions_total{model_name=\"m\"} 9.0\n\
            vllm:num_requests_running 4.0\n\
            sglang:token_usage 0.9\n";
        let e = extract(text, EngineKind::Auto).unwrap();
        let m = e.load["m"];
        assert_eq!(m.kv_cache_usage, Some(0.6));
        assert_eq!(m.requests_waiting, Some(5.0));
        assert_eq!(m.preemptions_total, Some(9.0));
        assert_eq!(m.requests_running, None);
        assert_eq!(e.load[""].requests_running, Some(4.0));
        // SGLang's gauges are not vLLM's load.
        assert_eq!(e.load[""].kv_cache_usage, None);
        let sglang = "sglang:e2e_request_latency_seconds_count 1\n\
            sglang:e2e_request_latency_seconds_sum 1\n\
            sglang:token_usage 0.9\nsglang:num_queue_reqs 7\n";
        let e = extract(sglang, EngineKind::Auto).unwrap();
        assert_eq!(e.load[""].kv_cache_usage, Some(0.9));
        assert_eq!(e.load[""].requests_waiting, Some(7.0));
    }

    #[test]
    fn vllm_sums_and_counts_add_up_across_engines() {
        let e = extract(VLLM, EngineKind::Auto).unwrap();
        assert_eq!(e.engine, Engine::Vllm);
        let ttft = get(&e, Quantity::Ttft, "llama");
        assert_eq!(ttft.count, 10.0);
        assert!((ttft.sum - 1.0).abs() < 1e-12);
        assert_eq!(get(&e, Quantity::E2e, "llama").sum, 20.0);
        assert_eq!(get(&e, Quantity::Queue, "llama").count, 10.0);
        assert_eq!(e.series.len(), 4, "{:?}", e.series);
    }

    #[test]
    fn the_newer_itl_name_wins_over_the_deprecated_alias_in_any_order() {
        let e = extract(VLLM, EngineKind::Vllm).unwrap();
        assert_eq!(get(&e, Quantity::Itl, "llama").count, 100.0);
        let reversed: String = VLLM.lines().rev().map(|l| format!("{l}\n")).collect();
        let e = extract(&reversed, EngineKind::Vllm).unwrap();
        assert_eq!(get(&e, Quantity::Itl, "llama").count, 100.0);
        let old = "vllm:time_per_output_token_seconds_count{model_name=\"m\"} 5\n";
        let e = extract(old, EngineKind::Auto).unwrap();
        assert_eq!(get(&e, Quantity::Itl, "m").count, 5.0);
    }

    #[test]
    fn sglang_and_unlabelled_series() {
        let text = "sglang:e2e_request_latency_seconds_sum{model_name=\"q\"} 3.0\n\
                    sglang:e2e_request_latency_seconds_count{model_name=\"q\"} 2.0\n\
                    sglang:queue_time_seconds_sum{dp_rank=\"0\"} 1.0\n\
                    sglang:queue_time_seconds_sum{dp_rank=\"1\"} 1.0\n\
                    sglang:queue_time_seconds_count{dp_rank=\"0\"} 4.0\n";
        let e = extract(text, EngineKind::Auto).unwrap();
        assert_eq!(e.engine, Engine::Sglang);
        assert_eq!(get(&e, Quantity::E2e, "q").sum, 3.0);
        assert_eq!(get(&e, Quantity::Queue, "").sum, 2.0);
        assert_eq!(
            extract(text, EngineKind::Vllm).unwrap_err(),
            ExtractError::NoEngineMetrics
        );
    }

    #[test]
    fn garbage_and_foreign_expositions() {
        let html = "<!doctype html>\n<html><body>Not Found</body></html>\n";
        assert!(matches!(
            extract(html, EngineKind::Auto),
            Err(ExtractError::Invalid { line: 1, .. })
        ));
        assert_eq!(
            extract("", EngineKind::Auto).unwrap_err(),
            ExtractError::NoEngineMetrics
        );
        let node = "# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3.5\n";
        assert_eq!(
            extract(node, EngineKind::Auto).unwrap_err(),
            ExtractError::NoEngineMetrics
        );
        // One bad line among good ones is skipped.
        let mixed = format!("{VLLM}this is not a sample\n");
        assert!(extract(&mixed, EngineKind::Auto).is_ok());
        // Negative or non-finite values are not counted.
        let bad = "vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} NaN\n\
                   vllm:e2e_request_latency_seconds_count{model_name=\"m\"} -1\n";
        assert_eq!(
            extract(bad, EngineKind::Auto).unwrap_err(),
            ExtractError::NoEngineMetrics
        );
    }

    #[test]
    fn models_are_capped() {
        let text: String = (0..MAX_MODELS + 3)
            .map(|i| {
                format!("vllm:e2e_request_latency_seconds_count{{model_name=\"m{i:03}\"}} 1\n")
            })
            .collect();
        let e = extract(&text, EngineKind::Auto).unwrap();
        assert_eq!(e.series.len(), MAX_MODELS);
        assert_eq!(e.dropped_models, 3);
    }
}
