//! The report for people, built once as sections of prose, lists, tables and charts, in
//! the order an acceptance reader asks: did it pass (the gates), what was tested (the
//! contract), per class, where is the knee and what does it cost, the per-step numbers,
//! then the details (engine, GPUs, latency by kind of request, the generator, the soak,
//! repeats, quality, abnormal input, recovery) and how to reproduce it. report.md
//! ([`super::md`]) and report.html ([`super::html`]) only render these sections, so the
//! two pages always say the same thing. Inline `**bold**` and `` `code` `` are the only
//! markup a text may carry.

use super::{
    charts, checks,
    json::Report,
    md::{FAILURES_SHOWN, contract_rows, cost_lines, num, pct, recovery_lines, signed},
    svg::Chart,
    table::{self, Table},
};

/// One piece of a section.
pub enum Block {
    Text(String),
    Items(Vec<String>),
    /// A table brings its own heading.
    Table(Table),
    /// HTML only: Markdown has no pictures.
    Charts(Vec<Chart>),
}

/// A heading (or none: a table's own) and its blocks.
pub struct Section {
    pub title: Option<&'static str>,
    pub blocks: Vec<Block>,
}

fn titled(title: &'static str, blocks: Vec<Block>) -> Section {
    Section {
        title: Some(title),
        blocks,
    }
}

fn table(t: Table) -> Section {
    Section {
        title: None,
        blocks: vec![Block::Table(t)],
    }
}

/// The banner: the verdict, and whether the run was cut short.
pub fn banner(r: &Report) -> String {
    format!(
        "Verdict: {}{}",
        if r.passed { "PASS" } else { "FAIL" },
        if r.interrupted {
            " (interrupted: covers what ran)"
        } else {
            ""
        }
    )
}

/// `--mode limits`: what the probes found, in the capacity section.
fn limits_lines(l: &crate::replay::limits::LimitsOut) -> Vec<String> {
    let n = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
    vec![
        format!(
            "maximum input: **{} tokens** accepted, {} refused ({}); counted as {}",
            n(l.max_input_tokens),
            n(l.refused_input_tokens),
            l.refused_with.as_deref().unwrap_or("-"),
            l.tokenizer
        ),
        format!(
            "maximum output: **{} tokens** given to a request asking {} (finish reason {})",
            n(l.max_output_tokens),
            n(l.output_asked),
            l.output_finish_reason.as_deref().unwrap_or("-")
        ),
        format!(
            "concurrency ceiling at the SLO: **{}** ({} probe requests before the steps)",
            l.ceiling_concurrency.map_or("-".into(), |c| c.to_string()),
            l.probes
        ),
    ]
}

fn capacity(r: &Report) -> Section {
    let k = &r.knee;
    let mut items = vec![
        format!(
            "max stable concurrency: **{}**",
            r.max_stable_concurrency
                .map_or("-".into(), |c| c.to_string())
        ),
        format!(
            "knee: concurrency {}, rate {}, throughput {} tok/s, P95 TTFT {} ms ({})",
            k.concurrency.map_or("-".into(), |c| c.to_string()),
            num(k.rate, 2),
            num(k.throughput_tokens_per_s, 1),
            num(k.ttft_p95_ms, 1),
            k.rule
        ),
        format!(
            "effective goodput: **{} tok/s** (at {})",
            num(r.effective_goodput_tokens_per_s, 1),
            r.operating_point.as_deref().unwrap_or("-")
        ),
    ];
    if let Some(l) = &r.limits {
        items.extend(limits_lines(l));
    }
    if let Some(c) = &r.cost {
        items.extend(cost_lines(c));
    }
    let mut charts = charts::step_charts(r);
    charts.push(charts::input_chart(r));
    charts.extend(charts::time_charts(r));
    titled(
        "Capacity and cost",
        vec![Block::Items(items), Block::Charts(charts)],
    )
}

/// The live summary's views of the measured requests: TTFT by input length and by
/// prefix-cache hit, e2e by output length, input tokens/s.
fn by_kind(r: &Report) -> Option<Section> {
    let o = &r.overall;
    let mut t = Table::new(
        "Latency by kind of request (all measured requests)",
        &["requests", "kind", "n", "p50 ms", "p95 ms", "p99 ms"],
    );
    t.intro = Some(format!(
        "Input: {} tokens, {} tokens/s over the measuring time.",
        o.input_tokens_total,
        num(Some(o.input_tokens_per_s), 1)
    ));
    let mut row = |what: &str, kind: String, n: usize, p: &crate::replay::tally::Pcts| {
        t.row([
            what.to_owned(),
            kind,
            n.to_string(),
            num(p.p50, 1),
            num(p.p95, 1),
            num(p.p99, 1),
        ]);
    };
    for b in &o.ttft_ms_by_input {
        row(
            "TTFT by input tokens",
            b.bucket.clone(),
            b.requests,
            &b.ttft_ms,
        );
    }
    for b in &o.e2e_ms_by_output {
        row(
            "e2e by output tokens",
            b.bucket.clone(),
            b.requests,
            &b.e2e_ms,
        );
    }
    let c = &o.ttft_ms_by_cache;
    for (kind, p) in [("prefix-cache hit", &c.hit), ("prefix-cache miss", &c.miss)] {
        if p.count > 0 {
            row("TTFT", kind.into(), p.count, p);
        }
    }
    (!t.rows.is_empty()).then(|| table(t))
}

