//! The pairing book: the aggregator notes each mirrored primary record and each shadow
//! record (a few numbers, no content); `GET /api/v1/shadow` reads the pairs of a window.
//! It holds at most [`KEEP`] pairs, the oldest going first.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::Serialize;

use super::answers::{Answer, Compared, Expect, PairResult, Side as AnswerSide, Waiting};
use super::logprobs::Close;
use super::report::{Answers, Bar, RULE, Ratio, Side, SideStats, Thresholds, Verdict, verdict};
use super::shift::Shift;
use crate::{
    measure::{RequestRecord, Target},
    slo::Slo,
};

/// Pairs kept at most: an hour at 5 mirrored requests per second, a few MiB.
pub const KEEP: usize = 20_000;

#[derive(Debug, Clone, Default)]
pub struct Book {
    ledger: Arc<Mutex<Ledger>>,
}

#[derive(Debug, Default)]
struct Ledger {
    pairs: HashMap<String, Pair>,
    order: VecDeque<String>,
    /// The answers of pairs still waiting for a side (content, bounded, never kept).
    waiting: Waiting,
}

#[derive(Debug, Default)]
struct Pair {
    class: String,
    primary: Option<Side>,
    shadow: Option<(Instant, Side)>,
    /// The secondary's answer to the same copy, when one is configured.
    secondary: Option<Side>,
    /// The candidate's and the secondary's answers beside the primary's, as numbers.
    candidate_answer: Option<Compared>,
    secondary_answer: Option<Compared>,
    /// vLLM's rule between the candidate's and the secondary's tokens, and whether the
    /// request was deterministic.
    close: Option<(Close, bool)>,
}

impl Book {
    /// Notes a judged record: a mirrored primary, or a shadow. Others are ignored.
    pub fn note(&self, r: &RequestRecord) {
        let key = match r.pairing.target {
            Target::Primary if r.pairing.mirrored => r.id.clone(),
            Target::Shadow | Target::Secondary => match &r.pairing.pair_id {
                Some(id) => id.clone(),
                None => return,
            },
            Target::Primary => return,
        };
        let side = Side {
            outcome: r.outcome,
            slo_met: r.slo_met,
            ttft_ms: r.ttft_ms,
            tpot_ms: r.tpot_ms,
            e2e_ms: r.e2e_ms,
            itl_ms: r.itl_ms.map(|i| i.p50),
            output_tokens: r.output_tokens,
        };
        let Ok(mut ledger) = self.ledger.lock() else {
            return;
        };
        let ledger = &mut *ledger;
        let pair = ledger.pairs.entry(key.to_owned()).or_insert_with(|| {
            ledger.order.push_back(key.to_owned());
            Pair::default()
        });
        match r.pairing.target {
            Target::Shadow => {
                if pair.class.is_empty() {
                    pair.class = r.slo_class.to_string();
                }
                pair.shadow = Some((r.finished_at.unwrap_or_else(Instant::now), side));
            }
            Target::Secondary => {
                if pair.class.is_empty() {
                    pair.class = r.slo_class.to_string();
                }
                pair.secondary = Some(side);
            }
            Target::Primary => {
                // The primary's class names the pair: the copies are held to the same one.
                pair.class = r.slo_class.to_string();
                pair.primary = Some(side);
            }
        }
        while ledger.order.len() > KEEP {
            if let Some(old) = ledger.order.pop_front() {
                ledger.pairs.remove(&old);
            }
        }
    }

