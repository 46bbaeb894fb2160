//! Abnormal input and bursts (the fault-injection step of an acceptance): `--inject`
//! replaces a share of the requests with over-long (past `--context-tokens`), empty or
//! malformed ones; `--burst RATE:DURATION` adds an extra open-loop Poisson load in the
//! middle of each step's measuring window. The report tells how the target answered
//! each kind (status mix, time to answer) and how the normal requests fared beside them.
//!
//! Injected and burst requests are kept out of the steps' numbers (they are not the
//! profile's traffic at the step's load) and reported on their own. Which request is
//! injected is drawn from `--seed` and its sequence number, so a run repeats.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Serialize;

use super::{
    load::StepRun,
    plan::{ReplayApi, Template, mix},
    prompt::Prompts,
    tally::{Pcts, Sample},
};
use crate::measure::Outcome;

/// Over-long prompts are this many times `--context-tokens` (at ~4 bytes a token, so
/// still past the limit for tokenizers that count fewer tokens per byte).
pub const OVER_LONG_FACTOR: u64 = 3;

/// What an extra request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    OverLong,
    Empty,
    Malformed,
    Burst,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::OverLong => "over_long",
            Kind::Empty => "empty",
            Kind::Malformed => "malformed",
            Kind::Burst => "burst",
        }
    }

    /// The kinds `--inject` takes.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "over_long" => Some(Kind::OverLong),
            "empty" => Some(Kind::Empty),
            "malformed" => Some(Kind::Malformed),
            _ => None,
        }
    }
}

/// `--inject` parsed: kind and share.
pub fn parse_share(s: &str) -> Result<(Kind, f64), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KIND=SHARE (over_long, empty, malformed)"))?;
    let kind = Kind::parse(k.trim())
        .ok_or_else(|| format!("{k:?} is not over_long, empty or malformed"))?;
    match v.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x < 1.0 => Ok((kind, x)),
        _ => Err(format!("{v:?} is not a share between 0 and 1")),
    }
}

/// `--burst RATE:DURATION`.
pub fn parse_burst(s: &str) -> Result<(f64, std::time::Duration), String> {
    let (r, d) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not RATE:DURATION, e.g. 50:5s"))?;
    let rate = match r.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => x,
        _ => return Err(format!("{r:?} is not a positive rate")),
    };
    let d =
        humantime::parse_duration(d.trim()).map_err(|e| format!("{d:?} is not a duration: {e}"))?;
    if d.is_zero() {
        return Err("the burst's duration must be above 0".into());
    }
    Ok((rate, d))
}

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("--inject over_long needs --context-tokens (the target's context limit)")]
    NoContext,
    #[error("--inject shares add up to {0}, more than 1")]
    TooMuch(f64),
}

/// Picks and builds the injected requests.
#[derive(Debug)]
pub struct Injector {
    /// Kinds with cumulative shares, in order.
    cumulative: Vec<(Kind, f64)>,
    seed: u64,
    bodies: BTreeMap<Kind, Bytes>,
}

impl Injector {
    pub fn new(
        shares: &[(Kind, f64)],
        context_tokens: Option<u64>,
        model: Option<&str>,
        seed: u64,
        block_bytes: usize,
    ) -> Result<Injector, InjectError> {
        let total: f64 = shares.iter().map(|(_, s)| s).sum();
        if total > 1.0 {
            return Err(InjectError::TooMuch(total));
        }
        let mut bodies = BTreeMap::new();
        let mut cumulative = Vec::new();
        let mut acc = 0.0;
        let model_field = |m: &mut serde_json::Map<String, serde_json::Value>| {
            if let Some(model) = model {
                m.insert("model".into(), model.into());
            }
        };
        for &(kind, share) in shares {
            acc += share;
            cumulative.push((kind, acc));
            let body = match kind {
                Kind::OverLong => {
                    let ctx = context_tokens.ok_or(InjectError::NoContext)?;
                    let t = Template {
                        at_ms: 0.0,
                        api: ReplayApi::Chat,
                        model: model.map(str::to_owned),
                        stream: true,
                        input_tokens: ctx.saturating_mul(OVER_LONG_FACTOR),
                        output_tokens: 16,
                        blocks: Vec::new(),
                        tenant: None,
                    };
                    Prompts::new(seed, block_bytes, false, None).body(&t, 0)
                }
                Kind::Empty => {
                    let mut m = serde_json::Map::new();
                    model_field(&mut m);
                    m.insert("messages".into(), serde_json::json!([]));
                    m.insert("max_tokens".into(), 16.into());
                    serde_json::to_vec(&m).unwrap_or_default()
                }
                Kind::Malformed => {
                    // Cut off inside a string: not JSON at all.
                    let mut m = serde_json::Map::new();
                    model_field(&mut m);
                    m.insert(
                        "messages".into(),
                        serde_json::json!([{"role": "user", "content": "hello"}]),
                    );
                    let mut v = serde_json::to_vec(&m).unwrap_or_default();
                    v.truncate(v.len().saturating_sub(5));
                    v
                }
                Kind::Burst => continue,
            };
            bodies.insert(kind, Bytes::from(body));
        }
        Ok(Injector {
            cumulative,
            seed,
            bodies,
        })
    }

