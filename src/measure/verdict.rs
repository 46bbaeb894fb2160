//! The SLO verdict of one finished request, per docs/DESIGN.md: it meets its class when its
//! outcome is `ok` and each target the class sets holds (a missing target, or a metric the
//! request has no value for, is not checked). Client aborts and client errors are excluded
//! from attainment.

use super::record::{Component, EngineSplit, SloSource};
use super::{Outcome, RequestRecord};
use crate::{
    decode::Api,
    slo::{HeaderObjectives, MatchInput, Slo, Targets},
};

/// Why a request missed its SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReason {
    Ttft,
    Tpot,
    E2e,
    Error,
}

impl MissReason {
    pub const ALL: [MissReason; 4] = [
        MissReason::Ttft,
        MissReason::Tpot,
        MissReason::E2e,
        MissReason::Error,
    ];

    /// The reason a record's `slo_miss_reason` names.
    pub fn parse(s: &str) -> Option<MissReason> {
        MissReason::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MissReason::Ttft => "ttft",
            MissReason::Tpot => "tpot",
            MissReason::E2e => "e2e",
            MissReason::Error => "error",
        }
    }
}

/// Why a request missed, as operators break misses down (`goodput_slo_misses_total`,
/// `miss_reasons`): the latency target it broke, or the failed outcome. Finer than the
/// record's `slo_miss_reason`, which says `error` for every failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissCause {
    Ttft,
    Tpot,
    E2e,
    Rejected,
    UpstreamError,
    UpstreamReset,
    Timeout,
    ProxyError,
}

impl MissCause {
    pub const ALL: [MissCause; 8] = [
        MissCause::Ttft,
        MissCause::Tpot,
        MissCause::E2e,
        MissCause::Rejected,
        MissCause::UpstreamError,
        MissCause::UpstreamReset,
        MissCause::Timeout,
        MissCause::ProxyError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MissCause::Ttft => "ttft",
            MissCause::Tpot => "tpot",
            MissCause::E2e => "e2e",
            MissCause::Rejected => "rejected",
            MissCause::UpstreamError => "upstream_error",
            MissCause::UpstreamReset => "upstream_reset",
            MissCause::Timeout => "timeout",
            MissCause::ProxyError => "proxy_error",
        }
    }

    /// The cause of a judged record's miss; `None` when it met its SLO or has no verdict.
    pub fn of(r: &RequestRecord) -> Option<MissCause> {
        if r.slo_met != Some(false) {
            return None;
        }
        Some(match (r.slo_miss_reason, r.outcome) {
            (Some("ttft"), _) => MissCause::Ttft,
            (Some("tpot"), _) => MissCause::Tpot,
            (Some("e2e"), _) => MissCause::E2e,
            (_, Outcome::Rejected) => MissCause::Rejected,
            (_, Outcome::UpstreamReset) => MissCause::UpstreamReset,
            (_, Outcome::Timeout) => MissCause::Timeout,
            (_, Outcome::ProxyError) => MissCause::ProxyError,
            _ => MissCause::UpstreamError,
        })
    }
}

/// `Some(met)`, or `None` when the request does not count (client abort, client error);
/// with the reason
/// when missed.
pub fn verdict(r: &RequestRecord, targets: &Targets) -> (Option<bool>, Option<MissReason>) {
    match r.outcome {
        Outcome::ClientAbort | Outcome::ClientError => return (None, None),
        Outcome::Ok => {}
        _ => return (Some(false), Some(MissReason::Error)),
    }
    let over = |value: Option<f64>, target: Option<f64>| match (value, target) {
        (Some(v), Some(t)) => v > t,
        _ => false,
    };
    // Latencies from the end of the request body: the client's upload is not the
    // upstream's time (docs/DESIGN.md "Latencies").
    if over(r.ttft_after_upload_ms, targets.ttft_ms) {
        return (Some(false), Some(MissReason::Ttft));
    }
    if over(r.tpot_ms, targets.tpot_ms) {
        return (Some(false), Some(MissReason::Tpot));
    }
    if over(Some(r.e2e_after_upload_ms), targets.e2e_ms) {
        return (Some(false), Some(MissReason::E2e));
    }
    (Some(true), None)
}

