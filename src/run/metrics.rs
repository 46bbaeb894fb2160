//! Every subsystem's metrics, registered in one registry for `/metrics`. Each struct is its
//! subsystem's own (with its own `register`); the names and help texts are all in
//! [`crate::metrics::names`], and docs/METRICS.md lists every exported name (pinned by a
//! test below).

use prometheus_client::{metrics::counter::Counter, registry::Registry};

use crate::{
    admin::AdminMetrics,
    calibrate::CalibrationMetrics,
    config::Config,
    measure::RequestMetrics,
    metrics::{HistogramOptions, LatencyThresholds, NativeBuckets, names},
    otlp::OtlpMetrics,
    profile::ProfileMetrics,
    proxy::LimitMetrics,
    shadow::ShadowMetrics,
    slo::SloClass,
    stats::PhaseMetrics,
    stats::WindowMetrics,
    tokenize::Fallbacks,
};

/// Configuration reloads (`run::Reloader`).
#[derive(Clone, Debug, Default)]
pub struct ReloadMetrics {
    pub reloads: Counter,
    pub failures: Counter,
}

impl ReloadMetrics {
    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> ReloadMetrics {
        let m = ReloadMetrics::default();
        names::RELOAD_FAILURES.register(registry, m.failures.clone());
        names::RELOADS.register(registry, m.reloads.clone());
        m
    }
}

/// The latency histograms' shape from the config: native buckets at `[metrics]`'s
/// precision, and every SLO class's thresholds (its targets and its percentile targets,
/// the default class's too) as classic edges of the metric they bound. Taken at start: a
/// reload that changes a threshold moves the edges at the next restart.
pub fn histogram_options(cfg: &Config) -> HistogramOptions {
    use crate::slo::LatencyMetric;
    let mut t = LatencyThresholds::default();
    let classes: Vec<&SloClass> = cfg.slo.classes.iter().chain([&cfg.slo.default]).collect();
    for class in classes {
        let targets = &class.targets;
        for (into, ms) in [
            (&mut t.ttft, targets.ttft_ms),
            (&mut t.tpot, targets.tpot_ms),
            (&mut t.e2e, targets.e2e_ms),
        ] {
            into.extend(ms.map(|ms| ms / 1000.0));
        }
        for p in &class.percentiles {
            let into = match p.metric {
                LatencyMetric::Ttft => &mut t.ttft,
                LatencyMetric::Tpot => &mut t.tpot,
                LatencyMetric::Itl => &mut t.itl,
                LatencyMetric::E2e => &mut t.e2e,
            };
            into.push(p.max_ms / 1000.0);
        }
    }
    HistogramOptions {
        native: Some(NativeBuckets {
            schema: cfg.metrics.native_histogram_schema,
            max_buckets: cfg.metrics.native_histogram_max_buckets,
        }),
        thresholds: t,
    }
}

/// The handles of every subsystem, as the wiring hands them out.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub requests: RequestMetrics,
    pub windows: WindowMetrics,
    pub reload: ReloadMetrics,
    pub admin: AdminMetrics,
    pub otlp: OtlpMetrics,
    pub tokenizer_fallback: Fallbacks,
    pub profile: ProfileMetrics,
    pub calibration: CalibrationMetrics,
    pub limits: LimitMetrics,
    pub phases: PhaseMetrics,
    pub shadow: ShadowMetrics,
}