    /// Reduces a side's answer (`None`: it has none to compare) into the comparison of
    /// the pair `key` (the primary's id): `answer` waits (bounded) only until the
    /// primary's and a copy's are both there, then is compared and dropped. Returns the
    /// candidate's result once it is decided.
    pub fn answer(
        &self,
        key: &str,
        side: AnswerSide,
        answer: Option<Answer>,
        expect: Expect,
    ) -> Option<PairResult> {
        let mut ledger = self.ledger.lock().ok()?;
        let ledger = &mut *ledger;
        let made = ledger.waiting.add(key, side, answer, expect);
        if made.candidate.is_none() && made.secondary.is_none() && made.close.is_none() {
            return made.result;
        }
        let pair = ledger.pairs.entry(key.to_owned()).or_insert_with(|| {
            ledger.order.push_back(key.to_owned());
            Pair::default()
        });
        if made.candidate.is_some() {
            pair.candidate_answer = made.candidate;
        }
        if made.secondary.is_some() {
            pair.secondary_answer = made.secondary;
        }
        if made.close.is_some() {
            pair.close = made.close;
        }
        made.result
    }

    /// Counts of the shadow answers that finished within `window` before `now`, per class
    /// and `overall`, for the gauges.
    pub fn totals(&self, window: Duration, now: Instant) -> Vec<(String, Totals)> {
        let Ok(ledger) = self.ledger.lock() else {
            return Vec::new();
        };
        let since = now.checked_sub(window);
        let mut by_class: HashMap<&str, Totals> = HashMap::new();
        let mut overall = Totals::default();
        for pair in ledger.pairs.values() {
            let Some((at, s)) = &pair.shadow else {
                continue;
            };
            if since.is_some_and(|t| *at < t) || *at > now {
                continue;
            }
            by_class.entry(&pair.class).or_default().add(s);
            overall.add(s);
        }
        let mut out: Vec<(String, Totals)> = by_class
            .into_iter()
            .map(|(c, t)| (c.to_owned(), t))
            .collect();
        if !out.is_empty() {
            out.push(("overall".to_owned(), overall));
        }
        out
    }

    /// The report of the pairs whose shadow finished within `window` before `now`.
    pub fn report(
        &self,
        window: Duration,
        now: Instant,
        slo: &Slo,
        thresholds: Thresholds,
    ) -> Vec<ClassReport> {
        let Ok(ledger) = self.ledger.lock() else {
            return Vec::new();
        };
        let since = now.checked_sub(window);
        let mut by_class: HashMap<&str, Vec<&Pair>> = HashMap::new();
        for pair in ledger.pairs.values() {
            let (Some(_), Some((at, _))) = (&pair.primary, &pair.shadow) else {
                continue;
            };
            if since.is_some_and(|s| *at < s) || *at > now {
                continue;
            }
            by_class.entry(&pair.class).or_default().push(pair);
        }
        let window_s = window.as_secs_f64();
        let mut out: Vec<ClassReport> = by_class
            .into_iter()
            .map(|(class, pairs)| ClassReport::of(class, &pairs, window_s, slo, thresholds))
            .collect();
        out.sort_by(|a, b| a.class.cmp(&b.class));
        out
    }
}

/// Shadow answers of a window, counted for the gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub judged: u64,
    pub met: u64,
    pub effective_tokens: u64,
    pub raw_tokens: u64,
}

impl Totals {
    fn add(&mut self, s: &Side) {
        let tokens = s.output_tokens.unwrap_or(0);
        self.raw_tokens += tokens;
        if let Some(met) = s.slo_met {
            self.judged += 1;
            if met {
                self.met += 1;
                self.effective_tokens += tokens;
            }
        }
    }
}

/// One class in `GET /api/v1/shadow`.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub class: String,
    pub attainment_target: f64,
    pub primary: SideStats,
    pub shadow: SideStats,
    /// The secondary's side over the same pairs, where it answered (`null` without
    /// `shadow.secondary_url`).
    pub secondary: Option<SideStats>,
    /// Per-request shadow/primary ratios over the pairs both answered (`ok`).
    pub ttft_ratio: Ratio,
    pub tpot_ratio: Ratio,
    /// Paired Hodges–Lehmann shifts (ms) from the primary, candidate's and secondary's.
    pub ttft_shift: Shifts,
    pub tpot_shift: Shifts,
    /// The latency half of the verdict (today's rule): `verdict`, `reason`, `rule`.
    pub verdict: Verdict,
    pub reason: String,
    pub rule: &'static str,
    /// The answers half: the candidate's words against the primary's own noise.
    pub answers: Answers,
}

