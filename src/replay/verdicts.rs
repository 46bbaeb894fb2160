//! The verdict table every comparison opens with: each run's `passed`, every gate as
//! pass, fail, unjudged or not requested (with actual, target and reason) and the probe
//! pass rate, read from each report.json as plain JSON.
//!
//! A comparison is what a team signs, so a run that failed a gate must read as failed
//! before any number is put beside its rival's: its column header says FAILED
//! ([`header`]) and the comparisons never call it better ([`failed`] tells them which
//! runs to keep out of any ranking). Reports from before `gates` existed show no gate
//! and `passed` as unknown.

use serde::Serialize;
use serde_json::Value;

use super::report::{
    md::num,
    table::{Cell, Table},
};

/// One gate of one run, as a comparison shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GateVerdict {
    pub gate: String,
    /// `pass`, `fail`, `unjudged` or `not requested`.
    pub state: &'static str,
    pub judged: bool,
    pub actual: Option<f64>,
    pub target: Option<f64>,
    pub reason: Option<String>,
    /// The run was told to accept this gate unjudged (`--allow-unjudged`).
    pub allowed_unjudged: bool,
}

/// One run's verdict (comparison JSON `verdicts[]`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunVerdict {
    pub run: String,
    /// `None`: the report predates `passed`.
    pub passed: Option<bool>,
    pub probe_pass_rate: Option<f64>,
    pub gates: Vec<GateVerdict>,
}

impl RunVerdict {
    /// The run failed (a report without `passed` is not called failed).
    pub fn failed(&self) -> bool {
        self.passed == Some(false)
    }

    /// `gate (reason)` of each gate that kept the run from passing.
    pub fn failed_gates(&self) -> Vec<String> {
        self.gates
            .iter()
            .filter(|g| g.state == "fail" || (g.state == "unjudged" && !g.allowed_unjudged))
            .map(|g| match &g.reason {
                Some(r) => format!("{} ({r})", g.gate),
                None => g.gate.clone(),
            })
            .collect()
    }
}

/// A gate's state from its report.json object: `state` when the report has it, else from
/// `judged` and `pass` (an unjudged gate that passed was one the run did not ask for).
fn state_of(g: &Value) -> &'static str {
    match g.get("state").and_then(Value::as_str) {
        Some("pass") => return "pass",
        Some("fail") => return "fail",
        Some("unjudged") => return "unjudged",
        Some("not requested") => return "not requested",
        _ => {}
    }
    let judged = g.get("judged").and_then(Value::as_bool).unwrap_or(true);
    let pass = g.get("pass").and_then(Value::as_bool).unwrap_or(false);
    match (judged, pass) {
        (true, true) => "pass",
        (true, false) => "fail",
        (false, true) => "not requested",
        (false, false) => "unjudged",
    }
}

/// The gates in the order report.json defines them (JSON objects read back sorted).
const ORDER: [&str; 5] = ["slo", "quality", "recovery", "abnormal_input", "resources"];

