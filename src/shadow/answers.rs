//! Answers compared in memory, never kept: each side's answer is reduced, by the shadow's
//! comparer (off the aggregator), to the text the comparison needs ([`Answer`]); a pair's answers wait
//! in a bounded buffer ([`Waiting`]) only until the primary's and a copy's are both there,
//! are compared into plain numbers ([`Compared`]), and are dropped at once.
//!
//! Why a bounded buffer and not a rolling hash: the first divergence position needs both
//! sequences side by side (a hash of every prefix would be as large, and would keep a
//! fingerprint of the content); the buffer lives only as long as the pair is in flight,
//! each answer is cut at `shadow.max_answer_bytes`, and the whole is held under
//! [`WAITING_BYTES`] and [`WAITING_PAIRS`], oldest first out (a pair whose other side
//! never comes, a copy dropped before its record, goes that way). Nothing of it reaches a record, a log line, a
//! metric or the API.

use std::collections::{HashMap, VecDeque};

use super::logprobs::{Close, Token, close};
use crate::decode::FinishReason;

/// Text held at once for pairs still waiting for a side: past it the oldest pair's
/// answers are dropped (that pair is then not compared). 64 MiB is 64 pairs of 1 MiB
/// answers, far more of the usual few-KiB ones.
pub const WAITING_BYTES: usize = 64 << 20;
/// Pairs waiting at once: a pair waits for seconds (its slowest side's answer), so 4,096
/// is thousands of requests per second of mirrored traffic, while a side that never
/// comes (a copy dropped before its record) costs a few bytes a pair until it goes.
pub const WAITING_PAIRS: usize = 4_096;

/// One side's answer, reduced to what the comparison needs.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub text: String,
    /// Where each streamed content event ended (bytes): one event a token, as vLLM and
    /// most engines stream. `None` for an answer in one body.
    pub marks: Option<Vec<u32>>,
    pub finish: Option<FinishReason>,
    /// A copy's tokens with their top alternatives (`shadow.logprobs`).
    pub tokens: Option<Vec<Token>>,
}

impl Answer {
    /// Bytes held (for the waiting buffer's bound).
    fn weight(&self) -> usize {
        self.text.len()
            + self.marks.as_ref().map_or(0, |m| m.len() * 4)
            + self
                .tokens
                .as_ref()
                .map_or(0, |t| t.iter().map(Token::weight).sum())
    }
}

/// One copy's answer beside the primary's, as numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compared {
    pub exact: bool,
    /// Characters of the common prefix (`None` when the answers are the same).
    pub first_divergence_chars: Option<u64>,
    /// Tokens (streamed events) of the primary's answer before the first difference.
    pub first_divergence_tokens: Option<u64>,
    /// The copy's output length over the primary's, in characters.
    pub length_ratio: Option<f64>,
    pub finish_equal: bool,
    /// The request asked for a reproducible answer: judged word for word.
    pub deterministic: bool,
    /// Both answers' lengths in characters (primary, copy), and their finish reasons:
    /// sampled answers are compared as distributions of these.
    pub lengths: (u64, u64),
    pub finishes: (Option<FinishReason>, Option<FinishReason>),
}

/// Compares `copy` with `primary`.
pub fn compare(primary: &Answer, copy: &Answer, deterministic: bool) -> Compared {
    let exact = primary.text == copy.text;
    let common = common_prefix_bytes(&primary.text, &copy.text);
    let chars = |s: &str, upto: usize| s.get(..upto).map_or(0, |p| p.chars().count()) as u64;
    let (p_len, c_len) = (
        chars(&primary.text, primary.text.len()),
        chars(&copy.text, copy.text.len()),
    );
    Compared {
        exact,
        first_divergence_chars: (!exact).then(|| chars(&primary.text, common)),
        first_divergence_tokens: (!exact)
            .then(|| {
                primary.marks.as_ref().map(|m| {
                    m.iter()
                        .take_while(|end| (**end as usize) <= common)
                        .count() as u64
                })
            })
            .flatten(),
        length_ratio: (p_len > 0).then(|| c_len as f64 / p_len as f64),
        finish_equal: primary.finish == copy.finish,
        deterministic,
        lengths: (p_len, c_len),
        finishes: (primary.finish, copy.finish),
    }
}

/// Bytes both strings share from the start, at a character boundary.
fn common_prefix_bytes(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Which side an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Primary,
    Candidate,
    Secondary,
}

