//! `goodput replay --compare A B C …` with three or more reports: a matrix with one column
//! per run (model × hardware × software version, from each contract) and one row per
//! number — the headline goodput and capacity, attainment, the P99 rows of TTFT, TPOT,
//! ITL and e2e over all measured requests, error rate and unit cost — written as
//! `compare.md`, `compare.html` and `compare.json` in `--out`.
//!
//! Scaling efficiency, when contracts give card counts (`--contract cards=N`): for each
//! run, its effective goodput divided by N times the per-card goodput of the run with the
//! fewest cards among those of the same model, hardware and software (ideally one card):
//! 1.0 is linear scaling. The matrix compares across the system (model, hardware,
//! engine, precision, parallelism, task: what a matrix exists to vary) but not across how
//! it was measured: runs differing from the first in any of `--compare A B`'s measurement
//! fields (profile, load and its parameters, timing, probes, SLO, gate thresholds) are
//! refused unless `--allow-different`, and the refusal names the run and the fields.
//!
//! The matrix opens with the verdict table ([`super::verdicts`]); a run that failed a gate
//! is FAILED in its column header, and the ranking (by effective goodput at each run's
//! operating point) holds only the runs that passed; the failed ones are listed apart
//! with the gates they failed.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::{
    compare::{CompareError, last_line, read},
    conditions::measurement_differences,
    report::{md::num, table::Table},
    verdicts::{self, RunVerdict},
};

/// One run's column.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    pub report: String,
    /// `model × hardware × software`.
    pub label: String,
    pub cards: Option<f64>,
    /// Effective goodput ÷ (cards × the per-card goodput of the smallest run of the same
    /// model, hardware and software).
    pub scaling_efficiency: Option<f64>,
    /// The run the efficiency is relative to.
    pub scaling_baseline: Option<String>,
    /// `contract.precision` (`-` when the contract names none).
    pub precision: String,
}

/// compare.json.
#[derive(Debug, Clone, Serialize)]
pub struct Matrix {
    pub columns: Vec<Column>,
    /// Row label → one value per column (`null` where the report has none).
    pub rows: Vec<(String, Vec<Option<f64>>)>,
    /// Key contract fields that differ from the first run (with --allow-different).
    pub differences: Vec<String>,
    /// Each run's verdict, in column order.
    pub verdicts: Vec<RunVerdict>,
    /// The runs that passed every gate, best first by effective goodput (a run without
    /// `passed`, from an older report, is not ranked).
    pub ranking: Vec<String>,
    /// The runs that failed a gate: never ranked.
    pub failed: Vec<String>,
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    at(v, path).and_then(Value::as_f64)
}

fn s(v: &Value, path: &[&str]) -> Option<String> {
    at(v, path).and_then(Value::as_str).map(str::to_owned)
}

/// The numbers of the matrix: label and path into report.json.
const ROWS: &[(&str, &[&str])] = &[
    (
        "effective goodput tok/s (operating point)",
        &["effective_goodput_tokens_per_s"],
    ),
    ("max stable concurrency", &["max_stable_concurrency"]),
    ("knee rate req/s", &["knee", "rate"]),
    ("attainment", &["overall", "attainment"]),
    ("error rate", &["overall", "error_rate"]),
    ("TTFT p50 ms", &["overall", "ttft_ms", "p50"]),
    ("TTFT p99 ms", &["overall", "ttft_ms", "p99"]),
    ("TPOT p99 ms", &["overall", "tpot_ms", "p99"]),
    ("ITL p99 ms", &["overall", "itl_ms", "p99"]),
    ("e2e p99 ms", &["overall", "e2e_ms", "p99"]),
    (
        "cost per million effective tokens",
        &["cost", "cost_per_million_effective_tokens"],
    ),
    ("cost per request", &["cost", "cost_per_request"]),
    // `--mode limits`: what each system takes.
    ("maximum input tokens", &["limits", "max_input_tokens"]),
    ("maximum output tokens", &["limits", "max_output_tokens"]),
    ("concurrency ceiling", &["limits", "ceiling_concurrency"]),
];

