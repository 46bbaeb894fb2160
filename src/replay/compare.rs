//! `goodput replay --compare A/report.json B/report.json`: two runs side by side
//! (`compare.md`, `compare.html` in `--out`), differences beyond noise highlighted.
//!
//! Steps are matched by concurrency, else by rate (within 1%), else by label. A number
//! differs *beyond noise* when |B − A| is more than 5% of |A| **and** more than the two
//! runs' own spread at that step added up: each step reports, per number, half the
//! difference between its first and second half (split by finish time). Percentiles other
//! than P95 take the P95's spread relative to its value; rates take the goodput's.
//! Reports are read as plain JSON, so a report from a newer goodput still compares.
//!
//! The comparison opens with the verdict table ([`super::verdicts`]); a run that failed a
//! gate is FAILED in its column header and never marked `better`: a difference in its
//! favour reads `differs`. `compare.json` holds the verdicts and the differences.

use std::{fmt::Write as _, path::Path};

use serde_json::Value;

use super::{
    conditions::key_differences,
    flips::{self, QualityDiff},
    report::{
        md::signed,
        svg::{Chart, STYLE, Series, escape},
    },
    verdicts::{self, RunVerdict},
};

/// How to compare.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Compare runs measured under different conditions instead of refusing.
    pub allow_different: bool,
    /// `--quality-max-drop`: B's probe pass rate may be at most this many points below A's.
    pub quality_max_drop: Option<f64>,
}

/// A comparison written: its Markdown, and why it failed (exit 1), if it did.
#[derive(Debug, Clone)]
pub struct Compared {
    pub md: String,
    pub failure: Option<String>,
}

/// Relative difference below which nothing is highlighted.
pub const MIN_RELATIVE: f64 = 0.05;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("cannot read `{path}`: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not a replay report: {reason}")]
    NotAReport { path: String, reason: String },
    #[error(
        "the runs were measured under different conditions, so their numbers do not compare: {0} (--allow-different compares them anyway)"
    )]
    Different(String),
    #[error("--compare needs two or more report.json files")]
    TooFew,
    #[error("--quality-max-drop judges two runs (--compare A B), not a matrix")]
    DropNeedsTwo,
    #[error("cannot write to `{path}`: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub(super) fn read(path: &Path) -> Result<Value, CompareError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CompareError::Read {
        path: shown.clone(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| CompareError::NotAReport {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    if !(v.get("contract").is_some() && v.get("steps").is_some_and(Value::is_array)) {
        return Err(CompareError::NotAReport {
            path: shown,
            reason: "no `contract` and `steps`".into(),
        });
    }
    Ok(v)
}

/// (label, path, higher is better, spread key, P95 sibling for relative spread).
type Metric = (
    &'static str,
    &'static [&'static str],
    bool,
    Option<&'static str>,
);

const METRICS: &[Metric] = &[
    ("attainment", &["attainment"], true, Some("attainment")),
    (
        "effective goodput tok/s",
        &["effective_goodput_tokens_per_s"],
        true,
        Some("effective_goodput_tokens_per_s"),
    ),
    (
        "raw throughput tok/s",
        &["raw_output_tokens_per_s"],
        true,
        Some("effective_goodput_tokens_per_s"),
    ),
    ("error rate", &["error_rate"], false, None),
    (
        "TTFT p50 ms",
        &["ttft_ms", "p50"],
        false,
        Some("ttft_p95_ms"),
    ),
    (
        "TTFT p95 ms",
        &["ttft_ms", "p95"],
        false,
        Some("ttft_p95_ms"),
    ),
    (
        "TTFT p99 ms",
        &["ttft_ms", "p99"],
        false,
        Some("ttft_p95_ms"),
    ),
    (
        "TPOT p50 ms",
        &["tpot_ms", "p50"],
        false,
        Some("tpot_p95_ms"),
    ),
    (
        "TPOT p95 ms",
        &["tpot_ms", "p95"],
        false,
        Some("tpot_p95_ms"),
    ),
    ("ITL p95 ms", &["itl_ms", "p95"], false, Some("tpot_p95_ms")),
    ("e2e p95 ms", &["e2e_ms", "p95"], false, Some("e2e_p95_ms")),
];

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    at(v, path).and_then(Value::as_f64)
}

