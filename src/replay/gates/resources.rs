//! The resources gate: GPU and host health and the target's identity over the run, from
//! the figures the report fills in ([`ResourceFigures`]).

use super::{Gate, Thresholds, judged, unjudged, untested};

/// An exporter's scrapes over the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScrapeCount {
    pub attempts: u64,
    pub failed: u64,
    pub last_error: Option<String>,
}

impl ScrapeCount {
    /// Fewer than 90% of the scrapes answered: what it says is too thin to judge by.
    pub fn too_few(&self) -> bool {
        self.attempts == 0
            || (self.attempts - self.failed.min(self.attempts)) * 10 < self.attempts * 9
    }

    fn why(&self, what: &str) -> String {
        let answered = self.attempts - self.failed.min(self.attempts);
        let mut s = if self.attempts == 0 {
            format!("{what} never scraped")
        } else if answered == 0 {
            format!("{what} unreachable")
        } else {
            format!(
                "{what} answered {answered} of {} scrapes (< 90%)",
                self.attempts
            )
        };
        if let Some(e) = &self.last_error {
            s.push_str(&format!(": {e}"));
        }
        s
    }
}

/// What the `resources` gate judges, as plain figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceFigures {
    /// `--gpu-metrics`: the exporters' scrapes (`None`: not asked).
    pub gpu_scrapes: Option<ScrapeCount>,
    /// GPUs whose XID was non-zero at their first scrape, before warm-up.
    pub xid_before_run: Option<u64>,
    /// New XID errors during the measured windows.
    pub xid_during_run: Option<u64>,
    /// The highest share of a GPU's samples with a clock throttle reason set.
    pub throttle_share: Option<f64>,
    /// `--node-metrics`: the node exporters' scrapes (`None`: not asked).
    pub host_scrapes: Option<ScrapeCount>,
    /// The lowest share of memory available on any host.
    pub host_memory_available_min_share: Option<f64>,
    /// The engine's metrics were read (preemptions and restarts mean something).
    pub engine_read: bool,
    pub engine_restarts: Option<u64>,
    pub preemptions: Option<f64>,
    /// Answers with a 5xx whose body named out-of-memory, over the run.
    pub oom_answers: u64,
    /// A soak's drift reasons (engine and GPU memory); a soak checked without drift has
    /// none, and `soak_checked` says it was checked.
    pub soak_checked: bool,
    pub drift: Vec<String>,
    /// What the target said it is changed between the start and the end of the run.
    pub target_changed: Option<String>,
}

/// `resources`, judged from `f` with the run's limits; `slo_failed` is whether the SLO
/// gate failed (preemptions are allowed by default only while it holds).
pub fn resources(f: &ResourceFigures, t: &Thresholds, slo_failed: bool) -> Gate {
    const MEASURE: &str = "GPU and host health: XID errors, clock throttling, engine restarts, preemptions, out-of-memory answers, host memory; the target's identity";
    // An out-of-memory answer, or a target that changed, is seen whatever was asked for.
    let asked = f.target_changed.is_some()
        || f.gpu_scrapes.is_some()
        || f.host_scrapes.is_some()
        || f.soak_checked
        || f.engine_read
        || f.oom_answers > 0;
    if !asked {
        return untested(
            MEASURE,
            "no --gpu-metrics, --node-metrics, engine metrics or soak drift to check",
        );
    }
    let mut blind = Vec::new();
    if let Some(s) = f.gpu_scrapes.as_ref().filter(|s| s.too_few()) {
        blind.push(s.why("gpu exporter"));
    }
    if let Some(s) = &f.host_scrapes {
        if s.too_few() {
            blind.push(s.why("node exporter"));
        } else if f.host_memory_available_min_share.is_none() {
            blind.push(
                "node exporter served no node_memory_MemAvailable_bytes and MemTotal_bytes".into(),
            );
        }
    }
    let mut why = Vec::new();
    if let Some(n) = f.xid_before_run.filter(|n| *n > 0) {
        why.push(format!("XID error present before the run on {n} GPU(s)"));
    }
    if let Some(n) = f.xid_during_run.filter(|n| *n > 0) {
        why.push(format!("{n} XID errors on the GPUs"));
    }
    if let Some(share) = f
        .throttle_share
        .filter(|s| *s > t.max_throttle_share + 1e-9)
    {
        why.push(format!(
            "clocks throttled in {:.1}% of a GPU's samples (limit {:.1}%)",
            share * 100.0,
            t.max_throttle_share * 100.0
        ));
    }
    if f.oom_answers > 0 {
        why.push(format!(
            "the engine ran out of memory: {} answers with a 5xx naming out-of-memory",
            f.oom_answers
        ));
    }
    if let Some(n) = f.engine_restarts.filter(|n| *n > 0) {
        why.push(format!("the engine restarted during the run ({n})"));
    }
    if let Some(p) = f.preemptions.filter(|p| *p > 0.0) {
        match t.max_preemptions {
            Some(max) if p > max + 1e-9 => {
                why.push(format!("{p:.0} preemptions, past --max-preemptions {max}"))
            }
            None if slo_failed => why.push(format!(
                "{p:.0} preemptions while the SLO gate failed (out of KV-cache memory)"
            )),
            _ => {}
        }
    }
    if let Some(m) = f
        .host_memory_available_min_share
        .filter(|m| *m + 1e-9 < t.host_memory_min_share)
    {
        why.push(format!(
            "host memory available fell to {:.1}% (minimum {:.1}%)",
            m * 100.0,
            t.host_memory_min_share * 100.0
        ));
    }
    why.extend(f.drift.iter().cloned());
    why.extend(f.target_changed.iter().cloned());
    let target = f.gpu_scrapes.as_ref().map(|_| 0.0);
    let actual = f.xid_during_run.map(|n| n as f64);
    if why.is_empty() && !blind.is_empty() {
        let mut g = unjudged(MEASURE, blind.join("; "));
        g.target = target;
        g.actual = actual;
        return g;
    }
    // A failure seen is a failure, even where part of the picture is missing.
    why.extend(blind.into_iter().map(|b| format!("unjudged: {b}")));
    judged(MEASURE, target, actual, why, None)
}
