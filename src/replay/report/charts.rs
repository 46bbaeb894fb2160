//! The report's charts (inline SVG in report.html): the throughput–latency curve with
//! its knee, latency per step, TTFT by input length, goodput, attainment and errors over
//! time, and attainment around a fault.

use super::{
    json::Report,
    svg::{Chart, Mark, Series},
};

pub fn step_charts(r: &Report) -> Vec<Chart> {
    let labels: Vec<String> = r.steps.iter().map(|s| s.label.clone()).collect();
    let idx = |i: usize| i as f64;
    let per_step =
        |title: &str, get: &dyn Fn(&crate::replay::tally::Stats) -> &crate::replay::tally::Pcts| {
            let series = [("p50", 0), ("p95", 1), ("p99", 2)]
                .iter()
                .map(|(name, k)| Series {
                    labels: Vec::new(),
                    name: (*name).into(),
                    points: r
                        .steps
                        .iter()
                        .enumerate()
                        .filter_map(|(i, s)| {
                            let p = get(&s.stats);
                            [p.p50, p.p95, p.p99][*k].map(|v| (idx(i), v))
                        })
                        .collect(),
                })
                .collect();
            Chart {
                title: title.into(),
                x_label: "step".into(),
                y_label: "ms".into(),
                series,
                x_categories: Some(labels.clone()),
                ..Chart::default()
            }
        };
    let target = |f: fn(&super::json::ClassTargets) -> Option<f64>, what: &str| {
        r.contract
            .slo
            .iter()
            .filter_map(|c| f(c).map(|v| (v, format!("{} {what} target", c.name))))
            .collect::<Vec<_>>()
    };
    let mut ttft = per_step("TTFT per step", &|s| &s.ttft_ms);
    ttft.hlines = target(|c| c.ttft_ms, "TTFT");
    let mut tpot = per_step("TPOT per step", &|s| &s.tpot_ms);
    tpot.hlines = target(|c| c.tpot_ms, "TPOT");
    vec![curve(r), ttft, tpot]
}

/// Throughput against P95 TTFT, one point per step (or per engine level when a run has
/// a single step), the knee circled.
fn curve(r: &Report) -> Chart {
    let mut pts: Vec<(f64, f64, String)> = r
        .steps
        .iter()
        .filter_map(|s| {
            Some((
                s.stats.raw_output_tokens_per_s,
                s.stats.ttft_ms.p95?,
                s.label.clone(),
            ))
        })
        .collect();
    if pts.len() < 2
        && let Some(cap) = &r.capacity
    {
        pts = cap
            .levels
            .iter()
            .filter_map(|l| {
                Some((
                    l.throughput_tokens_per_s?,
                    l.ttft_p95_ms?,
                    format!("c={}", l.concurrency),
                ))
            })
            .collect();
    }
    let k = &r.knee;
    let knee_label = match (k.concurrency, k.rate) {
        (_, Some(rate)) => Some(format!("{rate:.2}/s")),
        (Some(c), _) => Some(format!("c={c}")),
        _ => None,
    };
    let marks = match (k.throughput_tokens_per_s, k.ttft_p95_ms, knee_label) {
        (Some(x), Some(y), Some(l)) => vec![Mark {
            x,
            y,
            label: format!("knee {l}"),
        }],
        _ => Vec::new(),
    };
    Chart {
        title: "Throughput–latency curve".into(),
        x_label: "output tokens/s".into(),
        y_label: "P95 TTFT ms".into(),
        series: vec![Series {
            name: "P95 TTFT".into(),
            points: pts.iter().map(|(x, y, _)| (*x, *y)).collect(),
            labels: pts.into_iter().map(|(_, _, l)| l).collect(),
        }],
        marks,
        ..Chart::default()
    }
}

