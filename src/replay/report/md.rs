//! `report.md`: the report's sections ([`super::sections`]) as Markdown, and the small
//! formatting helpers the tables and sections share.

use std::fmt::Write as _;

use super::json::Report;

/// `v` with `d` decimals, or `-`.
pub fn num(v: Option<f64>, d: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "-".to_owned(), |v| format!("{v:.d$}"))
}

pub fn pct(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "-".to_owned(), |v| format!("{:.2}%", v * 100.0))
}

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

/// The named contract fields that are set, and the other `--contract` keys, as `k=v`.
fn named_fields(c: &super::json::Contract) -> String {
    let named = [
        ("parameters", &c.parameters),
        ("architecture", &c.architecture),
        ("task", &c.task),
        ("batching", &c.batching),
        ("prefix_cache", &c.prefix_cache),
        ("kv_cache", &c.kv_cache),
        ("speculative_decoding", &c.speculative_decoding),
        ("cards", &c.cards),
        ("nodes", &c.nodes),
        ("interconnect", &c.interconnect),
        ("driver_version", &c.driver_version),
        ("framework_version", &c.framework_version),
        ("container_image", &c.container_image),
    ];
    let mut parts: Vec<String> = named
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect();
    parts.extend(c.extra.iter().map(|(k, v)| format!("{k}={v}")));
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The rows of the contract table: (field, value).
pub fn contract_rows(r: &Report) -> Vec<(&'static str, String)> {
    let c = &r.contract;
    let l = &c.load;
    let p = &c.profile;
    let s = &p.summary;
    let mut load = l.mode.to_owned();
    if let Some(cs) = &l.concurrency {
        let cs: Vec<String> = cs.iter().map(u32::to_string).collect();
        let _ = write!(load, ", concurrency {}", cs.join(","));
    }
    if let Some(rates) = &l.rates {
        let rs: Vec<String> = rates.iter().map(|r| format!("{r:.2}")).collect();
        let _ = write!(load, ", rates {}/s", rs.join(","));
    }
    if let Some(rate) = l.soak_rate {
        let _ = write!(load, ", {rate:.2} req/s");
    }
    let _ = write!(load, ", rate scale {}", l.rate_scale);
    let dist = |p50, p95, p99, max| {
        format!(
            "p50 {} · p95 {} · p99 {} · max {}",
            num(p50, 0),
            num(p95, 0),
            num(p99, 0),
            num(max, 0)
        )
    };
    let (i, o) = (&s.input_tokens, &s.output_tokens);
    vec![
        ("target", c.target.clone()),
        ("model", opt(&c.model).to_owned()),
        ("model revision", opt(&c.model_revision).to_owned()),
        (
            "engine",
            format!(
                "{} {}",
                opt(&c.engine),
                c.engine_version.as_deref().unwrap_or("")
            ),
        ),
        ("hardware", opt(&c.hardware).to_owned()),
        ("precision", opt(&c.precision).to_owned()),
        ("run id", c.run_id.clone()),
        ("acceptance fields", named_fields(c)),
        (
            "profile",
            format!("{} ({} requests)", p.files.join(", "), p.requests),
        ),
        (
            "profile id",
            format!("salt {} · hash {}", opt(&p.salt_id), p.hash),
        ),
        ("profile input tokens", dist(i.p50, i.p95, i.p99, i.max)),
        ("profile output tokens", dist(o.p50, o.p95, o.p99, o.max)),
        (
            "profile arrivals",
            format!(
                "{:.2}/s mean, {}/s peak, burstiness {}, prefix reuse {}",
                s.arrival_rate.mean_per_s,
                s.arrival_rate.peak_per_s,
                num(s.arrival_rate.burstiness_cv, 2),
                pct(s.prefix_reuse)
            ),
        ),
        ("load pattern", load),
        (
            "durations",
            format!(
                "step {}s, warm-up {}s{}, run {:.1}s",
                l.step_duration_s,
                l.warmup_s,
                l.soak_duration_s
                    .map(|d| format!(", soak {d}s"))
                    .unwrap_or_default(),
                c.duration_s
            ),
        ),
        (
            "required load",
            match (l.required_concurrency, l.required_rate) {
                (Some(n), _) => format!("concurrency {n}"),
                (None, Some(r)) => format!("{r:.3} req/s"),
                _ => "the whole run".to_owned(),
            },
        ),
        ("prompts", l.prompt_lengths.clone()),
        ("seed", l.seed.to_string()),
        ("started", c.started_at.clone()),
        ("goodput version", c.goodput_version.clone()),
    ]
}

/// report.md: the sections of [`super::sections`] as Markdown (charts left out).
pub fn render(r: &Report) -> String {
    use super::sections::{Block, banner, sections};
    let mut o = String::new();
    let _ = writeln!(o, "# goodput replay: acceptance report\n");
    let _ = writeln!(o, "**{}**", banner(r));
    for sec in sections(r) {
        if let Some(t) = sec.title {
            let _ = writeln!(o, "\n## {t}");
        }
        for b in sec.blocks {
            match b {
                Block::Text(t) => {
                    let _ = writeln!(o, "\n{t}");
                }
                Block::Items(items) => {
                    o.push('\n');
                    for i in items {
                        let _ = writeln!(o, "- {i}");
                    }
                }
                Block::Table(t) => o.push_str(&t.md()),
                Block::Charts(_) => {}
            }
        }
    }
    o
}

/// Rows of the short-request table (step, with long in flight: n, p50/p95; without: n,
/// p50/p95), over the steps and the whole run; empty when no short request had a long one
/// beside it.
pub fn short_rows(r: &Report) -> Vec<[String; 5]> {
    if r.overall.short_ttft_ms.with_long_in_flight.count == 0 {
        return Vec::new();
    }
    let row = |label: &str, s: &crate::replay::tally::ShortTtft| {
        let (w, o) = (&s.with_long_in_flight, &s.without);
        [
            label.to_owned(),
            w.count.to_string(),
            format!("{} / {}", num(w.p50, 1), num(w.p95, 1)),
            o.count.to_string(),
            format!("{} / {}", num(o.p50, 1), num(o.p95, 1)),
        ]
    };
    let mut rows: Vec<[String; 5]> = r
        .steps
        .iter()
        .map(|s| row(&s.label, &s.stats.short_ttft_ms))
        .collect();
    rows.push(row("all", &r.overall.short_ttft_ms));
    rows
}

/// Header and rows of the repeats table (mean [95% CI] per level).
pub const REPEAT_HEAD: [&str; 7] = [
    "level",
    "runs",
    "attainment",
    "goodput tok/s",
    "TTFT p95 ms",
    "TPOT p95 ms",
    "e2e p95 ms",
];

pub fn repeat_rows(r: &Report) -> Vec<[String; 7]> {
    let ci = |c: &crate::replay::repeats::Ci, scale: f64, d: usize| {
        let f = |v: Option<f64>| num(v.map(|v| v * scale), d);
        format!("{} [{}, {}]", f(c.mean), f(c.ci95_low), f(c.ci95_high))
    };
    r.repeats
        .iter()
        .flatten()
        .map(|x| {
            [
                format!("c={}", x.concurrency),
                x.runs.to_string(),
                format!("{}%", ci(&x.attainment, 100.0, 2)),
                ci(&x.effective_goodput_tokens_per_s, 1.0, 1),
                ci(&x.ttft_p95_ms, 1.0, 1),
                ci(&x.tpot_p95_ms, 1.0, 1),
                ci(&x.e2e_p95_ms, 1.0, 1),
            ]
        })
        .collect()
}

/// Failures listed in report.md and report.html (report.json has all).
pub const FAILURES_SHOWN: usize = 20;

/// Rows of the quality table: step, probes, passed, pass rate, finish reasons, length
/// share (shared by report.md and report.html); empty when no step has either.
pub fn quality_rows(r: &Report) -> Vec<[String; 6]> {
    if r.steps
        .iter()
        .all(|s| s.quality.is_none() && s.finish_reasons.is_empty())
    {
        return Vec::new();
    }
    r.steps
        .iter()
        .map(|s| {
            let q = s.quality.as_ref();
            let reasons: Vec<String> = s
                .finish_reasons
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            [
                s.label.clone(),
                q.map_or("-".into(), |q| q.probes.to_string()),
                q.map_or("-".into(), |q| q.passed.to_string()),
                pct(q.and_then(|q| q.pass_rate)),
                if reasons.is_empty() {
                    "-".into()
                } else {
                    reasons.join(", ")
                },
                pct(s.length_share),
            ]
        })
        .collect()
}

/// The abnormal-input table rows (kind, requests, statuses, answer p50/p95/max ms) and
/// the lines on the normal requests beside them (shared by report.md and report.html).
pub fn injection_parts(i: &crate::replay::inject::Injection) -> (Vec<[String; 4]>, Vec<String>) {
    let rows = i
        .kinds
        .iter()
        .map(|k| {
            let st: Vec<String> = k.statuses.iter().map(|(s, n)| format!("{s} {n}")).collect();
            [
                k.kind.to_owned(),
                k.requests.to_string(),
                st.join(", "),
                format!(
                    "{} / {} / {}",
                    num(k.answer_ms.p50, 1),
                    num(k.answer_ms.p95, 1),
                    num(k.answer_ms.max, 1)
                ),
            ]
        })
        .collect();
    let lat = |name: &str, l: &crate::replay::inject::Latency| {
        format!(
            "{name}: {} requests, TTFT p50 {} / p95 {} ms, e2e p95 {} ms",
            l.requests,
            num(l.ttft_ms.p50, 1),
            num(l.ttft_ms.p95, 1),
            num(l.e2e_ms.p95, 1)
        )
    };
    let mut lines = Vec::new();
    if !i.shares.is_empty() {
        lines.push(lat(
            "normal requests with an injected one in flight",
            &i.normal_beside_injected,
        ));
        lines.push(lat("normal requests without", &i.normal_alone));
    }
    if let Some(b) = &i.burst {
        lines.push(format!(
            "burst: {} req/s for {}s in the middle of each step",
            b.rate, b.duration_s
        ));
        lines.push(lat("normal requests sent during a burst", &b.normal_during));
        lines.push(lat(
            "normal requests sent outside bursts",
            &b.normal_outside,
        ));
    }
    (rows, lines)
}

/// The cost lines of the capacity section (shared by report.md and report.html).
pub fn cost_lines(c: &super::json::CostOut) -> Vec<String> {
    let cur = &c.currency;
    let parts: Vec<String> = c
        .components
        .iter()
        .map(|(k, v)| format!("{k} {}", num(Some(*v), 2)))
        .collect();
    let mut lines = vec![
        format!(
            "unit cost: {} {cur} per million effective tokens ({} per million raw)",
            num(c.cost_per_million_effective_tokens, 4),
            num(c.cost_per_million_raw_tokens, 4)
        ),
        format!(
            "{} {cur} per request ({} per request that met its SLO); {} {cur} per stable user per month",
            num(c.cost_per_request, 6),
            num(c.cost_per_effective_request, 6),
            num(c.cost_per_stable_user_per_month, 2)
        ),
        format!(
            "wasted share (output tokens of requests that missed their SLO): {}",
            pct(c.wasted_share)
        ),
        format!(
            "{} {cur}/h: {}",
            num(Some(c.per_hour), 2),
            if parts.is_empty() {
                "-".to_owned()
            } else {
                parts.join(", ")
            }
        ),
    ];
    if let (Some(u), Some(per_hour)) = (&c.usage, c.usage_per_hour) {
        let price = |v: Option<f64>| num(v, 4);
        lines.push(format!(
            "usage prices: {} {cur} per million input tokens ({} cached), {} per million output tokens, {} per request: {} {cur}/h at this load, included above",
            price(u.per_million_input_tokens),
            price(u.per_million_cached_input_tokens.or(u.per_million_input_tokens)),
            price(u.per_million_output_tokens),
            price(u.per_request),
            num(Some(per_hour), 2)
        ));
    }
    if let Some(kw) = c.measured_power_kw {
        lines.push(format!(
            "energy priced at the accelerators' measured power: {} kW (--gpu-metrics)",
            num(Some(kw), 3)
        ));
    }
    if !c.one_time.is_empty() {
        let items: Vec<String> = c
            .one_time
            .iter()
            .map(|(k, v)| format!("{k} {}", num(Some(*v), 0)))
            .collect();
        lines.push(format!(
            "one-time {cur}: {} (amortized as `one_time` above)",
            items.join(", ")
        ));
    }
    lines
}

/// The recovery section, one line per answer (shared by report.md and report.html).
pub fn recovery_lines(r: &crate::replay::recovery::Recovery) -> Vec<String> {
    let mut v = Vec::new();
    let ran = match r.fault_at_s {
        Some(at) => format!(
            "fault `{}` started at {at:.2}s (planned {:.2}s){}",
            r.fault_cmd,
            r.planned_fault_at_s,
            match (r.fault_finished_s, r.fault_exit_code, &r.fault_error) {
                (_, _, Some(e)) => format!(", {e}"),
                (Some(end), Some(code), None) => format!(", exited {code} after {:.2}s", end - at),
                (Some(end), None, None) => format!(", ended by a signal after {:.2}s", end - at),
                _ => String::new(),
            }
        ),
        None => format!(
            "fault `{}` was due at {:.2}s but the run ended first: nothing measured",
            r.fault_cmd, r.planned_fault_at_s
        ),
    };
    v.push(ran);
    if r.fault_at_s.is_none() {
        return v;
    }
    v.push(format!(
        "recovered: {} (attainment back at the target {} for {} intervals of {}s in a row after {} s; deadline {}s)",
        if r.recovered { "yes" } else { "NO" },
        pct(r.attainment_target),
        r.stable_bins,
        r.bin_s,
        num(r.recovery_time_s, 1),
        r.recovery_deadline_s
    ));
    let outcomes: Vec<String> = r
        .failed_outcomes
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    v.push(format!(
        "failed requests: {} ({} cut while in flight){}",
        r.failed_requests,
        r.requests_cut,
        if outcomes.is_empty() {
            String::new()
        } else {
            format!(": {}", outcomes.join(", "))
        }
    ));
    v.push(format!(
        "attainment: {} before the fault, {} from the fault to recovery, worst interval {}",
        pct(r.baseline_attainment),
        pct(r.dip_attainment),
        pct(r.min_attainment)
    ));
    v.push(format!(
        "effective goodput: {} tok/s before the fault, {} tok/s from the fault to recovery",
        num(r.baseline_goodput_tokens_per_s, 1),
        num(r.dip_goodput_tokens_per_s, 1)
    ));
    v
}

/// A relative change as `+12.3%`.
pub fn signed(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "-".to_owned(), |v| format!("{:+.1}%", v * 100.0))
}
