//! The report's tables, built once and drawn by both report.md and report.html, so the
//! two pages always show the same columns and cells.

use std::fmt::Write as _;

use super::{
    json::Report,
    md::{REPEAT_HEAD, injection_parts, num, pct, quality_rows, repeat_rows, short_rows},
    svg::escape,
};
use crate::replay::{attribution::Resources, tally::Pcts};

/// One cell: its text, and `pass`/`fail` when it carries a verdict (bold in Markdown,
/// coloured in HTML).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub text: String,
    pub verdict: Option<&'static str>,
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell {
            text,
            verdict: None,
        }
    }
}

/// A titled table: a heading, an optional paragraph, a header row and rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub title: &'static str,
    pub intro: Option<String>,
    pub head: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(title: &'static str, head: &[&str]) -> Table {
        Table {
            title,
            intro: None,
            head: head.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<I: IntoIterator<Item = String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Cell::from).collect());
    }

    /// `## title`, the paragraph, and a pipe table (pipes and newlines in cells escaped).
    pub fn md(&self) -> String {
        let mut o = if self.title.is_empty() {
            "\n".to_owned()
        } else {
            format!("\n## {}\n\n", self.title)
        };
        if let Some(i) = &self.intro {
            let _ = writeln!(o, "{i}\n");
        }
        let _ = writeln!(
            o,
            "| {} |\n|{}",
            self.head.join(" | "),
            "---|".repeat(self.head.len())
        );
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .map(|c| {
                    let t = c.text.replace('|', "\\|").replace('\n', " ");
                    if c.verdict.is_some() {
                        format!("**{t}**")
                    } else {
                        t
                    }
                })
                .collect();
            let _ = writeln!(o, "| {} |", cells.join(" | "));
        }
        o
    }

    /// `<h2>`, `<p>` and `<table>`, every text escaped.
    pub fn html(&self) -> String {
        let mut o = if self.title.is_empty() {
            String::new()
        } else {
            format!("<h2>{}</h2>", escape(self.title))
        };
        if let Some(i) = &self.intro {
            let _ = write!(o, "<p>{}</p>", escape(i));
        }
        o.push_str("<table><tr>");
        for h in &self.head {
            let _ = write!(o, "<th>{}</th>", escape(h));
        }
        o.push_str("</tr>");
        for row in &self.rows {
            o.push_str("<tr>");
            for c in row {
                match c.verdict {
                    Some(v) => {
                        let _ = write!(o, "<td class=\"{v}\">{}</td>", escape(&c.text));
                    }
                    None => {
                        let _ = write!(o, "<td>{}</td>", escape(&c.text));
                    }
                }
            }
            o.push_str("</tr>");
        }
        o.push_str("</table>");
        o
    }
}

fn p3(p: &Pcts) -> String {
    format!("{} / {} / {}", num(p.p50, 1), num(p.p95, 1), num(p.p99, 1))
}

/// Verdict per SLO class.
pub fn verdicts(r: &Report) -> Table {
    let mut t = Table::new(
        "Verdict per SLO class",
        &[
            "class",
            "verdict",
            "judged at",
            "requests",
            "attainment",
            "target",
            "percentile targets",
            "max stable concurrency",
            "why",
        ],
    );
    for v in &r.verdicts {
        let targets: Vec<String> = v
            .percentile_targets
            .iter()
            .map(|t| {
                format!(
                    "P{} {} {} ms (≤ {})",
                    t.quantile * 100.0,
                    t.metric,
                    num(t.value_ms, 1),
                    t.max_ms
                )
            })
            .collect();
        let mut row: Vec<Cell> = [v.class.clone()].map(Cell::from).to_vec();
        row.push(Cell {
            text: v.verdict.to_owned(),
            verdict: Some(if v.verdict == "pass" { "pass" } else { "fail" }),
        });
        row.extend(
            [
                v.judged_at.clone(),
                v.requests.to_string(),
                pct(v.attainment),
                pct(Some(v.attainment_target)),
                targets.join("; "),
                v.max_stable_concurrency
                    .map_or("-".into(), |c| c.to_string()),
                v.reason.clone().unwrap_or_default(),
            ]
            .map(Cell::from),
        );
        t.rows.push(row);
    }
    t
}