    /// The kind and body of the `seq`-th request if it is injected.
    pub fn pick(&self, seq: u64) -> Option<(Kind, Bytes)> {
        let u = (mix(self.seed ^ mix(seq ^ 0x1_4ec7)) >> 11) as f64 / (1u64 << 53) as f64;
        let kind = self.cumulative.iter().find(|(_, c)| u < *c)?.0;
        Some((kind, self.bodies.get(&kind)?.clone()))
    }
}

/// Normal requests' latency in one situation.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Latency {
    pub requests: usize,
    /// SLO met over met and missed (the `abnormal_input` gate's isolation).
    pub attainment: Option<f64>,
    pub ttft_ms: Pcts,
    pub e2e_ms: Pcts,
}

impl Latency {
    fn of(s: &[&Sample]) -> Latency {
        let met = s.iter().filter(|s| s.slo_met == Some(true)).count();
        let judged = s.iter().filter(|s| s.slo_met.is_some()).count();
        Latency {
            requests: s.len(),
            attainment: (judged > 0).then(|| met as f64 / judged as f64),
            ttft_ms: Pcts::of(s.iter().filter_map(|s| s.ttft_ms()).collect()),
            e2e_ms: Pcts::of(s.iter().map(|s| s.e2e_ms).collect()),
        }
    }
}

/// How the target answered one kind of extra request.
#[derive(Debug, Clone, Serialize)]
pub struct KindOut {
    pub kind: &'static str,
    pub requests: usize,
    /// HTTP status → requests (`none`: no response at all).
    pub statuses: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Time from sending to the end of the answer.
    pub answer_ms: Pcts,
}

#[derive(Debug, Clone, Serialize)]
pub struct BurstOut {
    pub rate: f64,
    pub duration_s: f64,
    /// Per step: start and end, seconds after the run started.
    pub windows: Vec<[f64; 2]>,
    pub normal_during: Latency,
    pub normal_outside: Latency,
}

/// `report.json` `injection`.
#[derive(Debug, Clone, Serialize)]
pub struct Injection {
    pub shares: BTreeMap<&'static str, f64>,
    pub context_tokens: Option<u64>,
    pub kinds: Vec<KindOut>,
    /// Measured normal requests with an injected request in flight while they ran...
    pub normal_beside_injected: Latency,
    /// ...and those without.
    pub normal_alone: Latency,
    pub burst: Option<BurstOut>,
}

/// Whether `[a, b]` overlaps one of `spans` (sorted by start; `max_end[i]` the largest
/// end among the first `i + 1`).
fn overlaps(spans: &[(f64, f64)], max_end: &[f64], a: f64, b: f64) -> bool {
    let n = spans.partition_point(|(s, _)| *s < b);
    n > 0 && max_end[n - 1] > a
}

