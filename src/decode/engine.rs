//! The engine's own account of one request's time, where the response carries it:
//!
//! - vLLM started with `--enable-per-request-metrics`: a `metrics` object on the final
//!   usage chunk of a stream (so only when usage was asked for, by the client or by usage
//!   injection) and in a non-streamed body: `queue_time_ms` (waiting to be scheduled),
//!   `time_to_first_token_ms` (scheduled to first token: prefill), `generation_time_ms`
//!   (first token to last: decode).
//! - SGLang's `meta_info` (native `/generate`, and wherever it adds one): `queue_time`
//!   (seconds), `forward_entry_time` and `prefill_finished_time` (wall-clock seconds; their
//!   difference is prefill), `inference_time` (seconds, scheduled to finished).
//! - TGI's response headers on `/generate`: `x-queue-time` and `x-inference-time`
//!   (milliseconds; inference is prefill and decode together).
//!
//! Times are kept in whole microseconds so that the event types stay `Eq`; a value that
//! is missing, negative, not finite or absurd (over a day) is absent, never zero.

use http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::wire::lenient_object;

/// One request's time as the engine measured it. Every part may be missing.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct EngineTiming {
    /// Waiting in the engine's queue before being scheduled.
    pub queue_us: Option<u64>,
    /// From scheduling to the first token.
    pub prefill_us: Option<u64>,
    /// From the first token to the last.
    pub decode_us: Option<u64>,
    /// Prefill and decode together, where the engine reports only their sum (TGI,
    /// SGLang), or their sum where it reports both.
    pub inference_us: Option<u64>,
}

/// A day: no request spends longer in an engine; anything larger is a unit mistake.
const MAX_US: f64 = 86_400.0 * 1e6;

fn micros(value: Option<f64>, unit_us: f64) -> Option<u64> {
    let us = value? * unit_us;
    (us.is_finite() && (0.0..=MAX_US).contains(&us)).then(|| us.round() as u64)
}

impl EngineTiming {
    fn is_empty(&self) -> bool {
        *self == EngineTiming::default()
    }

    /// `Some` only when at least one part is known.
    fn non_empty(self) -> Option<EngineTiming> {
        (!self.is_empty()).then_some(self)
    }

    /// Fills in the sum of prefill and decode when both are known and the engine gave none.
    fn with_inference(mut self) -> EngineTiming {
        if self.inference_us.is_none()
            && let (Some(p), Some(d)) = (self.prefill_us, self.decode_us)
        {
            self.inference_us = Some(p.saturating_add(d));
        }
        self
    }

    /// vLLM's per-request `metrics` object (milliseconds).
    pub(crate) fn from_vllm(raw: Option<&RawValue>) -> Option<EngineTiming> {
        let wire: VllmMetrics = lenient_object(raw)?;
        EngineTiming {
            queue_us: micros(wire.queue_time_ms, 1e3),
            prefill_us: micros(wire.time_to_first_token_ms, 1e3),
            decode_us: micros(wire.generation_time_ms, 1e3),
            inference_us: None,
        }
        .with_inference()
        .non_empty()
    }

    /// SGLang's `meta_info` (seconds, and wall-clock seconds for the two instants).
    pub(crate) fn from_sglang(raw: Option<&RawValue>) -> Option<EngineTiming> {
        let wire: SglangMetaInfo = lenient_object(raw)?;
        let prefill = match (wire.forward_entry_time, wire.prefill_finished_time) {
            (Some(start), Some(end)) => Some(end - start),
            _ => None,
        };
        let prefill_us = micros(prefill, 1e6);
        let inference_us = micros(wire.inference_time, 1e6);
        let decode_us = match (inference_us, prefill_us) {
            (Some(i), Some(p)) => i.checked_sub(p),
            _ => None,
        };
        EngineTiming {
            queue_us: micros(wire.queue_time, 1e6),
            prefill_us,
            decode_us,
            inference_us,
        }
        .non_empty()
    }