fn text(v: &Value, path: &[&str]) -> String {
    match at(v, path) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// The absolute noise of `metric` at a step: its spread, or its P95 sibling's spread
/// scaled to its value.
fn noise(step: &Value, m: &Metric) -> f64 {
    let Some(key) = m.3 else { return 0.0 };
    let spread = f(step, &["spread", key]).unwrap_or(0.0);
    let own = f(step, m.1);
    let base = match key {
        "ttft_p95_ms" => f(step, &["ttft_ms", "p95"]),
        "tpot_p95_ms" => f(step, &["tpot_ms", "p95"]),
        "e2e_p95_ms" => f(step, &["e2e_ms", "p95"]),
        "effective_goodput_tokens_per_s" => f(step, &["effective_goodput_tokens_per_s"]),
        _ => own,
    };
    match (own, base) {
        (Some(o), Some(b)) if b.abs() > f64::EPSILON => spread * (o / b).abs(),
        _ => spread,
    }
}

/// How B compares with A: `None` within noise, else `Some(better)`.
pub fn beyond_noise(a: f64, b: f64, noise: f64, higher_better: bool) -> Option<bool> {
    let d = b - a;
    (d.abs() > MIN_RELATIVE * a.abs() && d.abs() > noise).then_some((d > 0.0) == higher_better)
}

fn matching<'a>(step: &Value, others: &'a [Value]) -> Option<&'a Value> {
    if let Some(c) = step.get("concurrency").and_then(Value::as_u64) {
        return others
            .iter()
            .find(|o| o.get("concurrency").and_then(Value::as_u64) == Some(c));
    }
    if let Some(r) = f(step, &["rate"])
        && let Some(o) = others
            .iter()
            .find(|o| f(o, &["rate"]).is_some_and(|x| (x - r).abs() <= 0.01 * r.abs()))
    {
        return Some(o);
    }
    others.iter().find(|o| o.get("label") == step.get("label"))
}

/// One row: label, A, B, change, highlight (`better`, `worse` or empty).
type Row = (String, String, String, String, &'static str);

/// `mark` as it may be shown: never `better` for a failed run (B better, or A better
/// when B is `worse`), `differs` instead.
fn fair(mark: &'static str, a_failed: bool, b_failed: bool) -> &'static str {
    match mark {
        "better" if b_failed => "differs",
        "worse" if a_failed => "differs",
        m => m,
    }
}

fn rows(a: &Value, b: &Value, failed: (bool, bool)) -> (Vec<Row>, Vec<(String, Vec<Row>)>) {
    let mut head: Vec<Row> = Vec::new();
    let recorded = [
        "target",
        "model",
        "model_revision",
        "engine",
        "engine_version",
        "hardware",
        "precision",
    ];
    for key in recorded.into_iter().chain(super::report::NAMED_FIELDS) {
        let (x, y) = (text(a, &["contract", key]), text(b, &["contract", key]));
        let mark = if x == y { "" } else { "differs" };
        head.push((key.into(), x, y, String::new(), mark));
    }
    for (label, path) in [
        ("profile hash", &["contract", "profile", "hash"][..]),
        ("load", &["contract", "load", "mode"]),
    ] {
        let (x, y) = (text(a, path), text(b, path));
        let mark = if x == y { "" } else { "differs" };
        head.push((label.into(), x, y, String::new(), mark));
    }
    let mut classes: Vec<String> = Vec::new();
    for r in [a, b] {
        for k in r
            .get("verdict")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|m| m.keys())
        {
            if !classes.contains(k) {
                classes.push(k.clone());
            }
        }
    }
    for c in classes {
        let (x, y) = (text(a, &["verdict", &c]), text(b, &["verdict", &c]));
        let mark = match (x.as_str(), y.as_str()) {
            ("fail", "pass") => "better",
            ("pass", "fail") => "worse",
            _ => "",
        };
        head.push((format!("verdict {c}"), x, y, String::new(), mark));
    }
    for (label, path, up) in [
        (
            "max stable concurrency",
            &["max_stable_concurrency"][..],
            true,
        ),
        ("knee concurrency", &["knee", "concurrency"], true),
        ("knee rate", &["knee", "rate"], true),
        (
            "effective goodput tok/s",
            &["effective_goodput_tokens_per_s"],
            true,
        ),
        (
            "cost per million effective tokens",
            &["cost", "cost_per_million_effective_tokens"],
            false,
        ),
    ] {
        let (x, y) = (f(a, path), f(b, path));
        let mark = match (x, y) {
            (Some(x), Some(y)) => match beyond_noise(x, y, 0.0, up) {
                Some(true) => "better",
                Some(false) => "worse",
                None => "",
            },
            _ => "",
        };
        head.push((label.into(), fmt(x), fmt(y), change(x, y), mark));
    }
    let empty = Vec::new();
    let steps_b = b.get("steps").and_then(Value::as_array).unwrap_or(&empty);
    let mut steps = Vec::new();
    for sa in a.get("steps").and_then(Value::as_array).unwrap_or(&empty) {
        let Some(sb) = matching(sa, steps_b) else {
            continue;
        };
        let mut out = Vec::new();
        for m in METRICS {
            let (x, y) = (f(sa, m.1), f(sb, m.1));
            let mark = match (x, y) {
                (Some(x), Some(y)) => match beyond_noise(x, y, noise(sa, m) + noise(sb, m), m.2) {
                    Some(true) => "better",
                    Some(false) => "worse",
                    None => "",
                },
                _ => "",
            };
            out.push((m.0.to_owned(), fmt(x), fmt(y), change(x, y), mark));
        }
        steps.push((text(sa, &["label"]), out));
    }
    let fair_rows = |rows: &mut Vec<Row>| {
        for r in rows.iter_mut() {
            r.4 = fair(r.4, failed.0, failed.1);
        }
    };
    fair_rows(&mut head);
    for (_, rows) in &mut steps {
        fair_rows(rows);
    }
    (head, steps)
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(
        || "-".into(),
        |v| {
            if v.abs() >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.3}")
            }
        },
    )
}