/// The injection report of a run: `extra` are the injected and burst requests of the
/// reported steps, `normal` the steps' measured requests.
pub fn analyse(
    extra: &[&Sample],
    normal: &[&Sample],
    runs: &[StepRun],
    shares: &[(Kind, f64)],
    context_tokens: Option<u64>,
    burst: Option<(f64, std::time::Duration)>,
) -> Injection {
    let mut by_kind: BTreeMap<Kind, Vec<&Sample>> = BTreeMap::new();
    for s in extra.iter().filter(|s| s.outcome != Outcome::ClientAbort) {
        if let Some(k) = s.inject {
            by_kind.entry(k).or_default().push(s);
        }
    }
    let kinds = by_kind
        .iter()
        .map(|(k, v)| {
            let mut statuses = BTreeMap::new();
            let mut outcomes = BTreeMap::new();
            for s in v {
                let st = s.status.map_or("none".to_owned(), |c| c.to_string());
                *statuses.entry(st).or_insert(0) += 1;
                *outcomes.entry(s.outcome.as_str()).or_insert(0) += 1;
            }
            KindOut {
                kind: k.as_str(),
                requests: v.len(),
                statuses,
                outcomes,
                answer_ms: Pcts::of(v.iter().map(|s| s.e2e_ms).collect()),
            }
        })
        .collect();
    let mut spans: Vec<(f64, f64)> = extra
        .iter()
        .filter(|s| s.inject.is_some_and(|k| k != Kind::Burst))
        .map(|s| (s.sent_s, s.ended_s))
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let max_end: Vec<f64> = spans
        .iter()
        .scan(f64::NEG_INFINITY, |m, s| {
            *m = m.max(s.1);
            Some(*m)
        })
        .collect();
    let (beside, alone): (Vec<&Sample>, Vec<&Sample>) = normal
        .iter()
        .partition(|s| overlaps(&spans, &max_end, s.sent_s, s.ended_s));
    let burst = burst.map(|(rate, d)| {
        let windows: Vec<[f64; 2]> = runs
            .iter()
            .filter_map(|r| r.burst)
            .map(|(a, b)| [a, b])
            .collect();
        let (during, outside): (Vec<&Sample>, Vec<&Sample>) = normal
            .iter()
            .partition(|s| windows.iter().any(|w| s.sent_s >= w[0] && s.sent_s < w[1]));
        BurstOut {
            rate,
            duration_s: d.as_secs_f64(),
            windows,
            normal_during: Latency::of(&during),
            normal_outside: Latency::of(&outside),
        }
    });
    Injection {
        shares: shares.iter().map(|(k, s)| (k.as_str(), *s)).collect(),
        context_tokens,
        kinds,
        normal_beside_injected: Latency::of(&beside),
        normal_alone: Latency::of(&alone),
        burst,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_refuse_nonsense() {
        assert_eq!(parse_share("over_long=0.02"), Ok((Kind::OverLong, 0.02)));
        assert_eq!(parse_share("empty = 0.5"), Ok((Kind::Empty, 0.5)));
        assert!(parse_share("burst=0.1").is_err());
        assert!(parse_share("empty").is_err());
        assert!(parse_share("empty=1").is_err());
        assert!(parse_share("malformed=-0.1").is_err());
        let (rate, d) = parse_burst("50:5s").unwrap();
        assert_eq!((rate, d), (50.0, std::time::Duration::from_secs(5)));
        assert!(parse_burst("50").is_err());
        assert!(parse_burst("0:5s").is_err());
        assert!(parse_burst("5:0s").is_err());
        assert!(parse_burst("5:soon").is_err());
    }

    #[test]
    fn shares_are_drawn_as_asked_and_bodies_are_what_they_say() {
        let shares = [
            (Kind::OverLong, 0.1),
            (Kind::Empty, 0.2),
            (Kind::Malformed, 0.3),
        ];
        let inj = Injector::new(&shares, Some(1000), Some("m"), 7, 2048).unwrap();
        let mut counts: BTreeMap<Kind, u32> = BTreeMap::new();
        for seq in 0..20_000 {
            if let Some((k, _)) = inj.pick(seq) {
                *counts.entry(k).or_default() += 1;
            }
        }
        for (k, share) in shares {
            let got = f64::from(counts[&k]) / 20_000.0;
            assert!((got - share).abs() < 0.02, "{k:?}: {got}");
        }
        let body = |k| inj.bodies[&k].clone();
        let long: serde_json::Value = serde_json::from_slice(&body(Kind::OverLong)).unwrap();
        let text = long["messages"][0]["content"].as_str().unwrap();
        assert!(text.len() as u64 >= 1000 * OVER_LONG_FACTOR * 4);
        assert_eq!(long["model"], "m");
        let empty: serde_json::Value = serde_json::from_slice(&body(Kind::Empty)).unwrap();
        assert_eq!(empty["messages"], serde_json::json!([]));
        assert!(serde_json::from_slice::<serde_json::Value>(&body(Kind::Malformed)).is_err());
        // The same seed picks the same requests.
        let again = Injector::new(&shares, Some(1000), Some("m"), 7, 2048).unwrap();
        assert!((0..100).all(|s| inj.pick(s).map(|p| p.0) == again.pick(s).map(|p| p.0)));
    }

    #[test]
    fn bad_setups_are_refused() {
        assert!(matches!(
            Injector::new(&[(Kind::OverLong, 0.1)], None, None, 1, 2048),
            Err(InjectError::NoContext)
        ));
        assert!(matches!(
            Injector::new(
                &[(Kind::Empty, 0.6), (Kind::Malformed, 0.6)],
                None,
                None,
                1,
                2048
            ),
            Err(InjectError::TooMuch(_))
        ));
    }

    #[test]
    fn overlap_uses_every_earlier_span() {
        let spans = [(0.0, 10.0), (2.0, 3.0), (20.0, 21.0)];
        let max_end = [10.0, 10.0, 21.0];
        assert!(overlaps(&spans, &max_end, 5.0, 6.0));
        assert!(!overlaps(&spans, &max_end, 11.0, 12.0));
        assert!(overlaps(&spans, &max_end, 19.0, 20.5));
        assert!(!overlaps(&spans, &max_end, -2.0, -1.0));
        assert!(!overlaps(&[], &[], 0.0, 1.0));
    }
}
