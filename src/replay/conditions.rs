//! Like with like: the report.json fields two runs must share for their numbers to
//! compare, read as plain JSON. [`MEASUREMENT_FIELDS`] say how a run was measured (both
//! `--compare A B` and the matrix refuse a difference); [`SYSTEM_FIELDS`] what the system
//! is besides hardware and engine (only `--compare A B` refuses them: a matrix exists to
//! vary the system). Each difference is named with both values in full.

use serde_json::Value;

/// How a run was measured; runs that differ in any of these do not compare: the same
/// traffic (profile), load pattern and its parameters (concurrency list, ramp, rate scale,
/// soak rate and how it was found, burst, injection, fault command and time), its timing
/// (warm-up, step and soak durations, repeats), request shape (`ignore_eos`, prompt
/// sizing), probes (file digest, share), the capacity asked for, the SLO and every gate
/// threshold.
pub const MEASUREMENT_FIELDS: [&[&str]; 33] = [
    &["contract", "profile", "hash"],
    &["contract", "load", "mode"],
    &["contract", "load", "concurrency"],
    &["contract", "load", "ramp"],
    &["contract", "load", "rate_scale"],
    &["contract", "load", "soak_rate_source"],
    &["contract", "load", "soak_rate"],
    &["contract", "load", "soak_duration_s"],
    &["contract", "load", "warmup_s"],
    &["contract", "load", "step_duration_s"],
    &["contract", "load", "repeat"],
    &["contract", "load", "ignore_eos"],
    &["contract", "load", "prompt_lengths"],
    &["contract", "load", "burst"],
    &["contract", "load", "inject"],
    &["contract", "load", "context_tokens"],
    &["contract", "load", "fault_cmd"],
    &["contract", "load", "fault_at_s"],
    &["contract", "load", "probe_share"],
    &["reproducibility", "probes_sha256"],
    &["contract", "load", "required_concurrency"],
    &["contract", "load", "required_rate"],
    &["contract", "slo"],
    &["contract", "gates", "quality_min"],
    &["contract", "gates", "isolation_max_drop_points"],
    &["contract", "gates", "recovery_deadline_s"],
    &["contract", "gates", "soak_max_kv_growth"],
    &["contract", "gates", "soak_max_waiting_growth"],
    &["contract", "gates", "soak_max_jitter_growth"],
    &["contract", "gates", "max_throttle_share"],
    &["contract", "gates", "max_preemptions"],
    &["contract", "gates", "host_memory_min_share"],
    &["contract", "gates", "allow_unjudged"],
];

/// What the system under test is, besides hardware, engine and versions: `--compare A B`
/// refuses runs differing in these too, the matrix compares across them (as across
/// hardware, engine and parallelism: the things a matrix exists to vary).
pub const SYSTEM_FIELDS: [&[&str]; 4] = [
    &["contract", "task"],
    &["contract", "model"],
    &["contract", "model_revision"],
    &["contract", "precision"],
];

/// Fields that reports of earlier goodput versions do not have: a report without one says
/// nothing about it, which is not a difference.
const LATER_FIELDS: [&[&str]; 20] = [
    &["contract", "load", "ramp"],
    &["contract", "load", "soak_rate_source"],
    &["contract", "load", "repeat"],
    &["contract", "load", "burst"],
    &["contract", "load", "inject"],
    &["contract", "load", "context_tokens"],
    &["contract", "load", "fault_cmd"],
    &["contract", "load", "fault_at_s"],
    &["contract", "load", "probe_share"],
    &["reproducibility", "probes_sha256"],
    &["contract", "gates", "quality_min"],
    &["contract", "gates", "isolation_max_drop_points"],
    &["contract", "gates", "recovery_deadline_s"],
    &["contract", "gates", "soak_max_kv_growth"],
    &["contract", "gates", "soak_max_waiting_growth"],
    &["contract", "gates", "soak_max_jitter_growth"],
    &["contract", "gates", "max_throttle_share"],
    &["contract", "gates", "max_preemptions"],
    &["contract", "gates", "host_memory_min_share"],
    &["contract", "gates", "allow_unjudged"],
];