/// What a side's arrival compared.
#[derive(Debug, Clone, Copy, Default)]
pub struct Comparisons {
    pub candidate: Option<Compared>,
    pub secondary: Option<Compared>,
    /// vLLM's rule between the candidate's and the secondary's tokens, with the
    /// determinism of the request.
    pub close: Option<(Close, bool)>,
    /// The candidate's result for `goodput_shadow_answer_pairs_total`, once decided.
    pub result: Option<PairResult>,
}

/// A candidate answer's result: the same text as the primary's, or not; and with
/// log-probabilities, a different text that vLLM's rule accepts against the secondary's
/// tokens is `close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairResult {
    Same,
    Differs,
    Close,
}

impl PairResult {
    pub fn as_str(self) -> &'static str {
        match self {
            PairResult::Same => "same",
            PairResult::Differs => "differs",
            PairResult::Close => "close",
        }
    }
}

/// How one side's arrival is to be taken.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// The request asked for a reproducible answer.
    pub deterministic: bool,
    /// Copies the pair can have (1, or 2 with a secondary).
    pub copies: u8,
    /// The copies carry log-probabilities, to be compared with each other.
    pub logprobs: bool,
}

/// The answers of pairs still in flight, by the primary's id.
#[derive(Debug, Default)]
pub struct Waiting {
    pairs: HashMap<String, Slots>,
    order: VecDeque<String>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Slots {
    /// The primary's answer; `Some(None)` when it has none to compare (not ok, cut).
    primary: Option<Option<Answer>>,
    candidate: Copy,
    secondary: Copy,
    /// The copies' tokens, waiting for each other (`shadow.logprobs`).
    candidate_tokens: Option<Vec<Token>>,
    secondary_tokens: Option<Vec<Token>>,
    /// The close check, once made or known impossible (`Some(None)`).
    close: Option<Option<Close>>,
    /// The candidate differs from the primary; its result waits for the close check.
    undecided: bool,
}

/// A copy's answer in its pair.
#[derive(Debug, Default)]
enum Copy {
    #[default]
    Awaited,
    /// Arrived, with its request's determinism, waiting for the primary's.
    Waiting(Answer, bool),
    /// Compared, or arrived without an answer.
    Done,
}

impl Slots {
    fn bytes(&self) -> usize {
        let t =
            |t: &Option<Vec<Token>>| t.as_ref().map_or(0, |t| t.iter().map(Token::weight).sum());
        let c = |c: &Copy| match c {
            Copy::Waiting(a, _) => a.weight(),
            _ => 0,
        };
        self.primary
            .as_ref()
            .and_then(Option::as_ref)
            .map_or(0, Answer::weight)
            + c(&self.candidate)
            + c(&self.secondary)
            + t(&self.candidate_tokens)
            + t(&self.secondary_tokens)
    }

