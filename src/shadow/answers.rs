//! Answers compared in memory, never kept: each side's answer is reduced, at record time
//! on the aggregator, to the text the comparison needs ([`Answer`]); a pair's answers wait
//! in a bounded buffer ([`Waiting`]) only until the primary's and a copy's are both there,
//! are compared into plain numbers ([`Compared`]), and are dropped at once.
//!
//! Why a bounded buffer and not a rolling hash: the first divergence position needs both
//! sequences side by side (a hash of every prefix would be as large, and would keep a
//! fingerprint of the content); the buffer lives only as long as the pair is in flight,
//! each answer is cut at `shadow.max_answer_bytes`, and the whole is held under
//! [`WAITING_BYTES`], oldest first out. Nothing of it reaches a record, a log line, a
//! metric or the API.

use std::collections::{HashMap, VecDeque};

use crate::decode::FinishReason;

/// Text held at once for pairs still waiting for a side: past it the oldest pair's
/// answers are dropped (that pair is then not compared). 64 MiB is 64 pairs of 1 MiB
/// answers, far more of the usual few-KiB ones.
pub const WAITING_BYTES: usize = 64 << 20;

/// One side's answer, reduced to what the comparison needs.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub text: String,
    /// Where each streamed content event ended (bytes): one event a token, as vLLM and
    /// most engines stream. `None` for an answer in one body.
    pub marks: Option<Vec<u32>>,
    pub finish: Option<FinishReason>,
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
    primary: Option<Answer>,
    /// A copy's answer with its request's determinism.
    candidate: Option<(Answer, bool)>,
    secondary: Option<(Answer, bool)>,
    /// Copies already compared (their answers dropped).
    done: u8,
}

impl Waiting {
    /// Adds one side's answer to the pair `key`; returns what could be compared now.
    /// `copies` is how many copies the pair can have (1, or 2 with a secondary): once
    /// each is compared, the primary's answer goes too.
    pub fn add(
        &mut self,
        key: &str,
        side: Side,
        answer: Answer,
        deterministic: bool,
        copies: u8,
    ) -> Comparisons {
        self.bytes += answer.text.len();
        let slots = match self.pairs.get_mut(key) {
            Some(s) => s,
            None => {
                self.order.push_back(key.to_owned());
                self.pairs.entry(key.to_owned()).or_default()
            }
        };
        match side {
            Side::Primary => slots.primary = Some(answer),
            Side::Candidate => slots.candidate = Some((answer, deterministic)),
            Side::Secondary => slots.secondary = Some((answer, deterministic)),
        }
        let mut out = Comparisons::default();
        let mut freed = 0;
        if let Some(primary) = &slots.primary {
            if let Some((copy, det)) = slots.candidate.take() {
                out.candidate = Some(compare(primary, &copy, det));
                freed += copy.text.len();
                slots.done += 1;
            }
            if let Some((copy, det)) = slots.secondary.take() {
                out.secondary = Some(compare(primary, &copy, det));
                freed += copy.text.len();
                slots.done += 1;
            }
        }
        let finished = slots.done >= copies;
        self.bytes -= freed;
        if finished {
            self.remove(key);
        }
        while self.bytes > WAITING_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.remove(&old);
        }
        out
    }

    fn remove(&mut self, key: &str) {
        if let Some(s) = self.pairs.remove(key) {
            let len = |a: &Option<Answer>| a.as_ref().map_or(0, |a| a.text.len());
            self.bytes -=
                len(&s.primary) + len(&s.candidate.map(|c| c.0)) + len(&s.secondary.map(|c| c.0));
        }
        // The order queue keeps the key until it comes up; a later pair of the same id
        // is rare (ids are unique per request) and only evicted early.
    }

    /// Pairs waiting, and the text they hold.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        (self.pairs.len(), self.bytes)
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
        }
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
        let r = w.add("a", Side::Candidate, answer("x", None), true, 2);
        assert!(r.candidate.is_none());
        let r = w.add("a", Side::Primary, answer("x", None), false, 2);
        assert!(r.candidate.is_some_and(|c| c.exact && c.deterministic));
        // The primary's answer waits for the secondary's, then both go.
        assert_eq!(w.len(), (1, 1));
        let r = w.add("a", Side::Secondary, answer("y", None), true, 2);
        assert!(r.secondary.is_some_and(|c| !c.exact));
        assert_eq!(w.len(), (0, 0));
    }

    #[test]
    fn the_buffer_is_bounded_oldest_first() {
        let mut w = Waiting::default();
        let big = "x".repeat(WAITING_BYTES / 2 + 1);
        w.add("a", Side::Primary, answer(&big, None), false, 1);
        w.add("b", Side::Primary, answer(&big, None), false, 1);
        assert_eq!(w.len(), (1, big.len()));
        let r = w.add("a", Side::Candidate, answer("x", None), false, 1);
        assert!(r.candidate.is_none());
    }
}