/// The candidate's shift from the primary beside the secondary's: the primary's own
/// spread (`null` without a secondary).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Shifts {
    pub candidate: Shift,
    pub secondary: Option<Shift>,
}

impl ClassReport {
    fn of(
        class: &str,
        book: &[&Pair],
        window_s: f64,
        slo: &Slo,
        thresholds: Thresholds,
    ) -> ClassReport {
        let candidate: Vec<Compared> = book.iter().filter_map(|p| p.candidate_answer).collect();
        let noise: Vec<Compared> = book.iter().filter_map(|p| p.secondary_answer).collect();
        let closes: Vec<Close> = book
            .iter()
            .filter_map(|p| p.close)
            .filter(|(_, det)| *det)
            .map(|(c, _)| c)
            .collect();
        let pairs: Vec<(&Side, &Side)> = book
            .iter()
            .filter_map(|p| Some((p.primary.as_ref()?, &p.shadow.as_ref()?.1)))
            .collect();
        let pairs = &pairs[..];
        let secondaries: Vec<&Side> = book.iter().filter_map(|p| p.secondary.as_ref()).collect();
        let cfg = slo
            .classes
            .iter()
            .find(|c| &*c.name == class)
            .unwrap_or(&slo.default);
        let ok = |p: &Side, s: &Side| {
            p.outcome == crate::measure::Outcome::Ok && s.outcome == crate::measure::Outcome::Ok
        };
        let answered = || pairs.iter().filter(|(p, s)| ok(p, s));
        let spread: Vec<(&Side, &Side)> = book
            .iter()
            .filter_map(|p| Some((p.primary.as_ref()?, p.secondary.as_ref()?)))
            .filter(|(p, s)| ok(p, s))
            .collect();
        let shifts = |f: fn(&Side) -> Option<f64>| {
            let times = |v: &mut dyn Iterator<Item = &(&Side, &Side)>| -> Vec<(f64, f64)> {
                v.filter_map(|(p, s)| Some((f(p)?, f(s)?))).collect()
            };
            Shifts {
                candidate: Shift::of(&times(&mut answered())),
                secondary: (!spread.is_empty()).then(|| Shift::of(&times(&mut spread.iter()))),
            }
        };
        let ratio = |f: fn(&Side) -> Option<f64>| {
            Ratio::of(
                answered()
                    .filter_map(|(p, s)| match (f(p), f(s)) {
                        (Some(p), Some(s)) if p > 0.0 => Some(s / p),
                        _ => None,
                    })
                    .collect(),
            )
        };
        let (verdict, reason) = verdict(
            pairs,
            Bar {
                attainment: cfg.attainment,
                error_rate_max: cfg.error_rate_max,
                min_pairs: slo.min_samples.max(1),
            },
        );
        ClassReport {
            class: class.to_owned(),
            attainment_target: cfg.attainment,
            primary: SideStats::of(pairs.iter().map(|(p, _)| *p), window_s),
            shadow: SideStats::of(pairs.iter().map(|(_, s)| *s), window_s),
            secondary: (!secondaries.is_empty())
                .then(|| SideStats::of(secondaries.iter().copied(), window_s)),
            ttft_ratio: ratio(|s| s.ttft_ms),
            tpot_ratio: ratio(|s| s.tpot_ms),
            ttft_shift: shifts(|s| s.ttft_ms),
            tpot_shift: shifts(|s| s.tpot_ms),
            verdict,
            reason,
            rule: RULE,
            answers: Answers::of(&candidate, &noise, thresholds, slo.min_samples.max(1))
                .with_close(&closes),
        }
    }
}