/// The verdict of the report `r`, named `run`.
pub fn of(run: &str, r: &Value) -> RunVerdict {
    let mut gates: Vec<GateVerdict> = r
        .get("gates")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(_, g)| g.is_object())
        .map(|(name, g)| GateVerdict {
            gate: name.clone(),
            state: state_of(g),
            judged: g.get("judged").and_then(Value::as_bool).unwrap_or(true),
            actual: g.get("actual").and_then(Value::as_f64),
            target: g.get("target").and_then(Value::as_f64),
            reason: g.get("reason").and_then(Value::as_str).map(str::to_owned),
            allowed_unjudged: g
                .get("allowed_unjudged")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
        .collect();
    let rank = |g: &GateVerdict| {
        ORDER
            .iter()
            .position(|n| *n == g.gate)
            .unwrap_or(ORDER.len())
    };
    gates.sort_by_key(rank);
    RunVerdict {
        run: run.to_owned(),
        passed: r.get("passed").and_then(Value::as_bool),
        probe_pass_rate: r
            .get("quality")
            .and_then(|q| q.get("pass_rate"))
            .and_then(Value::as_f64),
        gates,
    }
}

/// A run's column header: its name, and FAILED when a gate failed.
pub fn header(name: &str, v: &RunVerdict) -> String {
    if v.failed() {
        format!("{name} — FAILED")
    } else {
        name.to_owned()
    }
}

/// The gates shown: every gate any run has, in the order of the first run naming it.
fn gate_names(runs: &[RunVerdict]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for g in runs.iter().flat_map(|r| &r.gates) {
        if !names.contains(&g.gate) {
            names.push(g.gate.clone());
        }
    }
    names
}

fn cell(g: Option<&GateVerdict>) -> Cell {
    let Some(g) = g else {
        return Cell::from("-".to_owned());
    };
    let mut text = g.state.to_owned();
    if g.state == "unjudged" && g.allowed_unjudged {
        text.push_str(" (allowed)");
    }
    if g.actual.is_some() || g.target.is_some() {
        text.push_str(&format!(
            ": actual {}, target {}",
            num(g.actual, 3),
            num(g.target, 3)
        ));
    }
    if let Some(r) = g.reason.as_deref().filter(|_| g.state != "pass") {
        text.push_str(&format!(" — {r}"));
    }
    let verdict = match g.state {
        "pass" => Some("pass"),
        "fail" => Some("fail"),
        "unjudged" if !g.allowed_unjudged => Some("fail"),
        _ => None,
    };
    Cell { text, verdict }
}

/// The verdict table: one column per run (headed by `names`), a row for `passed`, the
/// probe pass rate and each gate.
pub fn table(names: &[String], runs: &[RunVerdict]) -> Table {
    let mut head: Vec<String> = vec![String::new()];
    head.extend(names.iter().zip(runs).map(|(n, v)| header(n, v)));
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let mut t = Table::new("Verdicts", &head);
    t.intro = Some(
        "Each run's own gates, as its report judged them. A run that failed a gate is marked FAILED and is never ranked or called better."
            .into(),
    );
    let mut passed = vec![Cell::from("passed".to_owned())];
    passed.extend(runs.iter().map(|v| match v.passed {
        Some(true) => Cell {
            text: "yes".into(),
            verdict: Some("pass"),
        },
        Some(false) => Cell {
            text: "NO".into(),
            verdict: Some("fail"),
        },
        None => Cell::from("- (report without gates)".to_owned()),
    }));
    t.rows.push(passed);
    let mut rate = vec!["probe pass rate".to_owned()];
    rate.extend(runs.iter().map(|v| {
        v.probe_pass_rate
            .map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0))
    }));
    t.row(rate);
    for name in gate_names(runs) {
        let mut row = vec![Cell::from(format!("gate {name}"))];
        row.extend(
            runs.iter()
                .map(|v| cell(v.gates.iter().find(|g| g.gate == name))),
        );
        t.rows.push(row);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(passed: bool) -> Value {
        serde_json::json!({
            "passed": passed,
            "quality": {"pass_rate": if passed { 1.0 } else { 0.25 }},
            "gates": {
                "slo": {"pass": true, "judged": true, "target": 0.9, "actual": 0.95, "reason": null},
                "quality": {"pass": passed, "judged": true, "target": 1.0,
                    "actual": if passed { 1.0 } else { 0.25 },
                    "reason": if passed { Value::Null } else { "1 of 4 probes passed".into() }},
                "recovery": {"pass": true, "judged": false, "reason": "not judged: no --fault-cmd"},
                "resources": {"pass": false, "judged": false, "state": "unjudged",
                    "allowed_unjudged": true, "reason": "gpu exporter unreachable"}
            }
        })
    }

    #[test]
    fn a_failed_run_reads_failed_in_its_header_and_every_gate_shows_its_state() {
        let runs = [of("A", &report(true)), of("B", &report(false))];
        assert_eq!(runs[1].failed_gates(), ["quality (1 of 4 probes passed)"]);
        let states: Vec<&str> = runs[0].gates.iter().map(|g| g.state).collect();
        assert_eq!(
            states,
            ["slo", "quality", "recovery", "resources"].map(|g| {
                match g {
                    "recovery" => "not requested",
                    "resources" => "unjudged",
                    _ => "pass",
                }
            })
        );
        let md = table(&["A".into(), "B".into()], &runs).md();
        assert!(md.contains("|  | A | B — FAILED |"), "{md}");
        assert!(md.contains("| passed | **yes** | **NO** |"), "{md}");
        assert!(md.contains("| probe pass rate | 100.0% | 25.0% |"), "{md}");
        assert!(
            md.contains("**fail: actual 0.250, target 1.000 — 1 of 4 probes passed**"),
            "{md}"
        );
        assert!(
            md.contains("unjudged (allowed) — gpu exporter unreachable"),
            "{md}"
        );
    }

    #[test]
    fn a_report_without_gates_is_not_called_failed() {
        let v = of("old", &serde_json::json!({"contract": {}, "steps": []}));
        assert_eq!(v.passed, None);
        assert!(!v.failed());
        assert_eq!(header("old", &v), "old");
    }
}