/// The fields of `fields` on which `a` and `b` differ, as `path (A vs B)` with both values
/// in full.
fn differences_in(fields: &[&[&str]], a: &Value, b: &Value) -> Vec<String> {
    let at = |v: &Value, path: &[&str]| {
        path.iter()
            .try_fold(v, |v, k| v.get(k))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let has = |v: &Value, path: &[&str]| path.iter().try_fold(v, |v, k| v.get(k)).is_some();
    // A soak's rate is a condition when it was asked for (`--soak-rate`); two soaks each
    // at 70% of its own knee were measured alike, their rates differ as their knees do.
    let source = |v: &Value| at(v, &["contract", "load", "soak_rate_source"]);
    let rates_asked = source(a) == "flag" && source(b) == "flag";
    fields
        .iter()
        .filter(|path| !LATER_FIELDS.contains(path) || (has(a, path) && has(b, path)))
        .filter(|path| rates_asked || !path.ends_with(&["soak_rate"]))
        .filter_map(|path| {
            let (x, y) = (at(a, path), at(b, path));
            // Full values: a threshold cut off mid-number cannot be checked.
            (x != y).then(|| format!("{} ({x} vs {y})", path[1..].join(".")))
        })
        .collect()
}

/// The fields on which `a` and `b` differ for `--compare A B`: how they were measured and
/// what the system is ([`MEASUREMENT_FIELDS`], [`SYSTEM_FIELDS`]).
pub fn key_differences(a: &Value, b: &Value) -> Vec<String> {
    let mut d = measurement_differences(a, b);
    d.extend(differences_in(&SYSTEM_FIELDS, a, b));
    d
}

/// The fields on which `a` and `b` differ in how they were measured (the matrix's check).
pub fn measurement_differences(a: &Value, b: &Value) -> Vec<String> {
    differences_in(&MEASUREMENT_FIELDS, a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_fields_name_what_differs() {
        let a = serde_json::json!({"contract": {"profile": {"hash": "h1"}, "load": {"mode": "steps"},
            "slo": [{"name": "x", "ttft_ms": 100}], "model": "m", "hardware": "A100"}});
        let mut b = a.clone();
        b["contract"]["hardware"] = "H100".into();
        b["contract"]["run_id"] = "r2".into();
        assert!(
            key_differences(&a, &b).is_empty(),
            "hardware is what is compared"
        );
        b["contract"]["slo"][0]["ttft_ms"] = 200.into();
        b["contract"]["profile"]["hash"] = "h2".into();
        let d = key_differences(&a, &b);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0], "profile.hash (\"h1\" vs \"h2\")");
        assert!(d[1].starts_with("slo ("), "{d:?}");
    }

    #[test]
    fn conditions_differ_but_older_reports_are_not_refused_for_newer_fields() {
        let a = serde_json::json!({"contract": {"load": {"mode": "steps", "warmup_s": 2.0,
            "step_duration_s": 10.0, "repeat": 3, "ignore_eos": true}, "gates": {"quality_min": 1.0}},
            "reproducibility": {"probes_sha256": "p1"}});
        let mut b = a.clone();
        b["contract"]["load"]["repeat"] = 1.into();
        b["contract"]["load"]["ignore_eos"] = false.into();
        b["contract"]["gates"]["quality_min"] = 0.9.into();
        b["reproducibility"]["probes_sha256"] = "p2".into();
        let d = key_differences(&a, &b);
        assert_eq!(
            d,
            [
                "load.repeat (3 vs 1)",
                "load.ignore_eos (true vs false)",
                "probes_sha256 (\"p1\" vs \"p2\")",
                "gates.quality_min (1.0 vs 0.9)"
            ]
        );
        // A report from before `repeat`, `gates` and `reproducibility` existed.
        let mut old = a.clone();
        old["contract"]["load"]
            .as_object_mut()
            .unwrap()
            .remove("repeat");
        old["contract"].as_object_mut().unwrap().remove("gates");
        old.as_object_mut().unwrap().remove("reproducibility");
        assert!(key_differences(&a, &old).is_empty());
        old["contract"]["load"]["warmup_s"] = 5.0.into();
        assert_eq!(key_differences(&a, &old), ["load.warmup_s (2.0 vs 5.0)"]);
    }

    #[test]
    fn how_the_load_was_made_is_a_condition_what_the_system_is_only_for_a_pair() {
        let a = serde_json::json!({"contract": {"model": "m", "precision": "fp8", "task": "chat",
            "load": {"mode": "soak", "soak_rate_source": "knee", "soak_rate": 12.5,
                "ramp": {"start": 1.0, "factor": 2.0, "steps": 8}, "burst": null,
                "inject": {}, "fault_cmd": null},
            "gates": {"max_throttle_share": 0.05, "allow_unjudged": []}}});
        let mut b = a.clone();
        // Each soak at 70% of its own knee: measured alike.
        b["contract"]["load"]["soak_rate"] = 30.0.into();
        b["contract"]["model"] = "m2".into();
        b["contract"]["precision"] = "bf16".into();
        b["contract"]["task"] = "code".into();
        assert!(measurement_differences(&a, &b).is_empty());
        assert_eq!(
            key_differences(&a, &b).len(),
            3,
            "a pair compares one system"
        );
        b["contract"]["load"]["burst"] = serde_json::json!({"rate": 4.0, "duration_s": 30.0});
        b["contract"]["load"]["inject"] = serde_json::json!({"empty": 0.01});
        b["contract"]["load"]["fault_cmd"] = "systemctl restart vllm".into();
        b["contract"]["gates"]["max_throttle_share"] = 0.1.into();
        b["contract"]["gates"]["allow_unjudged"] = serde_json::json!(["resources"]);
        assert_eq!(
            measurement_differences(&a, &b),
            [
                "load.burst (null vs {\"duration_s\":30.0,\"rate\":4.0})",
                "load.inject ({} vs {\"empty\":0.01})",
                "load.fault_cmd (null vs \"systemctl restart vllm\")",
                "gates.max_throttle_share (0.05 vs 0.1)",
                "gates.allow_unjudged ([] vs [\"resources\"])"
            ]
        );
        // Rates asked for are a condition.
        let mut a = a;
        a["contract"]["load"]["soak_rate_source"] = "flag".into();
        b["contract"]["load"]["soak_rate_source"] = "flag".into();
        assert!(measurement_differences(&a, &b).contains(&"load.soak_rate (12.5 vs 30.0)".into()));
    }

    #[test]
    fn a_long_difference_is_shown_whole() {
        let slo = |ms: u32| {
            serde_json::json!([{"name": "interactive-with-a-long-name", "ttft_ms": 100,
                "tpot_ms": 30, "e2e_ms": 9000, "attainment": 0.99, "percentiles": [
                {"metric": "ttft", "quantile": 0.95, "max_ms": ms}]}])
        };
        let a = serde_json::json!({"contract": {"slo": slo(250)}});
        let b = serde_json::json!({"contract": {"slo": slo(300)}});
        let d = key_differences(&a, &b);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].contains("\"max_ms\":250") && d[0].contains("\"max_ms\":300"),
            "{d:?}"
        );
        assert!(!d[0].contains('…'));
    }
}
