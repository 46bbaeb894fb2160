//! Quality against a reference: what `--compare A B` says of the probes, read from each
//! report.json as plain JSON (`gates.quality.by_probe`, else `quality` alone).
//!
//! Per probe, the runs' pass rates and the *flips*: a probe passed in a run when every
//! answer to it passed, so a flip is a probe that passed in A and failed in B
//! (`pass_to_fail`, a regression against the reference) or the reverse (`fail_to_pass`).
//! The pass-rate difference is B − A in percentage points, with a 95% interval for the
//! difference of two proportions (Newcombe's hybrid score interval, from each rate's
//! Wilson interval: it stays honest at 0% and 100%, where the textbook interval collapses
//! to a point). `--quality-max-drop POINTS` fails the comparison when B's pass rate is
//! more than POINTS below A's, or when either run has no probe answer to judge.

use serde::Serialize;
use serde_json::Value;

use super::report::{
    md::num,
    table::{Cell, Table},
};

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// One probe's answers in one run.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Count {
    probes: u64,
    passed: u64,
}

impl Count {
    fn rate(self) -> Option<f64> {
        (self.probes > 0).then(|| self.passed as f64 / self.probes as f64)
    }

    /// Passed: every answer passed.
    fn outcome(self) -> Option<&'static str> {
        (self.probes > 0).then_some(if self.passed == self.probes {
            "pass"
        } else {
            "fail"
        })
    }
}

/// A probe that passed in one run and failed in the other.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Flip {
    pub probe: String,
    /// `pass_to_fail` (passed in A, failed in B) or `fail_to_pass`.
    pub direction: &'static str,
    pub a_passed: u64,
    pub a_probes: u64,
    pub b_passed: u64,
    pub b_probes: u64,
}

/// One probe in both runs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeDiff {
    pub probe: String,
    pub a_passed: u64,
    pub a_probes: u64,
    pub b_passed: u64,
    pub b_probes: u64,
    /// B − A, percentage points.
    pub pass_rate_delta: Option<f64>,
    pub ci95: Option<[f64; 2]>,
}

/// compare.json `quality`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QualityDiff {
    pub flips: Vec<Flip>,
    /// B's probe pass rate − A's, percentage points.
    pub pass_rate_delta: Option<f64>,
    /// 95% interval of `pass_rate_delta`, percentage points.
    pub ci95: Option<[f64; 2]>,
    pub by_probe: Vec<ProbeDiff>,
    /// `--quality-max-drop`, points.
    pub max_drop: Option<f64>,
    /// Why the comparison failed on quality (`None`: it did not).
    pub failure: Option<String>,
}