/// Applies `[slo] client_error_statuses` to an outcome that came from an upstream 4xx
/// status ([`Outcome::from_status`] used the default list): a listed status is the
/// request's own fault, an unlisted one an upstream error. 429 stays a rejection.
fn reclassify_status(r: &mut RequestRecord, client_statuses: &[u16]) {
    let Some(status) = r.status.filter(|s| (400..=499).contains(s) && *s != 429) else {
        return;
    };
    let listed = client_statuses.contains(&status);
    match r.outcome {
        Outcome::UpstreamError if listed => r.outcome = Outcome::ClientError,
        // Only a default-listed status became `client_error` from the upstream's status;
        // other client errors are the proxy's own verdict and stay.
        Outcome::ClientError
            if !listed
                && crate::measure::record::DEFAULT_CLIENT_ERROR_STATUSES.contains(&status) =>
        {
            r.outcome = Outcome::UpstreamError;
        }
        _ => {}
    }
}

/// The targets a request is held to: its class's, with the per-request objective headers
/// applied as `mode` says; and whether a header set or changed one.
pub fn targets_for(
    class: &Targets,
    headers: Targets,
    mode: HeaderObjectives,
) -> (Targets, SloSource) {
    let pick = |class: Option<f64>, header: Option<f64>| match (mode, class, header) {
        (HeaderObjectives::Off, c, _) | (_, c, None) => c,
        (HeaderObjectives::Override, _, h) => h,
        // Tighten: the stricter of the two; a header may set a target the class leaves open.
        (HeaderObjectives::Tighten, Some(c), Some(h)) => Some(c.min(h)),
        (HeaderObjectives::Tighten, None, h) => h,
    };
    let targets = Targets {
        ttft_ms: pick(class.ttft_ms, headers.ttft_ms),
        tpot_ms: pick(class.tpot_ms, headers.tpot_ms),
        e2e_ms: pick(class.e2e_ms, headers.e2e_ms),
    };
    let source = if targets == *class {
        SloSource::Class
    } else {
        SloSource::Header
    };
    (targets, source)
}

/// Where the time of a latency miss went, by the engine's own timings: the largest of the
/// parts the broken target covers (TTFT: queue, prefill, outside the engine; TPOT: decode;
/// e2e: every part, with inference standing for prefill and decode where the engine does
/// not split them). `None` for error misses and without engine timings.
pub fn component_of(reason: MissReason, split: &EngineSplit) -> Option<Component> {
    use Component::*;
    if !split.is_known() {
        return None;
    }
    let split_known = split.engine_prefill_ms.is_some() || split.engine_decode_ms.is_some();
    let candidates: &[Component] = match reason {
        MissReason::Ttft => &[Queue, Prefill, OutsideEngine],
        MissReason::Tpot => &[Decode],
        MissReason::E2e if split_known => &[Queue, Prefill, Decode, OutsideEngine],
        MissReason::E2e => &[Queue, Inference, OutsideEngine],
        MissReason::Error => return None,
    };
    split.largest(candidates)
}

