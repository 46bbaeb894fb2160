//! Unit tests of [`super`].

use super::*;

fn q(probes: u64, passed: u64) -> Quality {
    Quality {
        probes,
        passed,
        pass_rate: (probes > 0).then(|| passed as f64 / probes as f64),
        failures: Vec::new(),
        by_probe: Vec::new(),
    }
}

#[test]
fn quality_needs_its_minimum_on_every_repeat() {
    assert!(quality(None, None, 1.0).pass);
    assert!(!quality(None, None, 1.0).judged);
    let all = quality(Some(&q(10, 10)), None, 1.0);
    assert!(all.pass && all.judged);
    let bad = quality(Some(&q(20, 9)), None, 1.0);
    assert!(!bad.pass);
    assert_eq!(bad.actual, Some(0.45));
    assert!(bad.reason.unwrap().contains("9 of 20 probes passed"));
    assert!(quality(Some(&q(20, 19)), None, 0.9).pass);
    // No probe answered: nothing shows the answers are right.
    let none = quality(Some(&q(0, 0)), None, 0.5);
    assert!(!none.pass && none.state == State::Unjudged);
    assert_eq!(bad_brief(), "9/20 probes");
    let reps = [q(10, 10), q(10, 7), q(10, 10)];
    let g = quality(Some(&q(30, 27)), Some(&reps), 0.8);
    assert!(!g.pass, "{g:?}");
    let r = g.repeats.unwrap();
    assert_eq!(r.passed, [true, false, true]);
    assert_eq!(r.worst, Some(0.7));
    assert_eq!(r.ci.n, 3);
}

fn bad_brief() -> String {
    quality(Some(&q(20, 9)), None, 1.0).brief
}

fn verdict(class: &str, pass: bool, attainment: f64, target: f64) -> ClassResult {
    ClassResult {
        class: class.into(),
        pass,
        attainment: Some(attainment),
        attainment_target: target,
        reason: (!pass).then(|| "attainment low".to_owned()),
    }
}

#[test]
fn slo_names_the_tightest_class_and_fails_on_any_repeat() {
    let v = [
        verdict("a", true, 0.99, 0.9),
        verdict("b", true, 0.96, 0.95),
    ];
    let g = slo(&v, None);
    assert!(g.pass);
    assert_eq!((g.target, g.actual), (Some(0.95), Some(0.96)));
    let reps = vec![v.to_vec(), vec![verdict("a", false, 0.5, 0.9)]];
    let g = slo(&v, Some(&reps));
    assert!(!g.pass);
    assert!(g.reason.unwrap().contains("repeat #2 failed"));
    assert_eq!(g.repeats.unwrap().worst, Some(0.5));
    assert!(!slo(&[], None).pass);
}

fn limits() -> Thresholds {
    Thresholds {
        quality_min: 1.0,
        isolation_max_drop: 5.0,
        max_throttle_share: 0.05,
        max_preemptions: None,
        host_memory_min_share: 0.05,
        allow_unjudged: Vec::new(),
    }
}

fn scraped(attempts: u64, failed: u64) -> Option<ScrapeCount> {
    Some(ScrapeCount {
        attempts,
        failed,
        last_error: (failed > 0).then(|| "connection refused".to_owned()),
    })
}

#[test]
fn resources_fail_on_xid_and_drift() {
    let t = limits();
    let none = ResourceFigures::default();
    let g = resources(&none, &t, false);
    assert!(g.pass && !g.judged && g.state == State::NotRequested);
    let mut f = ResourceFigures {
        gpu_scrapes: scraped(10, 0),
        xid_before_run: Some(0),
        xid_during_run: Some(0),
        ..ResourceFigures::default()
    };
    assert!(resources(&f, &t, false).pass);
    f.xid_during_run = Some(2);
    let g = resources(&f, &t, false);
    assert!(!g.pass && g.state == State::Fail);
    assert_eq!(g.actual, Some(2.0));
    f.xid_during_run = None;
    f.xid_before_run = Some(1);
    let g = resources(&f, &t, false);
    assert!(
        !g.pass && g.reason.unwrap().contains("present before the run"),
        "an error latched before the run is a sick GPU"
    );
    let drift = ResourceFigures {
        soak_checked: true,
        drift: vec!["KV-cache usage grew".to_owned()],
        ..ResourceFigures::default()
    };
    assert!(!resources(&drift, &t, false).pass);
}

