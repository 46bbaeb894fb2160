//! The request path's metrics ([`RequestMetrics`]): per finished request its latencies,
//! tokens, outcome and verdict; requests in flight; measurements lost. Names and help texts
//! are in [`crate::metrics::names`].

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{RequestRecord, record::status_class, verdict::MissCause};
use crate::metrics::{
    ClassReason, ClassSlo, HistogramFamily, HistogramOptions, HistogramShape, LatencyLabels,
    ModelApi, Name, PassthroughLabels, RequestLabels, TokenLabels, names,
};

/// OTel's TTFT boundaries, extended below 1 ms (a proxy on loopback or a cache hit answers
/// that fast) and up to 60 s (long prompts behind a queue).
const TTFT_BUCKETS: [f64; 21] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
];
/// OTel's TPOT boundaries, extended below 10 ms: small models decode a token in 1–5 ms.
const TPOT_BUCKETS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5,
];
/// OTel's request-duration boundaries, extended below 10 ms and up to 10 minutes: long
/// generations and reasoning runs last minutes.
const DURATION_BUCKETS: [f64; 22] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12,
    10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 600.0, 1200.0,
];
/// Inter-token gaps from 0.5 ms (several tokens per network read coalesce to ~0) to 10 s
/// (a stalled stream).
const ITL_BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// OTel's token-usage boundaries (powers of 4).
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The request path's metrics: latencies, tokens, outcomes and verdicts per finished
/// request, requests in flight, and measurements lost.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    pub ttft: HistogramFamily<LatencyLabels>,
    pub tpot: HistogramFamily<LatencyLabels>,
    pub duration: HistogramFamily<LatencyLabels>,
    pub itl: HistogramFamily<LatencyLabels>,
    pub token_usage: HistogramFamily<TokenLabels>,
    pub requests: Family<RequestLabels, Counter>,
    pub passthrough: Family<PassthroughLabels, Counter>,
    pub slo_misses: Family<ClassReason, Counter>,
    pub finish_reasons: Family<ClassReason, Counter>,
    pub in_flight: Gauge,
    pub dropped: Counter,
    pub decode_failures: Family<ModelApi, Counter>,
    pub output_tokens: Family<ClassSlo, Counter>,
}

impl RequestMetrics {
    /// Creates the handles and registers them in `registry`: the latency histograms with
    /// native buckets and the SLO thresholds as classic edges, as `histograms` says.
    pub fn register(registry: &mut Registry, histograms: &HistogramOptions) -> RequestMetrics {
        let (t, native) = (&histograms.thresholds, histograms.native);
        let latency = |edges: &[f64], thresholds: &[f64]| {
            Family::new_with_constructor(HistogramShape::latency(edges, thresholds, native))
        };
        let m = RequestMetrics {
            ttft: latency(&TTFT_BUCKETS, &t.ttft),
            tpot: latency(&TPOT_BUCKETS, &t.tpot),
            duration: latency(&DURATION_BUCKETS, &t.e2e),
            itl: latency(&ITL_BUCKETS, &t.itl),
            token_usage: Family::new_with_constructor(HistogramShape::classic(&TOKEN_BUCKETS)),
            requests: Family::default(),
            passthrough: Family::default(),
            slo_misses: Family::default(),
            finish_reasons: Family::default(),
            in_flight: Gauge::default(),
            dropped: Counter::default(),
            decode_failures: Family::default(),
            output_tokens: Family::default(),
        };
        names::TTFT.register(registry, m.ttft.clone());
        names::TPOT.register(registry, m.tpot.clone());
        names::DURATION.register(registry, m.duration.clone());
        names::ITL.register(registry, m.itl.clone());
        names::TOKEN_USAGE.register(registry, m.token_usage.clone());
        names::REQUESTS.register(registry, m.requests.clone());
        names::PASSTHROUGH.register(registry, m.passthrough.clone());
        names::SLO_MISSES.register(registry, m.slo_misses.clone());
        names::FINISH_REASONS.register(registry, m.finish_reasons.clone());
        names::IN_FLIGHT.register(registry, m.in_flight.clone());
        names::DROPPED.register(registry, m.dropped.clone());
        names::DECODE_FAILURES.register(registry, m.decode_failures.clone());
        names::OUTPUT_TOKENS.register(registry, m.output_tokens.clone());
        m
    }

