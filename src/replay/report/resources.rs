//! The report's resources: report.json `resources` (the GPUs and hosts over the steps'
//! windows, a soak's check) and what the `resources` gate reads of them and of the engine.

use crate::replay::{
    attribution,
    cli::{Mode, ReplayArgs},
    describe, gates, gpu, host,
    load::StepRun,
};

/// What the gates read besides the steps and verdicts.
pub(super) struct Judges<'a> {
    /// `--gpu-metrics` was given (`resources` may hold only the hosts).
    pub gpu_metrics: bool,
    /// Answers with a 5xx whose body named out-of-memory.
    pub oom_answers: u64,
    pub attribution: Option<&'a attribution::AttributionOut>,
    pub resources: Option<&'a gpu::ResourcesOut>,
    /// `target changed during the run: ...` (see `Reproducibility::target_changed`).
    pub target_changed: Option<String>,
}

/// What the `resources` gate reads from the exporters' and the engine's figures.
pub(super) fn resource_figures(with: Judges<'_>) -> gates::ResourceFigures {
    let mut f = gates::ResourceFigures {
        oom_answers: with.oom_answers,
        target_changed: with.target_changed.clone(),
        ..gates::ResourceFigures::default()
    };
    if let Some(h) = with.resources.and_then(|r| r.overall.host.as_ref()) {
        let e = h.exporters.clone().unwrap_or_default();
        f.host_scrapes = Some(gates::ScrapeCount {
            attempts: e.scrape_attempts,
            failed: e.failed_scrapes,
            last_error: e.last_error,
        });
        f.host_memory_available_min_share = h.memory_available_min_share;
    }
    if let Some(r) = with.resources.filter(|_| with.gpu_metrics) {
        f.gpu_scrapes = Some(gates::ScrapeCount {
            attempts: r.scrape_attempts,
            failed: r.failed_scrapes,
            last_error: r.last_error.clone(),
        });
        f.xid_before_run = r.gpu_xid_before_run;
        f.xid_during_run = r.overall.gpu_xid_errors;
        f.throttle_share = r.overall.throttle_share;
        if let Some(s) = &r.soak {
            f.soak_checked |= s.holds.is_some();
            if s.holds == Some(false) {
                f.drift.extend(s.reasons.iter().cloned());
            }
        }
    }
    if let Some(at) = with
        .attribution
        .filter(|at| at.engine.is_some() && at.scrapes > 0)
    {
        f.engine_read = true;
        f.engine_restarts = Some(u64::from(at.overall.engine_restarted));
        f.preemptions = at.overall.preemptions;
        if let Some(s) = &at.soak {
            f.soak_checked |= s.holds.is_some();
            if s.holds == Some(false) {
                f.drift.push(format!(
                    "the engine's resources drifted: {}",
                    s.reasons.join("; ")
                ));
            }
        }
    }
    f
}

/// report.json `resources`: the GPUs over every step's window, and a soak's check.
pub(super) fn resources(
    t: &gpu::Telemetry,
    hosts: Option<&gpu::Telemetry<host::HostReading>>,
    windows: &[(f64, f64)],
    runs: &[StepRun],
    a: &ReplayArgs,
) -> gpu::ResourcesOut {
    let (lo, hi) = match (windows.first(), windows.last()) {
        (Some(f), Some(l)) => (f.0, l.1),
        _ => (0.0, 0.0),
    };
    let mut overall = gpu::figures(&t.readings, lo, hi);
    overall.host = hosts.map(|h| host::HostFigures {
        exporters: Some(host::HostScrapes {
            urls: h.urls.iter().map(|u| describe::shown(u)).collect(),
            scrape_attempts: h.scrapes,
            failed_scrapes: h.failed_scrapes,
            last_error: h.last_error.clone(),
        }),
        ..host::figures(&h.readings, lo, hi)
    });
    let soak = match (a.mode, runs.first()) {
        (Mode::Soak, Some(run)) => Some(gpu::soak(
            &t.readings,
            run.window_start_s,
            run.window_end_s,
            a.soak_max_kv_growth,
        )),
        _ => None,
    };
    gpu::ResourcesOut {
        urls: t.urls.iter().map(|u| describe::shown(u)).collect(),
        interval_s: gpu::INTERVAL.as_secs_f64(),
        scrape_attempts: t.scrapes,
        failed_scrapes: t.failed_scrapes,
        last_error: t.last_error.clone(),
        gpu_xid_before_run: gpu::xid_before_run(&t.readings),
        engine_restarts: None,
        overall,
        soak,
        engine_oom_answers: 0,
    }
}
