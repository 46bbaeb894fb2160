//! A one-pass scanner for the streamed chunk as engines send it: an object whose
//! `choices` hold `delta`s, with `usage` and `error` absent or null.
//!
//! serde's derive spends most of an event's classification on the fields nobody asks for
//! (`id`, `model`, `logprobs`, ...) and on matching field names through visitors. This
//! scanner validates the whole text as strict JSON in one pass and keeps only the raw text
//! of the fields [`super::ChoiceFields`] reads, so both parsers share the same meaning.
//!
//! It answers `None` for anything outside its narrow grammar, and the caller falls back
//! to serde: a key with an escape, a repeated field it reads, a `message`, a non-null
//! `usage` or `error`, a `finish_reason` with an escape, a value of a type the derive
//! would reject, nesting deeper than [`MAX_DEPTH`]. It is stricter than serde_json
//! (the whole text must be UTF-8), never looser, so whenever it answers, serde would
//! have given the same answer; `scan_agrees` checks that in the tests and under fuzzing.

use crate::decode::{EventInfo, FinishReason};

use super::{ChoiceFields, Choices, EventText, MessageFields};

/// Deeper than any chunk an engine sends; serde_json's own limit is 128.
const MAX_DEPTH: u32 = 64;

/// Classifies one chunk's trimmed JSON text, or `None` to leave it to serde.
pub(super) fn classify(json: &[u8]) -> Option<(EventInfo, EventText<'_>)> {
    let text = std::str::from_utf8(json).ok()?;
    let mut s = Scanner {
        s: text,
        b: json,
        i: 0,
    };
    let mut choices: Option<Choices<'_>> = None;
    let mut seen_usage = false;
    let mut seen_error = false;
    let mut object: Option<&str> = None;
    s.object(|s, key| {
        match key? {
            "choices" => {
                if choices.is_some() {
                    return None;
                }
                choices = Some(s.choices()?);
            }
            key @ ("usage" | "error") => {
                let seen = if key == "usage" {
                    &mut seen_usage
                } else {
                    &mut seen_error
                };
                if std::mem::replace(seen, true) || s.value(0)? != "null" {
                    return None;
                }
            }
            // The engine's own timings (vLLM `metrics`, SGLang `meta_info`): read by serde.
            "metrics" | "meta_info" => {
                if s.value(0)? != "null" {
                    return None;
                }
            }
            "object" => {
                if object.is_some() {
                    return None;
                }
                object = Some(s.value(0)?);
            }
            _ => {
                s.value(0)?;
            }
        }
        Some(())
    })?;
    s.ws();
    if s.i != s.b.len() {
        return None;
    }
    let choices = choices.unwrap_or_default();
    let info = EventInfo {
        content: choices.content,
        answer: choices.answer,
        usage: None,
        finish_reason: choices.finish_reason,
        terminal: false,
        error: object == Some(r#""error""#),
        cached_input_tokens: None,
        engine: None,
    };
    Some((info, choices.text))
}

/// The input is UTF-8 as a whole, and every span taken starts and ends at an ASCII
/// byte, so spans are `&str` without checking again.
struct Scanner<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.ws();
        (self.peek()? == byte).then(|| self.i += 1)
    }

    fn text(&self, start: usize) -> Option<&'a str> {
        self.s.get(start..self.i)
    }

    /// An object at the cursor, `field` called with the cursor after each key's colon and
    /// the key, or `None` for a key with escapes (which only serde decodes).
    fn object(
        &mut self,
        mut field: impl FnMut(&mut Self, Option<&'a str>) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            let (key, escaped) = self.string()?;
            let key = key.get(1..key.len() - 1)?;
            self.eat(b':')?;
            field(self, (!escaped).then_some(key))?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `choices`: null, or an array of objects, folded.
    fn choices(&mut self) -> Option<Choices<'a>> {
        let mut folded = Choices::default();
        self.ws();
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(folded);
        }
        self.eat(b'[')?;
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(folded);
        }
        loop {
            let choice = self.choice()?;
            folded.add(&choice);
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(folded);
                }
                _ => return None,
            }
        }
    }

    fn choice(&mut self) -> Option<ChoiceFields<'a>> {
        let mut choice = ChoiceFields::default();
        let (mut delta, mut text, mut finish) = (false, false, false);
        self.object(|s, key| {
            match key? {
                "delta" => {
                    if std::mem::replace(&mut delta, true) {
                        return None;
                    }
                    s.ws();
                    if s.peek()? == b'n' {
                        s.literal(b"null")?;
                    } else {
                        choice.delta = Some(s.message()?);
                    }
                }
                "text" => {
                    if std::mem::replace(&mut text, true) {
                        return None;
                    }
                    choice.text = non_null(s.value(1)?);
                }
                "finish_reason" => {
                    if std::mem::replace(&mut finish, true) {
                        return None;
                    }
                    if let Some(raw) = non_null(s.value(1)?) {
                        let tag = raw.strip_prefix('"')?.strip_suffix('"')?;
                        if tag.contains('\\') {
                            return None;
                        }
                        choice.finish_reason = Some(FinishReason::from_wire(tag));
                    }
                }
                "message" => return None,
                _ => {
                    s.value(1)?;
                }
            }
            Some(())
        })?;
        Some(choice)
    }

    fn message(&mut self) -> Option<MessageFields<'a>> {
        let mut m = MessageFields::default();
        // serde's derive rejects a repeated field, even when the first value was null.
        let mut seen = 0u8;
        self.object(|s, key| {
            let (bit, slot) = match key? {
                "content" => (1, &mut m.content),
                "reasoning_content" => (2, &mut m.reasoning_content),
                "reasoning" => (4, &mut m.reasoning),
                "tool_calls" => (8, &mut m.tool_calls),
                "function_call" => (16, &mut m.function_call),
                "refusal" => (32, &mut m.refusal),
                _ => {
                    s.value(2)?;
                    return Some(());
                }
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            *slot = non_null(s.value(2)?);
            Some(())
        })?;
        Some(m)
    }

    /// Any JSON value at the cursor, validated, as raw text; `depth` is the nesting
    /// around it.
    fn value(&mut self, depth: u32) -> Option<&'a str> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        let start = self.i;
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'{' => self.object(|s, _| s.value(depth + 1).map(drop))?,
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    loop {
                        self.value(depth + 1)?;
                        self.ws();
                        match self.peek()? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return None,
        }
        self.text(start)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }

    /// A string at the cursor, quotes included, and whether it has escapes. No control
    /// characters, valid escapes.
    fn string(&mut self) -> Option<(&'a str, bool)> {
        let start = self.i;
        (self.peek()? == b'"').then(|| self.i += 1)?;
        let mut escaped = false;
        loop {
            let rest = self.b.get(self.i..)?;
            let at = special_at(rest)?;
            self.i += at + 1;
            match rest.get(at)? {
                b'"' => return Some((self.text(start)?, escaped)),
                b'\\' => escaped = true,
                _ => return None,
            }
            match self.peek()? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                b'u' => {
                    let hex = self.b.get(self.i + 1..self.i + 5)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    self.i += 5;
                }
                _ => return None,
            }
        }
    }
}

/// The first `"`, `\\` or control character in `bytes`, eight bytes at a time.
pub(super) fn special_at(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    /// High bit set in each byte of `x` below `n` (n <= 128); exact for the lowest such
    /// byte, which is the one asked for.
    fn below(x: u64, n: u8) -> u64 {
        x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH
    }
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let x = u64::from_le_bytes(word.try_into().ok()?);
        let hits = below(x ^ (ONES * u64::from(b'"')), 1)
            | below(x ^ (ONES * u64::from(b'\\')), 1)
            | below(x, 0x20);
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = words.remainder();
    tail.iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|p| at + p)
}

fn non_null(raw: &str) -> Option<&str> {
    (raw != "null").then_some(raw)
}
