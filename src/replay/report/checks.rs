//! The report's tables of what decides and what reproduces a run: the gates, the GPUs
//! (`--gpu-metrics`) and the reproducibility record.

use std::fmt::Write as _;

use super::{
    json::Report,
    md::{num, pct},
    table::{Cell, Table},
};
use crate::replay::gpu::GpuFigures;

fn verdict_cell(g: &crate::replay::gates::Gate) -> Cell {
    use crate::replay::gates::State;
    let text = match g.state {
        State::Unjudged if g.allowed_unjudged => "unjudged (allowed)".to_owned(),
        s => s.as_str().to_owned(),
    };
    Cell {
        text,
        verdict: match g.state {
            State::NotRequested => None,
            _ => Some(if g.pass { "pass" } else { "fail" }),
        },
    }
}

fn value(measure: &str, v: Option<f64>) -> String {
    if measure.contains("rate") || measure.contains("share") || measure.contains("attainment") {
        pct(v)
    } else {
        num(v, 1)
    }
}

/// One row per gate: the run passes only when every one passes.
pub fn gates(r: &Report) -> Table {
    let mut t = Table::new(
        "Gates",
        &["gate", "result", "measure", "target", "actual", "why"],
    );
    t.intro = Some(
        "The run passes only when every gate passes; the exit code is 1 when one fails. A gate asked for but with nothing to judge it by is unjudged, and fails the run unless --allow-unjudged names it.".into(),
    );
    for (name, g) in r.gates.all() {
        let mut why = g.reason.clone().unwrap_or_default();
        if let Some(rep) = &g.repeats {
            let _ = write!(
                why,
                "{}over {} repeats: worst {}, mean {} [{} – {}]",
                if why.is_empty() { "" } else { "; " },
                rep.values.len(),
                value(g.measure, rep.worst),
                value(g.measure, rep.ci.mean),
                value(g.measure, rep.ci.ci95_low),
                value(g.measure, rep.ci.ci95_high)
            );
        }
        if let Some(iso) = &g.isolation {
            let _ = write!(
                why,
                "{}normal attainment beside injected {} vs alone {} (drop {} points, limit {})",
                if why.is_empty() { "" } else { "; " },
                pct(iso.attainment_beside_injected),
                pct(iso.attainment_alone),
                num(iso.drop_points, 1),
                iso.max_drop_points
            );
        }
        let mut row = vec![Cell::from(name.to_owned()), verdict_cell(g)];
        row.extend(
            [
                g.measure.to_owned(),
                value(g.measure, g.target),
                value(g.measure, g.actual),
                why,
            ]
            .map(Cell::from),
        );
        t.rows.push(row);
    }
    t
}

fn gpu_row(label: String, f: &GpuFigures) -> Vec<String> {
    let xid = f.gpu_xid_errors.map_or("absent".into(), |n| n.to_string());
    let or_absent = |v: Option<f64>, d: usize| v.map_or("absent".into(), |v| num(Some(v), d));
    vec![
        label,
        f.gpus.to_string(),
        or_absent(f.gpu_utilization_mean, 1),
        or_absent(f.gpu_utilization_p95, 1),
        or_absent(f.gpu_memory_used_max_mib, 0),
        or_absent(f.gpu_power_mean_w, 1),
        or_absent(f.gpu_temperature_max_c, 0),
        or_absent(f.gpu_sm_clock_min_mhz, 0),
        xid,
    ]
}

/// The GPUs per step and over the run (`--gpu-metrics`).
pub fn gpus(r: &Report) -> Option<Table> {
    // `resources` without exporter URLs holds the hosts alone (`--node-metrics`).
    let res = r.resources.as_ref().filter(|res| !res.urls.is_empty())?;
    let mut t = Table::new(
        "GPUs",
        &[
            "step",
            "GPUs",
            "utilization mean %",
            "utilization P95 %",
            "memory used max MiB",
            "power mean W",
            "temperature max °C",
            "SM clock min MHz",
            "XID errors",
        ],
    );
    let mut intro = format!(
        "From {} (dcgm-exporter), scraped every {}s: {} scrapes, {} failed.",
        res.urls.join(", "),
        res.interval_s,
        res.scrape_attempts,
        res.failed_scrapes
    );
    if let Some(e) = &res.last_error {
        let _ = write!(intro, " Last failure: {e}.");
    }
    intro.push_str(" A figure no exporter served is absent, not zero.");
    if let Some(s) = &res.soak {
        let _ = write!(
            intro,
            " Soak: GPU memory used {} → {} MiB (first → last quarter, {} of the framebuffer, limit +{}), SM clock {} → {} MHz{}",
            num(s.memory_used_first_mib, 0),
            num(s.memory_used_last_mib, 0),
            num(s.memory_growth, 3),
            s.max_memory_growth,
            num(s.sm_clock_first_mhz, 0),
            num(s.sm_clock_last_mhz, 0),
            if s.reasons.is_empty() {
                ".".to_owned()
            } else {
                format!(": {}.", s.reasons.join("; "))
            }
        );
    }
    t.intro = Some(intro);
    for s in &r.steps {
        if let Some(f) = &s.resources {
            t.row(gpu_row(s.label.clone(), f));
        }
    }
    t.row(gpu_row("all".into(), &res.overall));
    Some(t)
}