/// One row per step: load, counts, attainment, goodput, latency percentiles, and why
/// requests missed.
pub fn steps(r: &Report) -> Table {
    let mut t = Table::new(
        "Steps",
        &[
            "step",
            "load",
            "requests",
            "errors",
            "attainment",
            "goodput tok/s",
            "TTFT p50/p95/p99 ms",
            "TPOT p50/p95/p99 ms",
            "ITL p95 ms",
            "e2e p95 ms",
            "miss reasons",
        ],
    );
    for s in &r.steps {
        let st = &s.stats;
        let load = match (s.concurrency, s.rate) {
            (Some(c), _) => format!("c={c}"),
            (None, Some(r)) => format!("{r:.2}/s"),
            _ => "-".into(),
        };
        let misses: Vec<String> = s
            .miss_reasons
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        t.row([
            format!(
                "{}{}",
                s.label,
                if s.cut_short { " (cut short)" } else { "" }
            ),
            load,
            st.requests.to_string(),
            st.errors.to_string(),
            pct(st.attainment),
            num(Some(st.effective_goodput_tokens_per_s), 1),
            p3(&st.ttft_ms),
            p3(&st.tpot_ms),
            num(st.itl_ms.p95, 1),
            num(st.e2e_ms.p95, 1),
            if misses.is_empty() {
                "-".into()
            } else {
                misses.join(", ")
            },
        ]);
    }
    t
}

/// Each model's measured requests over the whole measuring time.
pub fn models(r: &Report) -> Table {
    let mut t = Table::new(
        "Per model",
        &[
            "model",
            "requests",
            "errors",
            "attainment",
            "goodput tok/s",
            "TTFT p50/p95/p99 ms",
            "TPOT p50/p95/p99 ms",
            "e2e p95 ms",
        ],
    );
    for (m, st) in &r.by_model {
        t.row([
            m.clone(),
            st.requests.to_string(),
            st.errors.to_string(),
            pct(st.attainment),
            num(Some(st.effective_goodput_tokens_per_s), 1),
            p3(&st.ttft_ms),
            p3(&st.tpot_ms),
            num(st.e2e_ms.p95, 1),
        ]);
    }
    t
}

/// `--repeat`: mean and 95% confidence interval per level.
pub fn repeats(r: &Report) -> Option<Table> {
    let rows = repeat_rows(r);
    (!rows.is_empty()).then(|| {
        let mut t = Table::new("Repeats: mean [95% confidence interval]", &REPEAT_HEAD);
        for row in rows {
            t.row(row);
        }
        t
    })
}

/// TTFT of short requests with and without a long one in flight.
pub fn short(r: &Report) -> Option<Table> {
    let rows = short_rows(r);
    (!rows.is_empty()).then(|| {
        let mut t = Table::new(
            "Short requests beside long ones",
            &[
                "step",
                "with long: requests",
                "p50 / p95 ms",
                "without: requests",
                "p50 / p95 ms",
            ],
        );
        t.intro = Some(format!(
            "TTFT of short requests (≤ {} input tokens) sent while a long one was in flight, and without.",
            r.overall
                .short_ttft_ms
                .short_max_input_tokens
                .map_or("-".into(), |n| n.to_string())
        ));
        for row in rows {
            t.row(row);
        }
        t
    })
}

/// Probes and finish reasons per step.
pub fn quality(r: &Report) -> Option<Table> {
    let rows = quality_rows(r);
    (!rows.is_empty()).then(|| {
        let mut t = Table::new(
            "Quality and finish reasons",
            &[
                "step",
                "probes",
                "passed",
                "pass rate",
                "finish reasons",
                "length share",
            ],
        );
        for row in rows {
            t.row(row);
        }
        t
    })
}