fn change(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a.abs() > f64::EPSILON => signed(Some((b - a) / a)),
        _ => "-".into(),
    }
}

fn md_table(o: &mut String, names: &[String; 2], rows: &[Row]) {
    let _ = writeln!(
        o,
        "| | {} | {} | change | |\n|---|---|---|---|---|",
        names[0], names[1]
    );
    for (k, x, y, c, m) in rows {
        let m = if m.is_empty() {
            String::new()
        } else {
            format!("**{m}**")
        };
        let _ = writeln!(o, "| {k} | {x} | {y} | {c} | {m} |");
    }
}

fn html_table(o: &mut String, names: &[String; 2], rows: &[Row]) {
    let _ = write!(
        o,
        "<table><tr><th></th><th>{}</th><th>{}</th><th>change</th><th></th></tr>",
        escape(&names[0]),
        escape(&names[1])
    );
    for (k, x, y, c, m) in rows {
        let _ = write!(
            o,
            "<tr class=\"{m}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{m}</td></tr>",
            escape(k),
            escape(x),
            escape(y),
            escape(c)
        );
    }
    o.push_str("</table>");
}

fn curve(name: &str, r: &Value) -> Series {
    let points = r
        .get("steps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| {
            Some((
                f(s, &["raw_output_tokens_per_s"])?,
                f(s, &["ttft_ms", "p95"])?,
            ))
        })
        .collect();
    Series {
        name: name.into(),
        points,
        labels: Vec::new(),
    }
}

/// compare.json of two runs.
#[derive(Debug, serde::Serialize)]
struct CompareJson {
    verdicts: Vec<RunVerdict>,
    /// Key contract fields that differ (compared with --allow-different).
    differences: Vec<String>,
    /// B's probes against A's (`null` when neither run sent probes).
    quality: Option<QualityDiff>,
    /// Why the comparison failed (`--quality-max-drop`), `null` when it did not.
    failure: Option<String>,
}

/// The comparison's closing line: which runs passed, and the gates of each that failed.
pub(super) fn last_line(runs: &[RunVerdict]) -> String {
    let each: Vec<String> = runs
        .iter()
        .map(|r| match r.passed {
            Some(true) => format!("{} passed", r.run),
            Some(false) => format!("{} FAILED: {}", r.run, r.failed_gates().join(", ")),
            None => format!("{} has no gates (older report)", r.run),
        })
        .collect();
    format!("\nVerdicts: {}.\n", each.join("; "))
}