/// Assigns the record its class and verdict. Per-request override headers (when enabled)
/// replace the class's targets one by one. Returns `false` for a request that belongs to no
/// class (traffic that is no generation and no class opted in to): it passes through with
/// an empty class and no verdict, and stays out of every SLO view.
pub fn judge(r: &mut RequestRecord, slo: &Slo) -> bool {
    reclassify_status(r, &slo.client_error_statuses);
    let Some(class) = slo.class_for(&MatchInput {
        model: r.model.as_deref(),
        api: Api::from_label(r.api),
        tenant: r.tenant,
        input_tokens: r.input_tokens,
    }) else {
        r.slo_class = "".into();
        r.slo_met = None;
        r.slo_miss_reason = None;
        r.slo_miss_component = None;
        r.slo_source = None;
        return false;
    };
    let (targets, source) = targets_for(&class.targets, r.slo_overrides, slo.header_objectives);
    let (met, reason) = verdict(r, &targets);
    r.slo_class = class.name.clone();
    r.slo_met = met;
    r.slo_source = Some(source);
    r.slo_miss_component = reason.and_then(|m| component_of(m, &r.engine));
    r.slo_miss_reason = reason.map(MissReason::as_str);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(outcome: Outcome, ttft: Option<f64>, tpot: Option<f64>, e2e: f64) -> RequestRecord {
        RequestRecord {
            model: Some("m".into()),
            outcome,
            ttft_ms: ttft,
            tpot_ms: tpot,
            e2e_ms: e2e,
            upload_ms: None,
            ttft_after_upload_ms: ttft,
            e2e_after_upload_ms: e2e,
            input_tokens: None,
            output_tokens: Some(10),
            events: 10,
            slo_class: "".into(),
            slo_met: None,
            tenant: None,
            ..crate::measure::record::example::record()
        }
    }

    const T: Targets = Targets {
        ttft_ms: Some(100.0),
        tpot_ms: Some(20.0),
        e2e_ms: Some(1000.0),
    };

    #[test]
    fn each_target_is_checked_in_order() {
        assert_eq!(
            verdict(&record(Outcome::Ok, Some(99.0), Some(19.0), 900.0), &T),
            (Some(true), None)
        );
        assert_eq!(
            verdict(&record(Outcome::Ok, Some(101.0), Some(30.0), 900.0), &T).1,
            Some(MissReason::Ttft)
        );
        assert_eq!(
            verdict(&record(Outcome::Ok, Some(1.0), Some(30.0), 900.0), &T).1,
            Some(MissReason::Tpot)
        );
        assert_eq!(
            verdict(&record(Outcome::Ok, Some(1.0), Some(1.0), 1001.0), &T).1,
            Some(MissReason::E2e)
        );
    }

    #[test]
    fn missing_values_and_targets_are_not_checked() {
        let non_stream = record(Outcome::Ok, None, None, 500.0);
        assert_eq!(verdict(&non_stream, &T), (Some(true), None));
        assert_eq!(
            verdict(
                &record(Outcome::Ok, Some(1e9), None, 1.0),
                &Targets::default()
            )
            .0,
            Some(true)
        );
    }

    #[test]
    fn failures_miss_and_aborts_do_not_count() {
        assert_eq!(
            verdict(&record(Outcome::UpstreamReset, Some(1.0), None, 1.0), &T),
            (Some(false), Some(MissReason::Error))
        );
        assert_eq!(
            verdict(&record(Outcome::ClientAbort, Some(1.0), None, 1.0), &T),
            (None, None)
        );
    }

    /// The SLO section of a config that names only an upstream.
    fn default_slo() -> crate::slo::Slo {
        crate::config::load(
            None,
            &crate::config::Overrides {
                upstream: Some("http://a".into()),
                ..Default::default()
            },
        )
        .unwrap()
        .slo
    }

    #[test]
    fn configured_client_statuses_decide_client_errors() {
        let mut slo = default_slo();
        let at = |status: u16| {
            let mut r = record(Outcome::from_status(status), None, None, 1.0);
            r.status = Some(status);
            r
        };
        let mut r = at(401);
        judge(&mut r, &slo);
        assert_eq!((r.outcome, r.slo_met), (Outcome::ClientError, None));
        let mut r = at(429);
        judge(&mut r, &slo);
        assert_eq!((r.outcome, r.slo_met), (Outcome::Rejected, Some(false)));
        slo.client_error_statuses = vec![409];
        let mut r = at(409);
        judge(&mut r, &slo);
        assert_eq!((r.outcome, r.slo_met), (Outcome::ClientError, None));
        let mut r = at(401);
        judge(&mut r, &slo);
        assert_eq!(
            (r.outcome, r.slo_met),
            (Outcome::UpstreamError, Some(false))
        );
        // The proxy's own client errors are not the upstream's status.
        let mut r = at(408);
        r.outcome = Outcome::ClientError;
        judge(&mut r, &slo);
        assert_eq!(r.outcome, Outcome::ClientError);
    }

    #[test]
    fn miss_causes_name_the_target_or_the_failure() {
        let judged = |outcome, ttft: f64| {
            let mut r = record(outcome, Some(ttft), None, 1.0);
            let (met, reason) = verdict(&r, &T);
            r.slo_met = met;
            r.slo_miss_reason = reason.map(MissReason::as_str);
            MissCause::of(&r)
        };
        assert_eq!(judged(Outcome::Ok, 1.0), None);
        assert_eq!(judged(Outcome::Ok, 500.0), Some(MissCause::Ttft));
        assert_eq!(judged(Outcome::Rejected, 1.0), Some(MissCause::Rejected));
        assert_eq!(judged(Outcome::Timeout, 1.0), Some(MissCause::Timeout));
        assert_eq!(judged(Outcome::ClientError, 1.0), None);
        let labels: std::collections::HashSet<&str> =
            MissCause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(labels.len(), MissCause::ALL.len());
    }

    #[test]
    fn overrides_replace_class_targets() {
        let mut slo = default_slo();
        slo.header_objectives = HeaderObjectives::Override;
        let mut r = record(Outcome::Ok, Some(150.0), None, 10.0);
        judge(&mut r, &slo);
        assert_eq!((&*r.slo_class, r.slo_met), ("default", Some(true)));
        r.slo_overrides.ttft_ms = Some(100.0);
        judge(&mut r, &slo);
        assert_eq!((r.slo_met, r.slo_miss_reason), (Some(false), Some("ttft")));
        assert_eq!(r.slo_source, Some(SloSource::Header));
        // Off: a header never counts, whatever the record carries.
        slo.header_objectives = HeaderObjectives::Off;
        judge(&mut r, &slo);
        assert_eq!(
            (r.slo_met, r.slo_source),
            (Some(true), Some(SloSource::Class))
        );
        r.api = "unknown";
        assert!(!judge(&mut r, &slo));
        assert_eq!((&*r.slo_class, r.slo_met), ("", None));
    }

    #[test]
    fn tighten_takes_the_stricter_and_override_the_header() {
        let class = Targets {
            ttft_ms: Some(1000.0),
            tpot_ms: None,
            e2e_ms: Some(5000.0),
        };
        let header = Targets {
            ttft_ms: Some(5000.0),
            tpot_ms: Some(20.0),
            e2e_ms: Some(100.0),
        };
        use HeaderObjectives::*;
        let (t, src) = targets_for(&class, header, Tighten);
        assert_eq!(
            (t.ttft_ms, t.tpot_ms, t.e2e_ms, src),
            (Some(1000.0), Some(20.0), Some(100.0), SloSource::Header)
        );
        let looser = Targets {
            ttft_ms: Some(5000.0),
            ..Targets::default()
        };
        assert_eq!(
            targets_for(&class, looser, Tighten),
            (class, SloSource::Class)
        );
        let (t, src) = targets_for(&class, looser, Override);
        assert_eq!((t.ttft_ms, src), (Some(5000.0), SloSource::Header));
        assert_eq!(targets_for(&class, header, Off), (class, SloSource::Class));
    }

    #[test]
    fn a_miss_goes_to_the_largest_part_its_target_covers() {
        use crate::decode::EngineTiming;
        use crate::measure::record::EngineTimingSource;
        let timing = EngineTiming {
            queue_us: Some(40_000),
            prefill_us: Some(75_000),
            decode_us: Some(900_000),
            inference_us: Some(975_000),
        };
        let split = EngineSplit::new(
            Some(timing),
            EngineTimingSource::Response,
            Some(300.0),
            1400.0,
        );
        assert_eq!(split.outside_engine_ms, Some(185.0));
        assert_eq!(
            component_of(MissReason::Ttft, &split),
            Some(Component::OutsideEngine)
        );
        assert_eq!(
            component_of(MissReason::Tpot, &split),
            Some(Component::Decode)
        );
        assert_eq!(
            component_of(MissReason::E2e, &split),
            Some(Component::Decode)
        );
        assert_eq!(component_of(MissReason::Error, &split), None);
        assert_eq!(
            component_of(MissReason::Ttft, &EngineSplit::default()),
            None
        );
        // TGI: queue and inference only; e2e misses weigh inference.
        let tgi = EngineTiming {
            queue_us: Some(500_000),
            inference_us: Some(200_000),
            ..EngineTiming::default()
        };
        let split = EngineSplit::new(Some(tgi), EngineTimingSource::Headers, None, 800.0);
        assert_eq!(split.outside_engine_ms, Some(100.0));
        assert_eq!(
            component_of(MissReason::E2e, &split),
            Some(Component::Queue)
        );
    }
}