#[test]
fn resources_see_nothing_from_an_exporter_that_rarely_answers() {
    let t = limits();
    // 9 of 10 answered: enough.
    let f = ResourceFigures {
        gpu_scrapes: scraped(10, 1),
        xid_during_run: Some(0),
        ..ResourceFigures::default()
    };
    assert!(resources(&f, &t, false).pass);
    let f = ResourceFigures {
        gpu_scrapes: scraped(10, 10),
        ..ResourceFigures::default()
    };
    let g = resources(&f, &t, false);
    assert!(!g.pass && !g.judged && g.state == State::Unjudged, "{g:?}");
    assert_eq!(
        g.brief,
        "unjudged: gpu exporter unreachable: connection refused"
    );
    let f = ResourceFigures {
        gpu_scrapes: scraped(10, 2),
        ..ResourceFigures::default()
    };
    let g = resources(&f, &t, false);
    assert!(g.reason.unwrap().contains("answered 8 of 10 scrapes"));
    // Allowed unjudged: it passes, and says so.
    let mut gates = of_run(Figures {
        thresholds: &Thresholds {
            allow_unjudged: vec![GateName::Resources],
            ..limits()
        },
        classes: &[verdict("a", true, 0.99, 0.9)],
        classes_per_repeat: None,
        quality: None,
        quality_per_repeat: None,
        recovery: None,
        injected: &[],
        injection: None,
        injection_per_repeat: None,
        resources: f.clone(),
    });
    assert!(gates.pass() && gates.resources.allowed_unjudged);
    assert_eq!(
        gates.verdict_line(),
        "PASSED (unjudged, allowed: resources)"
    );
    gates.resources.pass = false;
    assert!(
        gates
            .verdict_line()
            .starts_with("FAILED: resources (unjudged: gpu exporter answered 8 of 10")
    );
}

#[test]
fn resources_judge_throttling_preemptions_restarts_and_host_memory() {
    let t = limits();
    let base = ResourceFigures {
        gpu_scrapes: scraped(10, 0),
        xid_during_run: Some(0),
        ..ResourceFigures::default()
    };
    let f = ResourceFigures {
        throttle_share: Some(0.2),
        ..base.clone()
    };
    let g = resources(&f, &t, false);
    assert!(g.reason.unwrap().contains("throttled in 20.0%"));
    let f = ResourceFigures {
        throttle_share: Some(0.05),
        ..base.clone()
    };
    assert!(resources(&f, &t, false).pass);
    let f = ResourceFigures {
        engine_read: true,
        preemptions: Some(3.0),
        ..base.clone()
    };
    assert!(
        resources(&f, &t, false).pass,
        "preemptions while the SLO holds"
    );
    assert!(!resources(&f, &t, true).pass, "preemptions while it fails");
    let strict = Thresholds {
        max_preemptions: Some(2.0),
        ..limits()
    };
    assert!(!resources(&f, &strict, false).pass);
    let f = ResourceFigures {
        engine_read: true,
        engine_restarts: Some(1),
        ..base.clone()
    };
    assert!(!resources(&f, &t, false).pass);
    let f = ResourceFigures {
        host_scrapes: scraped(10, 0),
        host_memory_available_min_share: Some(0.03),
        ..base.clone()
    };
    let g = resources(&f, &t, false);
    assert!(
        g.reason
            .unwrap()
            .contains("host memory available fell to 3.0%")
    );
    // An out-of-memory answer fails the gate even when nothing else was asked for.
    let oom = ResourceFigures {
        oom_answers: 2,
        ..ResourceFigures::default()
    };
    let g = resources(&oom, &t, false);
    assert_eq!(g.state, State::Fail);
    assert!(
        g.brief.contains("ran out of memory: 2 answers"),
        "{}",
        g.brief
    );
    // A node exporter that answered 8 of 10 scrapes, or never served memory: unjudged.
    let thin = ResourceFigures {
        host_scrapes: scraped(10, 2),
        host_memory_available_min_share: Some(0.5),
        ..base.clone()
    };
    let g = resources(&thin, &t, false);
    assert_eq!(g.state, State::Unjudged);
    assert!(
        g.brief.contains("node exporter answered 8 of 10 scrapes"),
        "{}",
        g.brief
    );
    let blind = ResourceFigures {
        host_scrapes: scraped(10, 0),
        ..base
    };
    let g = resources(&blind, &t, false);
    assert_eq!(g.state, State::Unjudged);
    assert!(
        g.brief.contains("no node_memory_MemAvailable_bytes"),
        "{}",
        g.brief
    );
}