    /// Compares a waiting copy with the primary's answer, once both are there.
    fn compare(&mut self, side: Side) -> Option<Compared> {
        let primary = self.primary.as_ref()?;
        let slot = match side {
            Side::Candidate => &mut self.candidate,
            Side::Secondary => &mut self.secondary,
            Side::Primary => return None,
        };
        if !matches!(slot, Copy::Waiting(..)) {
            return None;
        }
        let Copy::Waiting(copy, det) = std::mem::replace(slot, Copy::Done) else {
            return None;
        };
        primary.as_ref().map(|p| compare(p, &copy, det))
    }
}

impl Waiting {
    /// Adds one side's answer (`None`: it has none to compare) to the pair `key`; returns
    /// what could be compared now. Once each copy is done with (and, with
    /// log-probabilities, the copies' tokens compared), the pair's answers go.
    pub fn add(
        &mut self,
        key: &str,
        side: Side,
        answer: Option<Answer>,
        expect: Expect,
    ) -> Comparisons {
        let slots = match self.pairs.get_mut(key) {
            Some(s) => s,
            None => {
                self.order.push_back(key.to_owned());
                self.pairs.entry(key.to_owned()).or_default()
            }
        };
        let before = slots.bytes();
        let arrived = |mut answer: Option<Answer>| {
            let tokens = answer.as_mut().and_then(|a| a.tokens.take());
            let copy = answer.map_or(Copy::Done, |a| Copy::Waiting(a, expect.deterministic));
            (copy, tokens)
        };
        match side {
            Side::Primary => slots.primary = Some(answer),
            Side::Candidate => (slots.candidate, slots.candidate_tokens) = arrived(answer),
            Side::Secondary => (slots.secondary, slots.secondary_tokens) = arrived(answer),
        }
        let mut out = Comparisons {
            candidate: slots.compare(Side::Candidate),
            secondary: slots.compare(Side::Secondary),
            ..Comparisons::default()
        };
        if let Some(c) = out.candidate {
            if c.exact {
                out.result = Some(PairResult::Same);
            } else {
                slots.undecided = true;
            }
        }
        if slots.close.is_none() {
            let here = |c: &Copy| !matches!(c, Copy::Awaited);
            if !(expect.logprobs && expect.copies >= 2) {
                slots.close = Some(None);
            } else if here(&slots.candidate) && here(&slots.secondary) {
                let made = match (&slots.candidate_tokens, &slots.secondary_tokens) {
                    (Some(c), Some(s)) => Some(close(c, s)),
                    _ => None,
                };
                out.close = made.map(|c| (c, expect.deterministic));
                slots.close = Some(made);
                slots.candidate_tokens = None;
                slots.secondary_tokens = None;
            } else if (here(&slots.candidate) && slots.candidate_tokens.is_none())
                || (here(&slots.secondary) && slots.secondary_tokens.is_none())
            {
                // A copy came without tokens: there is nothing to wait for.
                slots.close = Some(None);
                slots.candidate_tokens = None;
                slots.secondary_tokens = None;
            }
        }
        if slots.undecided
            && let Some(close) = slots.close
        {
            slots.undecided = false;
            out.result = Some(match close {
                Some(c) if c.accepted => PairResult::Close,
                _ => PairResult::Differs,
            });
        }
        let done = |c: &Copy| matches!(c, Copy::Done);
        let finished = slots.primary.is_some()
            && done(&slots.candidate)
            && (expect.copies < 2 || done(&slots.secondary))
            && slots.close.is_some()
            && !slots.undecided;
        let after = slots.bytes();
        self.bytes = self.bytes.saturating_sub(before) + after;
        if finished {
            self.remove(key);
        }
        while self.bytes > WAITING_BYTES || self.pairs.len() > WAITING_PAIRS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.remove(&old);
        }
        // The order keeps the keys of pairs already gone until they come up: dropped from
        // the front as they do, and all at once before they outnumber the live ones.
        while self
            .order
            .front()
            .is_some_and(|k| !self.pairs.contains_key(k))
        {
            self.order.pop_front();
        }
        if self.order.len() > 2 * WAITING_PAIRS {
            let pairs = &self.pairs;
            self.order.retain(|k| pairs.contains_key(k));
        }
        out
    }

    fn remove(&mut self, key: &str) {
        if let Some(s) = self.pairs.remove(key) {
            self.bytes = self.bytes.saturating_sub(s.bytes());
        }
    }