    /// TGI's timing headers (milliseconds).
    pub fn from_headers(headers: &HeaderMap) -> Option<EngineTiming> {
        let ms = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        EngineTiming {
            queue_us: micros(ms("x-queue-time"), 1e3),
            prefill_us: None,
            decode_us: None,
            inference_us: micros(ms("x-inference-time"), 1e3),
        }
        .non_empty()
    }
}

#[derive(Deserialize)]
struct VllmMetrics {
    #[serde(default)]
    queue_time_ms: Option<f64>,
    #[serde(default)]
    time_to_first_token_ms: Option<f64>,
    #[serde(default)]
    generation_time_ms: Option<f64>,
}

#[derive(Deserialize)]
struct SglangMetaInfo {
    #[serde(default)]
    queue_time: Option<f64>,
    #[serde(default)]
    forward_entry_time: Option<f64>,
    #[serde(default)]
    prefill_finished_time: Option<f64>,
    #[serde(default)]
    inference_time: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap()
    }

    #[test]
    fn vllm_metrics_become_queue_prefill_and_decode() {
        let m = raw(
            r#"{"time_to_first_token_ms":75.25,"generation_time_ms":300.0,
                "queue_time_ms":40.0,"mean_itl_ms":10.0,"tokens_per_second":90.1}"#,
        );
        let t = EngineTiming::from_vllm(Some(&m)).unwrap();
        assert_eq!(t.queue_us, Some(40_000));
        assert_eq!(t.prefill_us, Some(75_250));
        assert_eq!(t.decode_us, Some(300_000));
        assert_eq!(t.inference_us, Some(375_250));
    }

    #[test]
    fn odd_values_are_absent_never_zero() {
        // null, negative, a string, a unit mistake: each loses only itself.
        let m =
            raw(r#"{"queue_time_ms":null,"time_to_first_token_ms":-1,"generation_time_ms":1e300}"#);
        assert_eq!(EngineTiming::from_vllm(Some(&m)), None);
        let m = raw(r#"{"queue_time_ms":"5"}"#);
        assert_eq!(EngineTiming::from_vllm(Some(&m)), None);
        let m = raw(r#"{"queue_time_ms":0.015}"#);
        let t = EngineTiming::from_vllm(Some(&m)).unwrap();
        assert_eq!(
            (t.queue_us, t.prefill_us, t.inference_us),
            (Some(15), None, None)
        );
        assert_eq!(EngineTiming::from_vllm(Some(&raw("null"))), None);
        assert_eq!(EngineTiming::from_vllm(Some(&raw("[1]"))), None);
        assert_eq!(EngineTiming::from_vllm(None), None);
    }

    #[test]
    fn sglang_meta_info_in_seconds() {
        let m = raw(r#"{"id":"x","prompt_tokens":10,"queue_time":0.04,
                "forward_entry_time":1700000000.5,"prefill_finished_time":1700000000.575,
                "inference_time":0.375,"e2e_latency":0.5}"#);
        let t = EngineTiming::from_sglang(Some(&m)).unwrap();
        assert_eq!(t.queue_us, Some(40_000));
        // Wall-clock seconds near 1.7e9 keep about a microsecond of precision.
        let prefill = t.prefill_us.unwrap();
        assert!(prefill.abs_diff(75_000) <= 1, "{prefill}");
        assert_eq!(t.inference_us, Some(375_000));
        assert!(t.decode_us.unwrap().abs_diff(300_000) <= 1);
    }

    #[test]
    fn tgi_headers_in_milliseconds() {
        let mut h = HeaderMap::new();
        h.insert("x-queue-time", "40".parse().unwrap());
        h.insert("x-inference-time", "375".parse().unwrap());
        h.insert("x-time-per-token", "12".parse().unwrap());
        let t = EngineTiming::from_headers(&h).unwrap();
        assert_eq!(t.queue_us, Some(40_000));
        assert_eq!(t.inference_us, Some(375_000));
        assert_eq!((t.prefill_us, t.decode_us), (None, None));
        assert_eq!(EngineTiming::from_headers(&HeaderMap::new()), None);
        h.insert("x-queue-time", "soon".parse().unwrap());
        h.remove("x-inference-time");
        assert_eq!(EngineTiming::from_headers(&h), None);
    }
}