fn host_row(label: String, h: &crate::replay::host::HostFigures) -> Vec<String> {
    let pct = |v: Option<f64>| v.map_or("absent".to_owned(), |v| format!("{:.1}", v * 100.0));
    vec![
        label,
        h.hosts.to_string(),
        pct(h.memory_available_min_share),
        pct(h.cpu_busy_mean),
        h.network_errors
            .map_or("absent".to_owned(), |v| format!("{v:.0}")),
    ]
}

/// The engine's hosts per step and over the run (`--node-metrics`).
pub fn hosts(r: &Report) -> Option<Table> {
    let all = r.resources.as_ref()?.overall.host.as_ref()?;
    let mut t = Table::new(
        "Hosts",
        &[
            "step",
            "hosts",
            "memory available min %",
            "CPU busy mean %",
            "network errors",
        ],
    );
    if let Some(e) = &all.exporters {
        let mut intro = format!(
            "From {} (node_exporter), scraped every second: {} scrapes, {} failed.",
            e.urls.join(", "),
            e.scrape_attempts,
            e.failed_scrapes
        );
        if let Some(err) = &e.last_error {
            let _ = write!(intro, " Last failure: {err}.");
        }
        intro.push_str(" A figure no host served is absent, not zero.");
        t.intro = Some(intro);
    }
    for s in &r.steps {
        if let Some(h) = s.resources.as_ref().and_then(|f| f.host.as_ref()) {
            t.row(host_row(s.label.clone(), h));
        }
    }
    t.row(host_row("all".into(), all));
    Some(t)
}

/// How to run the same test again: the command, the digests, what the target said.
pub fn reproducibility(r: &Report) -> Table {
    let x = &r.reproducibility;
    let mut t = Table::new("Reproducibility", &["", ""]);
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let short = |v: &serde_json::Value| {
        let s = v.to_string();
        if s.chars().count() > 300 {
            format!("{}…", s.chars().take(300).collect::<String>())
        } else {
            s
        }
    };
    let target = &x.target;
    let mut rows = vec![
        ("command", x.command.clone()),
        ("goodput version", x.goodput_version.clone()),
        ("config SHA-256", dash(&x.config_sha256)),
        ("profile SHA-256", x.profile_sha256.clone()),
        ("probes SHA-256", dash(&x.probes_sha256)),
        (
            "target /v1/models",
            target.models.as_ref().map_or_else(
                || format!("no answer: {}", dash(&target.models_error)),
                short,
            ),
        ),
        ("target Server header", dash(&target.server)),
        (
            "target version",
            match (&target.version_endpoint, &target.version) {
                (Some(p), Some(v)) => format!("{p}: {}", short(v)),
                _ => "no version endpoint answered".into(),
            },
        ),
        ("target identity", target.identity().describe()),
    ];
    if let Some(end) = &x.target_at_end {
        rows.push((
            "target identity at the end",
            match x.target_changed() {
                Some(changed) => format!("{}: {changed}", end.identity().describe()),
                None => format!("{} (unchanged)", end.identity().describe()),
            },
        ));
    }
    if let Some(d) = &x.describe {
        rows.push((
            "describe command",
            format!(
                "{} → {} (exit {}, SHA-256 {}){}",
                d.command,
                d.file,
                d.exit_code.map_or("-".into(), |c| c.to_string()),
                dash(&d.output_sha256),
                d.error.as_ref().map_or(String::new(), |e| format!("; {e}"))
            ),
        ));
    }
    for (k, v) in rows {
        t.row([k.to_owned(), v]);
    }
    t
}
