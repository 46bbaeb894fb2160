//! `report.html`: one self-contained page (inline CSS and SVG, no script, no external
//! reference) with the contract, the verdicts, the knee at a glance on the
//! throughput–latency curve, latency percentiles per step, TTFT by input length, goodput,
//! attainment and error rate over time, and the step table.

use std::fmt::Write as _;

use super::{
    json::Report,
    md::{FAILURES_SHOWN, contract_rows, cost_lines, num, pct, recovery_lines, signed},
    svg::{Chart, Mark, STYLE, Series, escape},
};

const PAGE_STYLE: &str = "body{font:14px/1.4 sans-serif;margin:24px;color:#222;max-width:1340px}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
th{background:#f0f0f0}.pass{color:#070;font-weight:bold}.fail{color:#b00;font-weight:bold}\
.banner{font-size:20px;padding:8px 12px;display:inline-block;border-radius:4px}\
.banner.pass{background:#e3f6e3}.banner.fail{background:#fbe3e3}.charts{display:flex;flex-wrap:wrap}";

fn step_charts(r: &Report) -> Vec<Chart> {
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

fn time_charts(r: &Report) -> Vec<Chart> {
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

fn recovery_chart(r: &crate::replay::recovery::Recovery) -> Chart {
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

fn input_chart(r: &Report) -> Chart {
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

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let verdict = if r.passed { "pass" } else { "fail" };
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>goodput replay report</title><style>{PAGE_STYLE}{STYLE}</style></head><body>"
    );
    let _ = write!(
        o,
        "<h1>goodput replay: acceptance report</h1><p class=\"banner {verdict}\">Verdict: {}{}</p>",
        verdict.to_uppercase(),
        if r.interrupted {
            " (interrupted: covers what ran)"
        } else {
            ""
        }
    );
    o.push_str("<h2>Test contract</h2><table>");
    for (k, v) in contract_rows(r) {
        let _ = write!(o, "<tr><th>{k}</th><td>{}</td></tr>", escape(&v));
    }
    o.push_str("</table>");
    o.push_str(&super::checks::gates(r).html());
    o.push_str(&super::table::verdicts(r).html());
    let k = &r.knee;
    let _ = write!(
        o,
        "<h2>Capacity and cost</h2><ul><li>max stable concurrency: <b>{}</b></li><li>knee: concurrency {}, rate {}, throughput {} tok/s, P95 TTFT {} ms</li><li>effective goodput: <b>{} tok/s</b> (at {})</li>",
        r.max_stable_concurrency
            .map_or("-".into(), |c| c.to_string()),
        k.concurrency.map_or("-".into(), |c| c.to_string()),
        num(k.rate, 2),
        num(k.throughput_tokens_per_s, 1),
        num(k.ttft_p95_ms, 1),
        num(r.effective_goodput_tokens_per_s, 1),
        escape(r.operating_point.as_deref().unwrap_or("-"))
    );
    if let Some(c) = &r.cost {
        for line in cost_lines(c) {
            let _ = write!(o, "<li>{}</li>", escape(&line));
        }
    }
    o.push_str("</ul><div class=\"charts\">");
    let mut charts = step_charts(r);
    charts.push(input_chart(r));
    charts.extend(time_charts(r));
    for c in charts {
        o.push_str(&c.render());
    }
    o.push_str("</div>");
    o.push_str(&super::table::steps(r).html());
    o.push_str(&super::table::models(r).html());
    if let Some(t) = super::table::attribution(r) {
        o.push_str(&t.html());
    }
    if let Some(t) = super::checks::gpus(r) {
        o.push_str(&t.html());
    }
    let g = &r.generator;
    let lag = g.schedule_lag_ms.as_ref();
    let _ = write!(
        o,
        "<h2>Generator fidelity</h2><p>{} requests sent; schedule lag p50 {} ms, p99 {} ms; {}.</p>",
        g.requests_sent,
        num(lag.and_then(|l| l.p50), 2),
        num(lag.and_then(|l| l.p99), 2),
        if g.kept_up {
            "kept up"
        } else {
            "<b class=\"fail\">did not keep up</b>: the target saw less load than planned"
        }
    );
    if let Some(d) = &r.drift {
        let _ = write!(
            o,
            "<h2>Drift over the soak</h2><p>First against last interval: raw throughput {}, P95 TTFT {}, P95 e2e {}, error rate {} → {}.</p>",
            signed(d.raw_throughput_change),
            signed(d.ttft_p95_change),
            signed(d.e2e_p95_change),
            pct(d.error_rate_first),
            pct(d.error_rate_last)
        );
    }
    for t in [super::table::repeats(r), super::table::short(r)]
        .into_iter()
        .flatten()
    {
        o.push_str(&t.html());
    }
    if let Some(t) = super::table::quality(r) {
        o.push_str(&t.html());
        if let Some(q) = &r.quality {
            let _ = write!(
                o,
                "<p>Probes over the run: {} of {} passed ({}).</p><ul>",
                q.passed,
                q.probes,
                pct(q.pass_rate)
            );
            for f in q.failures.iter().take(FAILURES_SHOWN) {
                let _ = write!(
                    o,
                    "<li class=\"fail\">{} ({}, {}): {}; answer: <code>{}</code></li>",
                    escape(&f.name),
                    escape(&f.step),
                    escape(&f.request_id),
                    escape(&f.reason),
                    escape(&f.answer)
                );
            }
            o.push_str("</ul>");
        }
    }
    if let Some(inj) = &r.injection {
        let (t, lines) = super::table::injection(inj);
        o.push_str(&t.html());
        o.push_str("<ul>");
        for l in lines {
            let _ = write!(o, "<li>{}</li>", escape(&l));
        }
        o.push_str("</ul>");
    }
    if let Some(rec) = &r.recovery {
        o.push_str("<h2>Recovery</h2><ul>");
        for line in recovery_lines(rec) {
            let _ = write!(o, "<li>{}</li>", escape(&line));
        }
        o.push_str("</ul>");
        if !rec.bins.is_empty() {
            let _ = write!(
                o,
                "<div class=\"charts\">{}</div>",
                recovery_chart(rec).render()
            );
        }
    }
    o.push_str(&super::checks::reproducibility(r).html());
    if !r.notes.is_empty() {
        o.push_str("<h2>Notes</h2><ul>");
        for n in &r.notes {
            let _ = write!(o, "<li>{}</li>", escape(n));
        }
        o.push_str("</ul>");
    }
    o.push_str("</body></html>\n");
    o
}
