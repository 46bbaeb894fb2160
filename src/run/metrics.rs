//! Every subsystem's metrics, registered in one registry for `/metrics`. Each struct is its
//! subsystem's own (with its own `register`); the names and help texts are all in
//! [`crate::metrics::names`], and docs/METRICS.md lists every exported name (pinned by a
//! test below).

use prometheus_client::{metrics::counter::Counter, registry::Registry};

use crate::{
    admin::AdminMetrics, calibrate::CalibrationMetrics, measure::RequestMetrics, metrics::names,
    otlp::OtlpMetrics, profile::ProfileMetrics, proxy::LimitMetrics, stats::PhaseMetrics,
    stats::WindowMetrics, tokenize::Fallbacks,
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
}

impl Metrics {
    /// Registers every subsystem's metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        Metrics {
            requests: RequestMetrics::register(registry),
            windows: WindowMetrics::register(registry),
            reload: ReloadMetrics::register(registry),
            admin: AdminMetrics::register(registry),
            otlp: OtlpMetrics::register(registry),
            tokenizer_fallback: Fallbacks::register(registry),
            profile: ProfileMetrics::register(registry),
            calibration: CalibrationMetrics::register(registry),
            limits: LimitMetrics::register(registry),
            phases: PhaseMetrics::register(registry),
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
        Metrics::register(&mut registry);
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
        Metrics::register(&mut registry);
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
}