fn generator(r: &Report) -> Section {
    let g = &r.generator;
    let lag = g.schedule_lag_ms.as_ref();
    titled(
        "Generator fidelity",
        vec![Block::Text(format!(
            "{} requests sent; schedule lag p50 {} ms, p99 {} ms, max {} ms; {}.",
            g.requests_sent,
            num(lag.and_then(|l| l.p50), 2),
            num(lag.and_then(|l| l.p99), 2),
            num(lag.and_then(|l| l.max), 2),
            if g.kept_up {
                "the generator kept up".to_owned()
            } else {
                format!(
                    "**the generator did not keep up** (lag P99 over {} ms or in-flight cap reached): the target saw less load than planned",
                    g.lag_p99_limit_ms
                )
            }
        ))],
    )
}

fn drift(d: &super::json::Drift) -> Section {
    titled(
        "Drift over the soak",
        vec![Block::Text(format!(
            "First against last {}s interval ({} intervals): raw throughput {}, effective goodput {}, P95 TTFT {}, P95 e2e {}, error rate {} → {}; P99 jitter across the intervals (σ/mean): TTFT {}, ITL {}.",
            d.interval_s,
            d.intervals,
            signed(d.raw_throughput_change),
            signed(d.effective_goodput_change),
            signed(d.ttft_p95_change),
            signed(d.e2e_p95_change),
            pct(d.error_rate_first),
            pct(d.error_rate_last),
            num(d.p99_ttft_jitter, 3),
            num(d.p99_itl_jitter, 3)
        ))],
    )
}

fn quality(r: &Report) -> Vec<Section> {
    let Some(t) = table::quality(r) else {
        return Vec::new();
    };
    let mut out = vec![table(t)];
    if let Some(q) = &r.quality {
        let mut items: Vec<String> = q
            .failures
            .iter()
            .take(FAILURES_SHOWN)
            .map(|f| {
                format!(
                    "{} ({}, `{}`): {}; answer: {:?}",
                    f.name, f.step, f.request_id, f.reason, f.answer
                )
            })
            .collect();
        if q.failures.len() > FAILURES_SHOWN {
            items.push(format!(
                "… {} more in report.json",
                q.failures.len() - FAILURES_SHOWN
            ));
        }
        let per_probe: Vec<String> = q
            .by_probe
            .iter()
            .map(|t| {
                format!(
                    "{} {}/{} ({})",
                    t.name,
                    t.passed,
                    t.probes,
                    pct(t.pass_rate)
                )
            })
            .collect();
        out.push(Section {
            title: None,
            blocks: vec![
                Block::Text(format!(
                    "Probes over the run: {} of {} passed ({}); per probe: {}.",
                    q.passed,
                    q.probes,
                    pct(q.pass_rate),
                    per_probe.join(", ")
                )),
                Block::Items(items),
            ],
        });
    }
    out
}

/// Every section of the report, in reading order.
pub fn sections(r: &Report) -> Vec<Section> {
    let mut s = vec![
        table(checks::gates(r)),
        titled("Test contract", vec![Block::Table(contract_table(r))]),
        table(table::verdicts(r)),
        capacity(r),
        table(table::steps(r)),
        table(table::models(r)),
    ];
    s.extend(table::attribution(r).map(table));
    if let Some(t) = checks::gpus(r) {
        s.push(Section {
            title: None,
            blocks: vec![
                Block::Table(t),
                Block::Charts(charts::gpu_chart(r).into_iter().collect()),
            ],
        });
    }
    s.extend(checks::hosts(r).map(table));
    s.extend(by_kind(r));
    s.push(generator(r));
    s.extend(r.drift.as_ref().map(drift));
    s.extend(
        [table::repeats(r), table::short(r)]
            .into_iter()
            .flatten()
            .map(table),
    );
    s.extend(quality(r));
    if let Some(inj) = &r.injection {
        let (t, lines) = table::injection(inj);
        s.push(table(t));
        s.push(Section {
            title: None,
            blocks: vec![Block::Items(lines)],
        });
    }
    if let Some(rec) = &r.recovery {
        let mut blocks = vec![Block::Items(recovery_lines(rec))];
        if !rec.bins.is_empty() {
            blocks.push(Block::Charts(vec![charts::recovery_chart(rec)]));
        }
        s.push(titled("Recovery", blocks));
    }
    s.push(table(checks::reproducibility(r)));
    if !r.notes.is_empty() {
        s.push(titled("Notes", vec![Block::Items(r.notes.clone())]));
    }
    s
}

/// The contract as a two-column table without a heading of its own.
fn contract_table(r: &Report) -> Table {
    let mut t = Table::new("", &["", ""]);
    for (k, v) in contract_rows(r) {
        t.row([k.to_owned(), v]);
    }
    t
}