/// Wilson score interval of `k` successes in `n`.
fn wilson(k: u64, n: u64) -> (f64, f64) {
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z95 / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// B − A and its 95% interval, in points; `None` when a run has no answer.
fn difference(a: Count, b: Count) -> Option<(f64, [f64; 2])> {
    let (pa, pb) = (a.rate()?, b.rate()?);
    let ((la, ua), (lb, ub)) = (wilson(a.passed, a.probes), wilson(b.passed, b.probes));
    let d = pb - pa;
    let low = d - ((pb - lb).powi(2) + (ua - pa).powi(2)).sqrt();
    let high = d + ((ub - pb).powi(2) + (pa - la).powi(2)).sqrt();
    Some((d * 100.0, [low * 100.0, high * 100.0]))
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The run's answers over every probe.
fn overall(r: &Value) -> Count {
    let q = r.get("quality").unwrap_or(&Value::Null);
    Count {
        probes: u(q, "probes"),
        passed: u(q, "passed"),
    }
}

/// Each probe's answers, in file order (empty for a report without them).
fn by_probe(r: &Value) -> Vec<(String, Count)> {
    r.get("gates")
        .and_then(|g| g.get("quality"))
        .and_then(|q| q.get("by_probe"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let name = t.get("name")?.as_str()?.to_owned();
            Some((
                name,
                Count {
                    probes: u(t, "probes"),
                    passed: u(t, "passed"),
                },
            ))
        })
        .collect()
}

/// What B's probes say against A's; `None` when neither run sent probes and no
/// `--quality-max-drop` asks for a judgement.
pub fn of(a: &Value, b: &Value, max_drop: Option<f64>) -> Option<QualityDiff> {
    let (ca, cb) = (overall(a), overall(b));
    if ca.probes == 0 && cb.probes == 0 && max_drop.is_none() {
        return None;
    }
    let (pa, pb) = (by_probe(a), by_probe(b));
    let mut names: Vec<&str> = pa.iter().map(|(n, _)| n.as_str()).collect();
    for (n, _) in &pb {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    let none = Count {
        probes: 0,
        passed: 0,
    };
    let find = |list: &[(String, Count)], name: &str| {
        list.iter()
            .find(|(n, _)| n == name)
            .map_or(none, |(_, c)| *c)
    };
    let mut flips = Vec::new();
    let mut rows = Vec::new();
    for name in names {
        let (x, y) = (find(&pa, name), find(&pb, name));
        let direction = match (x.outcome(), y.outcome()) {
            (Some("pass"), Some("fail")) => Some("pass_to_fail"),
            (Some("fail"), Some("pass")) => Some("fail_to_pass"),
            _ => None,
        };
        if let Some(direction) = direction {
            flips.push(Flip {
                probe: name.to_owned(),
                direction,
                a_passed: x.passed,
                a_probes: x.probes,
                b_passed: y.passed,
                b_probes: y.probes,
            });
        }
        let d = difference(x, y);
        rows.push(ProbeDiff {
            probe: name.to_owned(),
            a_passed: x.passed,
            a_probes: x.probes,
            b_passed: y.passed,
            b_probes: y.probes,
            pass_rate_delta: d.map(|d| d.0),
            ci95: d.map(|d| d.1),
        });
    }
    let d = difference(ca, cb);
    let failure = max_drop.and_then(|max| judge(ca, cb, d.map(|d| d.0), max, &flips));
    Some(QualityDiff {
        flips,
        pass_rate_delta: d.map(|d| d.0),
        ci95: d.map(|d| d.1),
        by_probe: rows,
        max_drop,
        failure,
    })
}

/// Why the comparison fails `--quality-max-drop max`, if it does.
fn judge(a: Count, b: Count, delta: Option<f64>, max: f64, flips: &[Flip]) -> Option<String> {
    let Some(delta) = delta else {
        let which: Vec<&str> = [("A", a), ("B", b)]
            .iter()
            .filter(|(_, c)| c.probes == 0)
            .map(|(n, _)| *n)
            .collect();
        return Some(format!(
            "quality unjudged: {} has no probe answer (--quality-max-drop needs --probes in both runs)",
            which.join(" and ")
        ));
    };
    if -delta <= max + 1e-9 {
        return None;
    }
    let lost: Vec<&str> = flips
        .iter()
        .filter(|f| f.direction == "pass_to_fail")
        .map(|f| f.probe.as_str())
        .collect();
    let named = if lost.is_empty() {
        "no probe flipped from pass to fail".to_owned()
    } else {
        format!("probes that flipped from pass to fail: {}", lost.join(", "))
    };
    Some(format!(
        "quality dropped {:.1} points ({} to {}), beyond --quality-max-drop {}; {named}",
        -delta,
        rate(a),
        rate(b),
        max
    ))
}

fn rate(c: Count) -> String {
    c.rate()
        .map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0))
}

fn points(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:+.1}"))
}

fn interval(v: Option<[f64; 2]>) -> String {
    v.map_or("-".to_owned(), |[l, h]| {
        format!("{} to {}", num(Some(l), 1), num(Some(h), 1))
    })
}