/// Writes `compare.md`, `compare.html` and `compare.json` into `out`.
pub fn run(
    a_path: &Path,
    b_path: &Path,
    out: &Path,
    options: &CompareOptions,
) -> Result<Compared, CompareError> {
    let (a, b) = (read(a_path)?, read(b_path)?);
    let differences = key_differences(&a, &b);
    if !differences.is_empty() && !options.allow_different {
        return Err(CompareError::Different(differences.join("; ")));
    }
    let runs = [verdicts::of("A", &a), verdicts::of("B", &b)];
    let names = [
        verdicts::header("A", &runs[0]),
        verdicts::header("B", &runs[1]),
    ];
    let (head, steps) = rows(&a, &b, (runs[0].failed(), runs[1].failed()));
    let verdict_table = verdicts::table(&["A".into(), "B".into()], &runs);
    let rule = format!(
        "Highlighted: differences over {:.0}% of A and over both runs' own split-half spread at that step.",
        MIN_RELATIVE * 100.0
    );
    let quality = flips::of(&a, &b, options.quality_max_drop);
    let quality_table = quality
        .as_ref()
        .map(|q| q.table([&names[0], &names[1]], &a, &b));
    let mut md = format!(
        "# goodput replay: comparison\n\nA: `{}`\nB: `{}`\n{}{}\n{rule}\n\n## Summary\n\n",
        a_path.display(),
        b_path.display(),
        verdict_table.md(),
        quality_table.as_ref().map(|t| t.md()).unwrap_or_default()
    );
    let differ = (!differences.is_empty()).then(|| {
        format!(
            "The runs were measured under different conditions (compared with --allow-different): {}.",
            differences.join("; ")
        )
    });
    if let Some(d) = &differ {
        let _ = write!(md, "**{d}**\n\n");
    }
    md_table(&mut md, &names, &head);
    let mut html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>goodput replay comparison</title><style>body{{font:14px sans-serif;margin:24px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}tr.better{{background:#e3f6e3}}tr.worse{{background:#fbe3e3}}tr.differs{{background:#fff6d5}}td.pass{{background:#e3f6e3}}td.fail{{background:#fbe3e3}}{STYLE}</style></head><body><h1>goodput replay: comparison</h1><p>A: {}<br>B: {}</p>{}{}<p>{}</p><h2>Summary</h2>",
        escape(&a_path.display().to_string()),
        escape(&b_path.display().to_string()),
        verdict_table.html(),
        quality_table.as_ref().map(|t| t.html()).unwrap_or_default(),
        escape(&rule)
    );
    if let Some(d) = &differ {
        let _ = write!(html, "<p class=\"differs\"><b>{}</b></p>", escape(d));
    }
    html_table(&mut html, &names, &head);
    let chart = Chart {
        title: "Throughput–latency: A and B".into(),
        x_label: "output tokens/s".into(),
        y_label: "P95 TTFT ms".into(),
        series: vec![curve("A", &a), curve("B", &b)],
        ..Chart::default()
    };
    html.push_str(&chart.render());
    for (label, rows) in &steps {
        let _ = write!(md, "\n## Step {label}\n\n");
        md_table(&mut md, &names, rows);
        let _ = write!(html, "<h2>Step {}</h2>", escape(label));
        html_table(&mut html, &names, rows);
    }
    html.push_str("</body></html>\n");
    let write = |name: &str, text: &str| {
        std::fs::create_dir_all(out)
            .and_then(|()| std::fs::write(out.join(name), text))
            .map_err(|source| CompareError::Write {
                path: out.join(name).display().to_string(),
                source,
            })
    };
    md.push_str(&last_line(&runs));
    let failure = quality.as_ref().and_then(|q| q.failure.clone());
    if let Some(f) = &failure {
        // Last, so the screen's last line agrees with the exit code.
        let _ = writeln!(md, "Comparison FAILED: {f}.");
    }
    let json = serde_json::to_string_pretty(&CompareJson {
        verdicts: runs.to_vec(),
        differences,
        quality,
        failure: failure.clone(),
    })
    .map_err(|e| CompareError::Write {
        path: out.join("compare.json").display().to_string(),
        source: std::io::Error::other(e),
    })? + "\n";
    write("compare.md", &md)?;
    write("compare.html", &html)?;
    write("compare.json", &json)?;
    Ok(Compared { md, failure })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_rule() {
        assert_eq!(beyond_noise(100.0, 104.0, 0.0, false), None, "under 5%");
        assert_eq!(
            beyond_noise(100.0, 120.0, 30.0, false),
            None,
            "inside the spread"
        );
        assert_eq!(
            beyond_noise(100.0, 120.0, 5.0, false),
            Some(false),
            "worse latency"
        );
        assert_eq!(
            beyond_noise(100.0, 120.0, 5.0, true),
            Some(true),
            "more goodput"
        );
    }
}