pub fn time_charts(r: &Report) -> Vec<Chart> {
    let t = &r.timeline;
    let series = |name: &str, f: &dyn Fn(&crate::replay::tally::TimePoint) -> Option<f64>| Series {
        labels: Vec::new(),
        name: name.into(),
        points: t.iter().filter_map(|p| Some((p.t_s, f(p)?))).collect(),
    };
    let targets: Vec<(f64, String)> = r
        .verdicts
        .iter()
        .map(|v| (v.attainment_target * 100.0, format!("{} target", v.class)))
        .collect();
    vec![
        Chart {
            title: "Goodput over time".into(),
            x_label: "seconds".into(),
            y_label: "tokens/s".into(),
            series: vec![
                series("effective goodput", &|p| {
                    Some(p.effective_goodput_tokens_per_s)
                }),
                series("raw throughput", &|p| Some(p.raw_output_tokens_per_s)),
            ],
            ..Chart::default()
        },
        Chart {
            title: "SLO attainment over time".into(),
            x_label: "seconds".into(),
            y_label: "%".into(),
            series: vec![series("attainment", &|p| p.attainment.map(|a| a * 100.0))],
            hlines: targets,
            ..Chart::default()
        },
        Chart {
            title: "Error rate over time".into(),
            x_label: "seconds".into(),
            y_label: "% of requests".into(),
            series: vec![series("errors", &|p| p.error_rate.map(|e| e * 100.0))],
            ..Chart::default()
        },
    ]
}

pub fn recovery_chart(r: &crate::replay::recovery::Recovery) -> Chart {
    let points = |f: &dyn Fn(&crate::replay::recovery::Bin) -> Option<f64>| -> Vec<(f64, f64)> {
        r.bins.iter().filter_map(|b| Some((b.t_s, f(b)?))).collect()
    };
    let mut marks = Vec::new();
    if let Some(at) = r.fault_at_s {
        marks.push(Mark {
            x: at,
            y: 0.0,
            label: "fault".into(),
        });
        if let Some(t) = r.recovery_time_s {
            marks.push(Mark {
                x: at + t,
                y: r.attainment_target.unwrap_or(1.0) * 100.0,
                label: "recovered".into(),
            });
        }
    }
    Chart {
        title: "Attainment around the fault (by send time)".into(),
        x_label: "seconds".into(),
        y_label: "%".into(),
        series: vec![Series {
            name: "attainment".into(),
            points: points(&|b| b.attainment.map(|a| a * 100.0)),
            labels: Vec::new(),
        }],
        marks,
        hlines: r
            .attainment_target
            .map(|t| vec![(t * 100.0, "target".to_owned())])
            .unwrap_or_default(),
        ..Chart::default()
    }
}

pub fn input_chart(r: &Report) -> Chart {
    let b = &r.overall.ttft_ms_by_input;
    let series = |name: &str, k: usize| Series {
        labels: Vec::new(),
        name: name.into(),
        points: b
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((i as f64, [b.ttft_ms.p50, b.ttft_ms.p95][k]?)))
            .collect(),
    };
    Chart {
        title: "TTFT by input length".into(),
        x_label: "input tokens".into(),
        y_label: "ms".into(),
        series: vec![series("p50", 0), series("p95", 1)],
        x_categories: Some(b.iter().map(|b| b.bucket.clone()).collect()),
        ..Chart::default()
    }
}

/// GPU utilization (mean and P95) per step beside the engine's KV-cache peak, when both
/// were read: a full cache on a busy GPU is compute-bound, on an idle one it is not.
pub fn gpu_chart(r: &Report) -> Option<Chart> {
    r.resources.as_ref()?;
    let kv = |label: &str| {
        let at = r.attribution.as_ref()?;
        let s = at.steps.iter().find(|s| s.label == label)?;
        s.resources.kv_cache_usage_peak.map(|v| v * 100.0)
    };
    let series = |name: &str, f: &dyn Fn(&super::json::StepOut) -> Option<f64>| Series {
        labels: Vec::new(),
        name: name.into(),
        points: r
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as f64, f(s)?)))
            .collect(),
    };
    Some(Chart {
        title: "GPU utilization and KV cache per step".into(),
        x_label: "step".into(),
        y_label: "%".into(),
        series: vec![
            series("GPU util mean", &|s| {
                s.resources.as_ref()?.gpu_utilization_mean
            }),
            series("GPU util P95", &|s| {
                s.resources.as_ref()?.gpu_utilization_p95
            }),
            series("KV cache peak", &|s| kv(&s.label)),
        ],
        x_categories: Some(r.steps.iter().map(|s| s.label.clone()).collect()),
        ..Chart::default()
    })
}