/// How the target answered each kind of abnormal request, and the lines beneath.
pub fn injection(inj: &crate::replay::inject::Injection) -> (Table, Vec<String>) {
    let (rows, lines) = injection_parts(inj);
    let mut t = Table::new(
        "Abnormal input and bursts",
        &["kind", "requests", "statuses", "answer p50 / p95 / max ms"],
    );
    for row in rows {
        t.row(row);
    }
    (t, lines)
}

fn attribution_row(label: String, a: &Resources) -> Vec<String> {
    let ms = |v: Option<f64>| num(v, 1);
    vec![
        format!(
            "{label}{}",
            if a.engine_restarted { " (restart)" } else { "" }
        ),
        a.engine_requests.to_string(),
        ms(a.queue_ms),
        ms(a.prefill_ms),
        ms(a.decode_ms),
        ms(a.outside_engine_ms),
        format!(
            "{} / {}",
            pct(a.kv_cache_usage_peak),
            pct(a.kv_cache_usage_mean)
        ),
        format!(
            "{} / {}",
            num(a.requests_waiting_peak, 0),
            num(a.requests_waiting_mean, 1)
        ),
        num(a.requests_running_mean, 1),
        num(a.batch_jitter, 2),
        num(a.preemptions, 0),
    ]
}

/// Where the target's time went and what its engine held, per step and overall.
pub fn attribution(r: &Report) -> Option<Table> {
    let at = r.attribution.as_ref()?;
    let mut t = Table::new(
        "Attribution and resources",
        &[
            "step",
            "engine requests",
            "queue ms",
            "prefill ms",
            "decode ms",
            "outside engine ms",
            "KV cache peak / mean",
            "waiting peak / mean",
            "running mean",
            "batch jitter",
            "preemptions",
        ],
    );
    let engine = at.engine.map_or("no engine recognized", |e| e.as_str());
    let mut intro = format!(
        "From {} ({engine}), scraped every {}s: {} scrapes, {} failed.",
        at.url, at.interval_s, at.scrapes, at.failed_scrapes
    );
    if let Some(e) = &at.last_error {
        let _ = write!(intro, " Last failure: {e}.");
    }
    intro.push_str(
        " Engine means are over the requests the engine finished between the scrapes in each measuring window; outside engine = the replay's mean e2e minus the engine's.",
    );
    if let Some(s) = &at.soak {
        let verdict = match s.holds {
            Some(true) => "held",
            Some(false) => "FAILED",
            None => "not judged",
        };
        let _ = write!(
            intro,
            " Soak resources {verdict} (first → last quarter: KV cache {} → {}, waiting {} → {}, batch jitter {} → {}; limits +{}, +{}, +{}){}",
            pct(s.kv_cache_usage_first),
            pct(s.kv_cache_usage_last),
            num(s.requests_waiting_first, 1),
            num(s.requests_waiting_last, 1),
            num(s.batch_jitter_first, 2),
            num(s.batch_jitter_last, 2),
            s.limits.max_kv_growth,
            s.limits.max_waiting_growth,
            s.limits.max_jitter_growth,
            if s.reasons.is_empty() {
                ".".to_owned()
            } else {
                format!(": {}.", s.reasons.join("; "))
            }
        );
    }
    t.intro = Some(intro);
    for s in &at.steps {
        t.row(attribution_row(s.label.clone(), &s.resources));
    }
    t.row(attribution_row("all".into(), &at.overall));
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_draws_the_same_cells_in_both_pages() {
        let mut t = Table::new("Things", &["name", "verdict"]);
        t.intro = Some("a < b".into());
        t.rows.push(vec![
            Cell::from("x|y".to_owned()),
            Cell {
                text: "fail".into(),
                verdict: Some("fail"),
            },
        ]);
        assert_eq!(
            t.md(),
            "\n## Things\n\na < b\n\n| name | verdict |\n|---|---|\n| x\\|y | **fail** |\n"
        );
        assert_eq!(
            t.html(),
            "<h2>Things</h2><p>a &lt; b</p><table><tr><th>name</th><th>verdict</th></tr><tr><td>x|y</td><td class=\"fail\">fail</td></tr></table>"
        );
    }
}