    /// Counts a judged request: its outcome and verdict, tokens, miss cause and finish
    /// reason, and its latencies (`gaps`: the inter-token gaps in microseconds) under the
    /// request's `model` label.
    pub fn observe(
        &self,
        record: &RequestRecord,
        model: &Name,
        gaps: &[u32],
        miss_cause: Option<MissCause>,
    ) {
        let api = record.api;
        let class = &record.slo_class;
        let slo = match record.slo_met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "excluded",
        };
        self.requests
            .get_or_create(&RequestLabels {
                model: model.clone(),
                api,
                outcome: record.outcome.as_str(),
                class: class.clone(),
                slo,
                status_class: status_class(record.status),
            })
            .inc();
        if let Some(n) = record.output_tokens {
            self.output_tokens
                .get_or_create(&ClassSlo {
                    class: class.clone(),
                    slo,
                })
                .inc_by(n);
        }
        if let Some(cause) = miss_cause {
            self.slo_misses
                .get_or_create(&ClassReason {
                    class: class.clone(),
                    reason: cause.as_str(),
                })
                .inc();
        }
        if let Some(reason) = record.finish_reason {
            self.finish_reasons
                .get_or_create(&ClassReason {
                    class: class.clone(),
                    reason: reason.as_str(),
                })
                .inc();
        }
        if record.decode_failed {
            self.decode_failures
                .get_or_create(&ModelApi {
                    model: model.clone(),
                    api,
                })
                .inc();
        }
        self.observe_distributions(record, model, gaps);
    }

    /// The request's latencies (`gaps`: the inter-token gaps in microseconds) and token
    /// counts, into their histograms.
    fn observe_distributions(&self, record: &RequestRecord, model: &Name, gaps: &[u32]) {
        let (api, class) = (record.api, &record.slo_class);
        let key = LatencyLabels {
            model: model.clone(),
            api,
            class: class.clone(),
        };
        self.duration
            .get_or_create(&key)
            .observe(record.e2e_ms / 1000.0);
        if let Some(ttft) = record.ttft_ms {
            self.ttft.get_or_create(&key).observe(ttft / 1000.0);
        }
        if let Some(tpot) = record.tpot_ms {
            self.tpot.get_or_create(&key).observe(tpot / 1000.0);
        }
        if !gaps.is_empty() {
            let itl = self.itl.get_or_create(&key);
            for &gap in gaps {
                itl.observe(f64::from(gap) / 1e6);
            }
        }
        for (kind, n) in [
            ("input", record.input_tokens),
            ("output", record.output_tokens),
        ] {
            if let Some(n) = n {
                let labels = TokenLabels {
                    model: model.clone(),
                    api,
                    class: class.clone(),
                    gen_ai_token_type: kind,
                };
                self.token_usage.get_or_create(&labels).observe(n as f64);
            }
        }
    }

    /// Counts a request that is not judged (no generation, and no class opted in).
    pub fn passthrough(&self, record: &RequestRecord) {
        self.passthrough
            .get_or_create(&PassthroughLabels {
                api: record.api,
                status_class: status_class(record.status),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(b: &[f64]) -> bool {
        b.windows(2).all(|w| w[0] < w[1])
    }

    #[test]
    fn buckets_ascend() {
        for b in [
            &TTFT_BUCKETS[..],
            &TPOT_BUCKETS,
            &DURATION_BUCKETS,
            &ITL_BUCKETS,
            &TOKEN_BUCKETS,
        ] {
            assert!(sorted(b), "{b:?}");
        }
        assert!(TTFT_BUCKETS[0] < 0.001 && *TTFT_BUCKETS.last().unwrap() >= 60.0);
        assert!(*DURATION_BUCKETS.last().unwrap() >= 300.0);
        assert_eq!(ITL_BUCKETS[0], 0.0005);
    }

    #[test]
    fn exposition_names_carry_units() {
        let mut registry = Registry::default();
        let m = RequestMetrics::register(&mut registry, &HistogramOptions::default());
        m.requests
            .get_or_create(&RequestLabels {
                model: "m".into(),
                api: "chat_completions",
                outcome: "ok",
                class: "default".into(),
                slo: "met",
                status_class: "2xx",
            })
            .inc();
        let l = LatencyLabels {
            model: "m".into(),
            api: "chat_completions",
            class: "c".into(),
        };
        m.ttft.get_or_create(&l).observe(0.1);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(
                "goodput_requests_total{model=\"m\",api=\"chat_completions\",outcome=\"ok\",class=\"default\",slo=\"met\",status_class=\"2xx\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains("gen_ai_server_time_to_first_token_seconds_bucket"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE goodput_in_flight_requests gauge"),
            "{out}"
        );
        assert!(out.contains("goodput_measurement_dropped_total"), "{out}");
    }
}