impl Metrics {
    /// Registers every subsystem's metrics in `registry`; the latency histograms are
    /// built as `histograms` says.
    pub fn register(registry: &mut Registry, histograms: &HistogramOptions) -> Metrics {
        Metrics {
            requests: RequestMetrics::register(registry, histograms),
            windows: WindowMetrics::register(registry),
            reload: ReloadMetrics::register(registry),
            admin: AdminMetrics::register(registry),
            otlp: OtlpMetrics::register(registry),
            tokenizer_fallback: Fallbacks::register(registry),
            profile: ProfileMetrics::register(registry),
            calibration: CalibrationMetrics::register(registry),
            limits: LimitMetrics::register(registry),
            phases: PhaseMetrics::register(registry, histograms.native),
            shadow: ShadowMetrics::register(registry),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The names `/metrics` exposes (from `# TYPE` lines, with the unit and `_total`
    /// suffixes the exposition adds).
    fn exposed() -> BTreeSet<String> {
        let mut registry = Registry::default();
        Metrics::register(&mut registry, &HistogramOptions::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| {
                let (name, kind) = l.split_once(' ').unwrap();
                if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                }
            })
            .collect()
    }

    /// The names docs/METRICS.md lists under "Every exported name".
    fn documented() -> BTreeSet<String> {
        let doc = include_str!("../../docs/METRICS.md");
        let section = doc
            .split("\n## Every exported name\n")
            .nth(1)
            .expect("docs/METRICS.md has a section \"Every exported name\"");
        let section = section.split("\n## ").next().unwrap();
        section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .map(|l| l.split('`').next().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn every_exported_name_is_documented_and_every_documented_name_exported() {
        let exposed = exposed();
        let documented = documented();
        assert_eq!(exposed.len(), names::ALL.len());
        let undocumented: Vec<_> = exposed.difference(&documented).collect();
        let gone: Vec<_> = documented.difference(&exposed).collect();
        assert!(
            undocumented.is_empty() && gone.is_empty(),
            "exported but not in docs/METRICS.md: {undocumented:?}; documented but not exported: {gone:?}"
        );
    }

    #[test]
    fn every_name_is_registered_once() {
        let mut registry = Registry::default();
        Metrics::register(&mut registry, &HistogramOptions::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let helped: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(helped.len(), names::ALL.len());
        for spec in names::ALL {
            let exposed = match spec.unit {
                None => spec.name.to_owned(),
                Some(crate::metrics::MetricUnit::Seconds) => format!("{}_seconds", spec.name),
                Some(crate::metrics::MetricUnit::Ratio) => format!("{}_ratio", spec.name),
            };
            assert_eq!(
                helped.iter().filter(|n| **n == exposed).count(),
                1,
                "{exposed}"
            );
        }
    }

    /// A registry with a value in every kind of series the request path and the windows
    /// write: counters, integer and float gauges, histograms with labels.
    fn representative_text() -> String {
        use crate::metrics::{
            CalibrationLabels, ClassLabel, ClassReason, ClassSlo, ClassWindow, LatencyLabels,
            ModelPhase, RequestLabels, TokenLabels,
        };
        let mut registry = Registry::default();
        // With native buckets: the text exposition shows the classic ones only.
        let histograms = HistogramOptions {
            native: Some(NativeBuckets {
                schema: 6,
                max_buckets: 512,
            }),
            ..HistogramOptions::default()
        };
        let m = Metrics::register(&mut registry, &histograms);
        let r = &m.requests;
        r.requests
            .get_or_create(&RequestLabels {
                model: "llama".into(),
                api: "chat_completions",
                outcome: "ok",
                class: "interactive".into(),
                slo: "met",
                status_class: "2xx",
            })
            .inc_by(3);
        let l = LatencyLabels {
            model: "llama".into(),
            api: "chat_completions",
            class: "interactive".into(),
        };
        for v in [0.0002, 0.03, 0.3, 1.5, 90.0] {
            r.ttft.get_or_create(&l).observe(v);
            r.duration.get_or_create(&l).observe(v * 2.0);
        }
        r.tpot.get_or_create(&l).observe(0.012);
        r.itl.get_or_create(&l).observe(0.004);
        r.itl.get_or_create(&l).observe(0.25);
        r.token_usage
            .get_or_create(&TokenLabels {
                model: "llama".into(),
                api: "chat_completions",
                class: "interactive".into(),
                gen_ai_token_type: "output",
            })
            .observe(300.0);
        r.slo_misses
            .get_or_create(&ClassReason {
                class: "interactive".into(),
                reason: "ttft",
            })
            .inc();
        r.output_tokens
            .get_or_create(&ClassSlo {
                class: "interactive".into(),
                slo: "met",
            })
            .inc_by(900);
        r.in_flight.set(2);
        let w = ClassWindow {
            class: "interactive".into(),
            window: "5m".into(),
            target: "primary",
        };
        m.windows.attainment.get_or_create(&w).set(0.75);
        m.windows.effective_tps.get_or_create(&w).set(123.456);
        m.windows
            .attainment_target
            .get_or_create(&ClassLabel {
                class: "interactive".into(),
            })
            .set(0.99);
        m.calibration
            .calibration_engine
            .get_or_create(&CalibrationLabels {
                model: "llama".into(),
                metric: "ttft",
            })
            .set(0.125);
        m.phases
            .phases
            .get_or_create(&ModelPhase {
                model: "llama".into(),
                phase: "queue",
            })
            .observe(0.0004);
        m.reload.reloads.inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    /// The exposition with each family's series in label order (a family keeps its series
    /// in a hash map, so their order differs from run to run); every line, and the order
    /// of families and of lines inside a series, are kept as they are.
    fn series_sorted(text: &str) -> Vec<String> {
        fn series_key(line: &str) -> String {
            let labels = line.split_once('{').map_or("", |(_, rest)| rest);
            let labels = labels.split_once('}').map_or(labels, |(l, _)| l);
            labels
                .split(',')
                .filter(|kv| !kv.starts_with("le="))
                .collect::<Vec<_>>()
                .join(",")
        }
        let mut out = Vec::new();
        let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
        let flush = |groups: &mut Vec<(String, Vec<&str>)>, out: &mut Vec<String>| {
            groups.sort_by(|a, b| a.0.cmp(&b.0));
            out.extend(groups.drain(..).flat_map(|(_, l)| l).map(str::to_owned));
        };
        for line in text.lines() {
            if line.starts_with('#') {
                flush(&mut groups, &mut out);
                out.push(line.to_owned());
                continue;
            }
            let key = series_key(line);
            match groups.last_mut() {
                Some((k, lines)) if *k == key => lines.push(line),
                _ => groups.push((key, vec![line])),
            }
        }
        flush(&mut groups, &mut out);
        out
    }

    /// Every line of today's text exposition, byte for byte: dashboards, rules and users'
    /// parsers read these lines, so a library upgrade or a new series kind must not move
    /// them.
    #[test]
    fn text_exposition_is_pinned() {
        let got = series_sorted(&representative_text());
        let pinned = series_sorted(include_str!("exposition.pinned.txt"));
        let first = got.iter().zip(&pinned).position(|(a, b)| a != b);
        assert!(
            first.is_none() && got.len() == pinned.len(),
            "text exposition changed at line {:?} ({} lines, {} pinned):\n got: {:?}\nwant: {:?}",
            first.map(|i| i + 1),
            got.len(),
            pinned.len(),
            first.and_then(|i| got.get(i)),
            first.and_then(|i| pinned.get(i)),
        );
    }
}