impl QualityDiff {
    /// The comparison's quality table: the run, then each probe, with flips marked.
    pub fn table(&self, names: [&str; 2], a: &Value, b: &Value) -> Table {
        let head = [
            "probe",
            names[0],
            names[1],
            "change (points)",
            "95% interval",
            "flip",
        ];
        let mut t = Table::new("Quality against A", &head);
        let mut intro = "Probe pass rates, B against A: a probe passed when every answer to it passed; a flip is a probe that passed in one run and failed in the other. The interval is for the difference of two proportions (Newcombe).".to_owned();
        if let Some(f) = &self.failure {
            intro.push_str(&format!(" Comparison FAILED: {f}."));
        } else if let Some(m) = self.max_drop {
            intro.push_str(&format!(" Within --quality-max-drop {m}."));
        }
        t.intro = Some(intro);
        let (ca, cb) = (overall(a), overall(b));
        let count = |c: Count| format!("{}/{} ({})", c.passed, c.probes, rate(c));
        t.rows.push(vec![
            Cell::from("all probes".to_owned()),
            Cell::from(count(ca)),
            Cell::from(count(cb)),
            Cell {
                text: points(self.pass_rate_delta),
                verdict: self.failure.is_some().then_some("fail"),
            },
            Cell::from(interval(self.ci95)),
            Cell::from(String::new()),
        ]);
        for p in &self.by_probe {
            let flip = self.flips.iter().find(|f| f.probe == p.probe);
            let c = |probes, passed| Count { probes, passed };
            t.rows.push(vec![
                Cell::from(p.probe.clone()),
                Cell::from(count(c(p.a_probes, p.a_passed))),
                Cell::from(count(c(p.b_probes, p.b_passed))),
                Cell::from(points(p.pass_rate_delta)),
                Cell::from(interval(p.ci95)),
                match flip.map(|f| f.direction) {
                    Some("pass_to_fail") => Cell {
                        text: "pass → FAIL".into(),
                        verdict: Some("fail"),
                    },
                    Some(_) => Cell {
                        text: "fail → pass".into(),
                        verdict: Some("pass"),
                    },
                    None => Cell::from(String::new()),
                },
            ]);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(probes: &[(&str, u64, u64)]) -> Value {
        let (n, k) = probes
            .iter()
            .fold((0, 0), |(n, k), (_, pn, pk)| (n + pn, k + pk));
        let by: Vec<Value> = probes
            .iter()
            .map(|(name, n, k)| serde_json::json!({"name": name, "probes": n, "passed": k}))
            .collect();
        serde_json::json!({"quality": {"probes": n, "passed": k},
            "gates": {"quality": {"by_probe": by}}})
    }

    #[test]
    fn flips_both_ways_and_the_drop_beyond_the_limit_names_them() {
        let a = report(&[("four", 10, 10), ("words", 10, 10), ("json", 10, 0)]);
        let b = report(&[("four", 10, 0), ("words", 10, 10), ("json", 10, 10)]);
        let q = of(&a, &b, Some(5.0)).unwrap();
        let flips: Vec<(&str, &str)> = q
            .flips
            .iter()
            .map(|f| (f.probe.as_str(), f.direction))
            .collect();
        assert_eq!(flips, [("four", "pass_to_fail"), ("json", "fail_to_pass")]);
        assert_eq!(q.pass_rate_delta, Some(0.0));
        assert_eq!(q.failure, None, "the same rate overall");
        let b = report(&[("four", 10, 0), ("words", 10, 10), ("json", 10, 0)]);
        let q = of(&a, &b, Some(5.0)).unwrap();
        let f = q.failure.unwrap();
        assert!(
            f.starts_with(
                "quality dropped 33.3 points (66.7% to 33.3%), beyond --quality-max-drop 5"
            ),
            "{f}"
        );
        assert!(
            f.ends_with("probes that flipped from pass to fail: four"),
            "{f}"
        );
        assert!(of(&a, &b, Some(40.0)).unwrap().failure.is_none());
        assert!(of(&a, &b, None).unwrap().failure.is_none());
    }

    #[test]
    fn the_interval_holds_at_the_extremes() {
        let a = report(&[("p", 20, 20)]);
        let b = report(&[("p", 20, 0)]);
        let q = of(&a, &b, None).unwrap();
        assert_eq!(q.pass_rate_delta, Some(-100.0));
        let [l, h] = q.ci95.unwrap();
        // Not collapsed to the point, as the textbook interval would be.
        assert!((l - -100.0).abs() < 1e-9, "{l}");
        assert!((h - -77.21).abs() < 0.01, "{h}");
        // Newcombe (1998), table II, example (a): 56/70 against 48/80.
        let q = of(&report(&[("p", 80, 48)]), &report(&[("p", 70, 56)]), None).unwrap();
        let [l, h] = q.ci95.unwrap();
        assert!((q.pass_rate_delta.unwrap() - 20.0).abs() < 1e-9);
        assert!(
            (l - 5.24).abs() < 0.01 && (h - 33.39).abs() < 0.01,
            "{l} {h}"
        );
    }

    #[test]
    fn no_probes_are_no_section_unless_a_drop_is_asked_for() {
        let empty = serde_json::json!({"contract": {}});
        assert_eq!(of(&empty, &empty, None), None);
        let q = of(&report(&[("p", 4, 4)]), &empty, Some(5.0)).unwrap();
        assert_eq!(
            q.failure.as_deref(),
            Some(
                "quality unjudged: B has no probe answer (--quality-max-drop needs --probes in both runs)"
            )
        );
    }
}