fn injected(status: Option<u16>, outcome: Outcome) -> Sample {
    let mut record = crate::profile::line::tests::record();
    (record.status, record.outcome) = (status, outcome);
    let mut s = Sample::of(&record, &mut crate::replay::tables::Tables::default());
    s.inject = Some(Kind::Malformed);
    s
}

fn injection(beside: Option<f64>, alone: Option<f64>) -> Injection {
    let latency = |attainment| crate::replay::inject::Latency {
        attainment,
        ..Default::default()
    };
    Injection {
        shares: [("malformed", 0.1)].into_iter().collect(),
        context_tokens: None,
        kinds: Vec::new(),
        normal_beside_injected: latency(beside),
        normal_alone: latency(alone),
        burst: None,
    }
}

#[test]
fn abnormal_input_needs_an_answer_and_isolation() {
    let ok = [
        injected(Some(400), Outcome::ClientError),
        injected(Some(200), Outcome::Ok),
    ];
    let refs: Vec<&Sample> = ok.iter().collect();
    let g = abnormal_input(&refs, Some(&injection(Some(0.97), Some(0.99))), 5.0);
    assert!(g.pass, "{g:?}");
    assert_eq!(g.actual, Some(1.0));
    // A 5xx, a reset and a timeout are no answer to bad input.
    let bad = [
        injected(Some(400), Outcome::ClientError),
        injected(Some(500), Outcome::UpstreamError),
        injected(None, Outcome::UpstreamReset),
        injected(Some(200), Outcome::Timeout),
    ];
    let refs: Vec<&Sample> = bad.iter().collect();
    let g = abnormal_input(&refs, Some(&injection(None, None)), 5.0);
    assert!(!g.pass);
    assert_eq!(g.actual, Some(0.25));
    assert!(g.reason.unwrap().contains("3 of 4 injected"));
    // Normal requests lost 10 points of attainment beside injected ones.
    let refs: Vec<&Sample> = ok.iter().collect();
    let g = abnormal_input(&refs, Some(&injection(Some(0.85), Some(0.95))), 5.0);
    assert!(!g.pass);
    let drop = g.isolation.unwrap().drop_points.unwrap();
    assert!((drop - 10.0).abs() < 1e-9, "{drop}");
    assert!(!abnormal_input(&[], None, 5.0).judged);
}

#[test]
fn a_gate_judged_on_each_repeat_fails_on_one() {
    let pass = |actual| Gate {
        pass: true,
        judged: true,
        state: State::Pass,
        allowed_unjudged: false,
        brief: String::new(),
        measure: "share",
        target: Some(1.0),
        actual: Some(actual),
        reason: None,
        repeats: None,
        isolation: None,
        by_probe: None,
    };
    let fail = Gate {
        pass: false,
        ..pass(0.5)
    };
    let g = with_repeats(pass(0.9), &[pass(1.0), fail.clone(), pass(0.8)]);
    assert!(!g.pass);
    assert_eq!(g.reason.as_deref(), Some("repeat #2 failed"));
    let r = g.repeats.unwrap();
    assert_eq!(r.passed, [true, false, true]);
    assert_eq!(r.worst, Some(0.5));
    // One repeat, or an untested gate, is left as it is.
    assert!(with_repeats(pass(1.0), std::slice::from_ref(&fail)).pass);
    assert!(with_repeats(untested("share", "no --inject"), &[fail.clone(), fail]).pass);
}