/// The software a run is on: engine, its version, framework version.
fn software(r: &Value) -> String {
    let parts: Vec<String> = [
        ["contract", "engine"],
        ["contract", "engine_version"],
        ["contract", "framework_version"],
    ]
    .iter()
    .filter_map(|p| s(r, p))
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

fn cards(r: &Value) -> Option<f64> {
    s(r, &["contract", "cards"])
        .and_then(|c| c.trim().parse::<f64>().ok())
        .filter(|c| c.is_finite() && *c > 0.0)
}

/// Builds the matrix of `reports` (already read), named by `names`.
pub fn build(names: &[String], reports: &[Value], differences: Vec<String>) -> Matrix {
    let group = |r: &Value| {
        (
            s(r, &["contract", "model"]),
            s(r, &["contract", "hardware"]),
            software(r),
        )
    };
    let goodput = |r: &Value| f(r, &["effective_goodput_tokens_per_s"]);
    let columns = reports
        .iter()
        .zip(names)
        .map(|(r, name)| {
            let n = cards(r);
            // The smallest run of the same group with cards and goodput.
            let base = reports
                .iter()
                .zip(names)
                .filter(|(o, _)| group(o) == group(r))
                .filter_map(|(o, on)| Some((cards(o)?, goodput(o)?, on)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let efficiency = match (n, goodput(r), base) {
                (Some(n), Some(g), Some((c0, g0, _))) if g0 > 0.0 => Some(g / (n * g0 / c0)),
                _ => None,
            };
            Column {
                report: name.clone(),
                label: format!(
                    "{} × {} × {}",
                    s(r, &["contract", "model"]).unwrap_or_else(|| "-".into()),
                    s(r, &["contract", "hardware"]).unwrap_or_else(|| "-".into()),
                    software(r)
                ),
                cards: n,
                scaling_efficiency: efficiency,
                scaling_baseline: efficiency.and(base.map(|b| b.2.clone())),
                precision: s(r, &["contract", "precision"]).unwrap_or_else(|| "-".into()),
            }
        })
        .collect();
    let rows = ROWS
        .iter()
        .map(|(label, path)| {
            (
                (*label).to_owned(),
                reports.iter().map(|r| f(r, path)).collect(),
            )
        })
        .collect();
    let verdicts: Vec<RunVerdict> = reports
        .iter()
        .zip(names)
        .map(|(r, n)| verdicts::of(n, r))
        .collect();
    let mut passed: Vec<(&String, Option<f64>)> = reports
        .iter()
        .zip(names)
        .zip(&verdicts)
        .filter(|(_, v)| v.passed == Some(true))
        .map(|((r, n), _)| (n, goodput(r)))
        .collect();
    // Best first; a run without a goodput figure last.
    passed.sort_by(|a, b| {
        b.1.unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&a.1.unwrap_or(f64::NEG_INFINITY))
    });
    Matrix {
        columns,
        rows,
        differences,
        ranking: passed.into_iter().map(|(n, _)| n.clone()).collect(),
        failed: verdicts
            .iter()
            .filter(|v| v.failed())
            .map(|v| v.run.clone())
            .collect(),
        verdicts,
    }
}

/// The ranking of the passed runs, and the failed ones apart.
fn ranking(m: &Matrix) -> Table {
    let mut t = Table::new(
        "Ranking of the runs that passed",
        &["rank", "run", "effective goodput tok/s"],
    );
    t.intro = Some(
        "Only runs that passed every gate are ranked, by effective goodput at their operating point.".into(),
    );
    let goodput = |run: &str| {
        let k = m.columns.iter().position(|c| c.report == run)?;
        m.rows
            .first()
            .and_then(|(_, v)| v.get(k).copied().flatten())
    };
    for (i, run) in m.ranking.iter().enumerate() {
        t.row([(i + 1).to_string(), run.clone(), num(goodput(run), 2)]);
    }
    t
}

fn failed_runs(m: &Matrix) -> Option<Table> {
    if m.failed.is_empty() {
        return None;
    }
    let mut t = Table::new("Runs that FAILED (not ranked)", &["run", "failed gates"]);
    for v in m.verdicts.iter().filter(|v| v.failed()) {
        t.row([v.run.clone(), v.failed_gates().join("; ")]);
    }
    Some(t)
}

fn table(m: &Matrix) -> Table {
    let labels: Vec<String> = m
        .columns
        .iter()
        .zip(&m.verdicts)
        .map(|(c, v)| verdicts::header(&c.label, v))
        .collect();
    let mut head: Vec<&str> = vec![""];
    head.extend(labels.iter().map(String::as_str));
    let mut t = Table::new("Runs side by side", &head);
    t.intro = Some(
        "Numbers over every measured request of each run; goodput and cost at each run's operating point. Scaling efficiency: effective goodput ÷ (cards × per-card goodput of the run with the fewest cards of the same model, hardware and software).".into(),
    );
    let mut report = vec!["report".to_owned()];
    report.extend(m.columns.iter().map(|c| c.report.clone()));
    t.row(report);
    let mut cards = vec!["cards".to_owned()];
    cards.extend(m.columns.iter().map(|c| num(c.cards, 0)));
    t.row(cards);
    let mut precision = vec!["precision".to_owned()];
    precision.extend(m.columns.iter().map(|c| c.precision.clone()));
    t.row(precision);
    for (label, values) in &m.rows {
        let mut row = vec![label.clone()];
        let d = if label.contains("cost") { 4 } else { 2 };
        row.extend(values.iter().map(|v| num(*v, d)));
        t.row(row);
    }
    let mut eff = vec!["scaling efficiency".to_owned()];
    eff.extend(m.columns.iter().map(|c| num(c.scaling_efficiency, 3)));
    t.row(eff);
    t
}

/// Reads `paths`, refuses differing runs unless `allow_different`, writes compare.md,
/// compare.html and compare.json into `out`; returns the markdown.
pub fn run(paths: &[PathBuf], out: &Path, allow_different: bool) -> Result<String, CompareError> {
    let reports = paths
        .iter()
        .map(|p| read(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut differences = Vec::new();
    if let Some(first) = reports.first() {
        for (r, p) in reports.iter().zip(paths).skip(1) {
            let d = measurement_differences(first, r);
            if !d.is_empty() {
                differences.push(format!("{}: {}", p.display(), d.join("; ")));
            }
        }
    }
    if !differences.is_empty() && !allow_different {
        return Err(CompareError::Different(differences.join(" | ")));
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let m = build(&names, &reports, differences);
    let t = table(&m);
    let names: Vec<String> = m.columns.iter().map(|c| c.report.clone()).collect();
    let verdict_table = verdicts::table(&names, &m.verdicts);
    let mut tables = vec![verdict_table, ranking(&m)];
    tables.extend(failed_runs(&m));
    tables.push(t);
    let mut md = String::from("# goodput replay: comparison matrix\n");
    if !m.differences.is_empty() {
        md.push_str(&format!(
            "\n**Key contract fields differ from the first run (compared with --allow-different): {}.**\n",
            m.differences.join(" | ")
        ));
    }
    for t in &tables {
        md.push_str(&t.md());
    }
    md.push_str(&last_line(&m.verdicts));
    let body: String = tables.iter().map(Table::html).collect();
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>goodput replay comparison</title><style>body{{font:14px sans-serif;margin:24px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}td.pass{{background:#e3f6e3}}td.fail{{background:#fbe3e3}}</style></head><body><h1>goodput replay: comparison matrix</h1>{body}</body></html>\n"
    );
    let json = serde_json::to_string_pretty(&m).map_err(|e| CompareError::Write {
        path: out.join("compare.json").display().to_string(),
        source: std::io::Error::other(e),
    })? + "\n";
    for (name, text) in [
        ("compare.md", &md),
        ("compare.html", &html),
        ("compare.json", &json),
    ] {
        std::fs::create_dir_all(out)
            .and_then(|()| std::fs::write(out.join(name), text))
            .map_err(|source| CompareError::Write {
                path: out.join(name).display().to_string(),
                source,
            })?;
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(hardware: &str, cards: Option<&str>, goodput: f64, ttft_p99: f64) -> Value {
        let mut c = serde_json::json!({"model": "m", "hardware": hardware, "engine": "vllm",
            "engine_version": "0.9"});
        if let Some(n) = cards {
            c["cards"] = n.into();
        }
        serde_json::json!({"contract": c, "steps": [], "effective_goodput_tokens_per_s": goodput,
            "overall": {"ttft_ms": {"p99": ttft_p99}, "attainment": 0.99}})
    }

    #[test]
    fn scaling_efficiency_is_against_the_fewest_cards_of_the_same_kind() {
        let reports = vec![
            report("H100", Some("1"), 1000.0, 300.0),
            report("H100", Some("4"), 3600.0, 320.0),
            report("H100", Some("8"), 6400.0, 350.0),
            report("A100", Some("2"), 900.0, 500.0),
            report("A100", None, 500.0, 400.0),
        ];
        let names: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
        let m = build(&names, &reports, Vec::new());
        let eff: Vec<Option<f64>> = m.columns.iter().map(|c| c.scaling_efficiency).collect();
        assert_eq!(eff[0], Some(1.0));
        assert_eq!(eff[1], Some(0.9));
        assert_eq!(eff[2], Some(0.8));
        // The only A100 run with cards is its own baseline; one without cards has none.
        assert_eq!(eff[3], Some(1.0));
        assert_eq!(eff[4], None);
        assert_eq!(m.columns[2].scaling_baseline.as_deref(), Some("r0"));
        assert_eq!(m.columns[1].label, "m × H100 × vllm 0.9");
        let p99 = m.rows.iter().find(|(l, _)| l == "TTFT p99 ms").unwrap();
        assert_eq!(p99.1[2], Some(350.0));
        let md = table(&m).md();
        assert!(
            md.contains("| scaling efficiency | 1.000 | 0.900 | 0.800 | 1.000 | - |"),
            "{md}"
        );
    }
}