    /// Pairs waiting, and the text they hold.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        (self.pairs.len(), self.bytes)
    }

    /// Keys in the order queue (live or gone).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str, marks: Option<Vec<u32>>) -> Answer {
        Answer {
            text: text.to_owned(),
            marks,
            finish: Some(FinishReason::Stop),
            tokens: None,
        }
    }

    fn expect(copies: u8, logprobs: bool) -> Expect {
        Expect {
            deterministic: true,
            copies,
            logprobs,
        }
    }

    fn with_tokens(text: &str, tokens: &[(&str, &[&str])]) -> Option<Answer> {
        Some(Answer {
            tokens: Some(
                tokens
                    .iter()
                    .map(|(t, top)| Token {
                        token: (*t).to_owned(),
                        top: top.iter().map(|x| ((*x).to_owned(), -0.5)).collect(),
                    })
                    .collect(),
            ),
            ..answer(text, None)
        })
    }
    #[test]
    fn the_first_difference_is_found_in_characters_and_tokens() {
        let p = answer("the model is", Some(vec![4, 10, 13]));
        let same = compare(&p, &answer("the model is", None), true);
        assert!(same.exact && same.finish_equal);
        assert_eq!(same.first_divergence_chars, None);
        assert_eq!(same.length_ratio, Some(1.0));
        let other = compare(&p, &answer("the mouse is there", None), true);
        assert!(!other.exact);
        assert_eq!(other.first_divergence_chars, Some(6));
        assert_eq!(other.first_divergence_tokens, Some(1));
        assert_eq!(other.length_ratio, Some(18.0 / 12.0));
        // Characters, not bytes, at a multi-byte boundary.
        let p = answer("né x", None);
        let c = compare(&p, &answer("né y", None), false);
        assert_eq!(c.first_divergence_chars, Some(3));
        assert_eq!(c.first_divergence_tokens, None);
    }

    #[test]
    fn answers_wait_only_until_both_sides_are_compared() {
        let mut w = Waiting::default();
        let r = w.add(
            "a",
            Side::Candidate,
            Some(answer("x", None)),
            expect(2, false),
        );
        assert!(r.candidate.is_none());
        let r = w.add(
            "a",
            Side::Primary,
            Some(answer("x", None)),
            expect(2, false),
        );
        assert!(r.candidate.is_some_and(|c| c.exact && c.deterministic));
        assert_eq!(r.result, Some(PairResult::Same));
        // The primary's answer waits for the secondary's, then both go.
        assert_eq!(w.len(), (1, 1));
        let r = w.add(
            "a",
            Side::Secondary,
            Some(answer("y", None)),
            expect(2, false),
        );
        assert!(r.secondary.is_some_and(|c| !c.exact));
        assert_eq!(w.len(), (0, 0));
        // A copy without an answer is done with at once, and frees the primary's.
        w.add(
            "b",
            Side::Primary,
            Some(answer("x", None)),
            expect(2, false),
        );
        w.add("b", Side::Secondary, None, expect(2, false));
        let r = w.add(
            "b",
            Side::Candidate,
            Some(answer("z", None)),
            expect(2, false),
        );
        assert_eq!(r.result, Some(PairResult::Differs));
        assert_eq!(w.len(), (0, 0));
    }

    #[test]
    fn a_differing_candidate_waits_for_the_close_check_of_the_copies_tokens() {
        let mut w = Waiting::default();
        let e = expect(2, true);
        w.add("a", Side::Primary, Some(answer("the cat", None)), e);
        let r = w.add(
            "a",
            Side::Candidate,
            with_tokens("the dog", &[("the", &["the"]), (" dog", &[" dog", " cat"])]),
            e,
        );
        assert!(r.candidate.is_some_and(|c| !c.exact));
        assert_eq!(r.result, None);
        let r = w.add(
            "a",
            Side::Secondary,
            with_tokens("the cat", &[("the", &["the"]), (" cat", &[" cat", " dog"])]),
            e,
        );
        assert_eq!(r.result, Some(PairResult::Close));
        assert!(r.close.is_some_and(|(c, det)| c.accepted && det));
        assert_eq!(w.len(), (0, 0));
        // Not in each other's top: differs.
        w.add(
            "b",
            Side::Secondary,
            with_tokens("the cat", &[("the", &["the"]), (" cat", &[" cat"])]),
            e,
        );
        w.add(
            "b",
            Side::Candidate,
            with_tokens("the owl", &[("the", &["the"]), (" owl", &[" owl"])]),
            e,
        );
        let r = w.add("b", Side::Primary, Some(answer("the cat", None)), e);
        assert_eq!(r.result, Some(PairResult::Differs));
        assert_eq!(w.len(), (0, 0));
    }

    #[test]
    fn the_buffer_is_bounded_oldest_first() {
        let mut w = Waiting::default();
        let big = "x".repeat(WAITING_BYTES / 2 + 1);
        w.add(
            "a",
            Side::Primary,
            Some(answer(&big, None)),
            expect(1, false),
        );
        w.add(
            "b",
            Side::Primary,
            Some(answer(&big, None)),
            expect(1, false),
        );
        assert_eq!(w.len(), (1, big.len()));
        let r = w.add(
            "a",
            Side::Candidate,
            Some(answer("x", None)),
            expect(1, false),
        );
        assert!(r.candidate.is_none());
    }

    #[test]
    fn pairs_whose_other_side_never_comes_are_bounded_and_no_key_is_kept_forever() {
        let mut w = Waiting::default();
        // A secondary that never answers: every pair waits for it.
        for i in 0..(3 * WAITING_PAIRS) {
            let key = i.to_string();
            w.add(
                &key,
                Side::Primary,
                Some(answer("x", None)),
                expect(2, false),
            );
            w.add(
                &key,
                Side::Candidate,
                Some(answer("x", None)),
                expect(2, false),
            );
        }
        assert_eq!(w.len(), (WAITING_PAIRS, WAITING_PAIRS));
        assert!(w.keys() <= 2 * WAITING_PAIRS);
        // Pairs that finish leave no key behind, whatever order they finish in.
        let mut w = Waiting::default();
        for i in 0..(3 * WAITING_PAIRS) {
            let key = i.to_string();
            w.add(
                &key,
                Side::Candidate,
                Some(answer("x", None)),
                expect(1, false),
            );
            w.add(
                &key,
                Side::Primary,
                Some(answer("x", None)),
                expect(1, false),
            );
        }
        assert_eq!(w.len(), (0, 0));
        assert_eq!(w.keys(), 0);
    }
}
