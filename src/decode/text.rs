//! The generated text of a response, for counting its tokens when the upstream reports no
//! usage.
//!
//! Classification ([`crate::decode::EventInfo`]) never copies text. When a request needs
//! its text counted, the stream decoder walks each content-bearing event a second time
//! with [`collect`], which appends the JSON strings found at the dialect's text paths
//! (content, reasoning, tool-call names and arguments) to a bounded [`TextBuf`]: strings
//! without escapes are copied straight from the event, escaped ones are unescaped by serde
//! into the buffer, and nothing else is materialised (no `Value`, no per-event `String`).
//! An object found at a text path (a tool call's `input`) is taken as its raw JSON text.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Default cap on the text kept per request: 1 MiB is ~250k tokens, beyond any output cap.
pub const DEFAULT_TEXT_LIMIT: usize = 1 << 20;

/// A path of object keys from the event's root; `*` stands for any array element.
pub(crate) type Path = &'static [&'static str];

/// Generated text gathered for one response, up to a byte limit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TextBuf {
    text: String,
    limit: usize,
    /// Bytes of text that did not fit under the limit (so a count can be extrapolated).
    dropped: u64,
    /// Where each content event's text ended (bytes), when asked for
    /// ([`TextBuf::with_marks`]): the answer's token positions, one event a token.
    marks: Option<Vec<u32>>,
}

impl TextBuf {
    pub fn new(limit: usize) -> TextBuf {
        TextBuf {
            text: String::new(),
            limit,
            dropped: 0,
            marks: None,
        }
    }

    /// A buffer that also notes where each content event ended.
    pub fn with_marks(limit: usize) -> TextBuf {
        TextBuf {
            marks: Some(Vec::new()),
            ..TextBuf::new(limit)
        }
    }

    /// Where each content event's text ended, when noted.
    pub fn marks(&self) -> Option<&[u32]> {
        self.marks.as_deref()
    }

    /// The text, taken out.
    pub fn into_text(self) -> String {
        self.text
    }

    /// One content event ended here.
    pub(crate) fn mark(&mut self) {
        if let Some(m) = self.marks.as_mut() {
            m.push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
        }
    }

    /// The text kept, concatenated in stream order.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Bytes of text seen beyond the limit and not kept.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.dropped == 0
    }

    /// Appends `s`, cut at a character boundary when the limit is reached; once cut, the
    /// text stays a prefix of the output and later pieces are only counted.
    pub fn push(&mut self, s: &str) {
        let room = if self.dropped > 0 {
            0
        } else {
            self.limit.saturating_sub(self.text.len())
        };
        if s.len() <= room {
            self.text.push_str(s);
            return;
        }
        let mut cut = room;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(s.get(..cut).unwrap_or_default());
        self.dropped += (s.len() - cut) as u64;
    }
}

/// Appends the text found at `paths` in the JSON document `json` to `buf`. A document that
/// does not parse adds what was read before the error; the classifier has already flagged
/// it, so nothing more is reported here.
pub(crate) fn collect(json: &[u8], paths: &[Path], buf: &mut TextBuf) {
    debug_assert!(paths.len() <= 32, "the path set is a u32 mask");
    let mask = if paths.len() >= 32 {
        u32::MAX
    } else {
        (1u32 << paths.len()) - 1
    };
    let mut de = serde_json::Deserializer::from_slice(json);
    let _ = Node {
        paths,
        mask,
        depth: 0,
        buf,
    }
    .deserialize(&mut de);
}

/// Appends a raw JSON value: a string unescaped, `null` as nothing, anything else verbatim.
fn append_raw(raw: &str, buf: &mut TextBuf) {
    let raw = raw.trim();
    if raw == "null" {
        return;
    }
    let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        buf.push(raw);
        return;
    };
    if !inner.contains('\\') {
        buf.push(inner);
        return;
    }
    let mut de = serde_json::Deserializer::from_str(raw);
    let _ = de::Deserializer::deserialize_str(&mut de, Append(buf));
}

/// One position in the document: the paths (as a bit mask) whose prefix matches it.
struct Node<'p, 'b> {
    paths: &'p [Path],
    mask: u32,
    depth: usize,
    buf: &'b mut TextBuf,
}

impl Node<'_, '_> {
    /// The indexes of the paths still matching here.
    fn selected(&self) -> impl Iterator<Item = usize> {
        let mut mask = self.mask;
        std::iter::from_fn(move || {
            (mask != 0).then(|| {
                let i = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                i
            })
        })
    }

    fn is_target(&self) -> bool {
        self.selected()
            .any(|i| self.paths.get(i).is_some_and(|p| p.len() == self.depth))
    }

    /// The mask of the child under `segment` (an object key, or `*` for an element).
    fn child_mask(&self, segment: &str) -> u32 {
        self.selected()
            .filter(|&i| {
                self.paths
                    .get(i)
                    .and_then(|p| p.get(self.depth))
                    .is_some_and(|s| *s == segment)
            })
            .fold(0, |mask, i| mask | 1 << i)
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.mask == 0 {
            <IgnoredAny as serde::Deserialize>::deserialize(d)?;
        } else if self.is_target() {
            let raw = <&RawValue as serde::Deserialize>::deserialize(d)?;
            append_raw(raw.get(), self.buf);
        } else {
            d.deserialize_any(self)?;
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let this = self;
        while let Some(mask) = map.next_key_seed(KeyMask(&this))? {
            let child = Node {
                paths: this.paths,
                mask,
                depth: this.depth + 1,
                buf: &mut *this.buf,
            };
            map.next_value_seed(child)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let this = self;
        let mask = this.child_mask("*");
        loop {
            let child = Node {
                paths: this.paths,
                mask,
                depth: this.depth + 1,
                buf: &mut *this.buf,
            };
            if seq.next_element_seed(child)?.is_none() {
                return Ok(());
            }
        }
    }

    // Scalars where an object or array was expected: nothing to collect.
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Reads an object key (borrowed or unescaped, never allocated) into the child's mask.
struct KeyMask<'n, 'p, 'b>(&'n Node<'p, 'b>);

impl<'de> DeserializeSeed<'de> for KeyMask<'_, '_, '_> {
    type Value = u32;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u32, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyMask<'_, '_, '_> {
    type Value = u32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<u32, E> {
        Ok(self.0.child_mask(key))
    }
}

/// Appends a JSON string, unescaped by serde, to the buffer.
struct Append<'b>(&'b mut TextBuf);

impl<'de> Visitor<'de> for Append<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.push(s);
        Ok(())
    }
}

/// Text paths of each dialect's streamed events and non-streaming bodies.
pub(crate) mod paths {
    use super::Path;

    pub(crate) const OPENAI_EVENT: &[Path] = &[
        &["choices", "*", "delta", "content"],
        &["choices", "*", "delta", "reasoning_content"],
        &["choices", "*", "delta", "reasoning"],
        &["choices", "*", "delta", "refusal"],
        &[
            "choices",
            "*",
            "delta",
            "tool_calls",
            "*",
            "function",
            "name",
        ],
        &[
            "choices",
            "*",
            "delta",
            "tool_calls",
            "*",
            "function",
            "arguments",
        ],
        &["choices", "*", "delta", "function_call", "name"],
        &["choices", "*", "delta", "function_call", "arguments"],
        &["choices", "*", "text"],
    ];
    pub(crate) const OPENAI_BODY: &[Path] = &[
        &["choices", "*", "message", "content"],
        &["choices", "*", "message", "reasoning_content"],
        &["choices", "*", "message", "reasoning"],
        &["choices", "*", "message", "refusal"],
        &[
            "choices",
            "*",
            "message",
            "tool_calls",
            "*",
            "function",
            "name",
        ],
        &[
            "choices",
            "*",
            "message",
            "tool_calls",
            "*",
            "function",
            "arguments",
        ],
        &["choices", "*", "message", "function_call", "name"],
        &["choices", "*", "message", "function_call", "arguments"],
        &["choices", "*", "text"],
    ];
    /// Only content-bearing events are walked, so every delta there is output.
    pub(crate) const RESPONSES_EVENT: &[Path] = &[&["delta"]];
    pub(crate) const RESPONSES_BODY: &[Path] = &[
        &["output", "*", "content", "*", "text"],
        &["output", "*", "content", "*", "refusal"],
        &["output", "*", "summary", "*", "text"],
        &["output", "*", "name"],
        &["output", "*", "arguments"],
        &["output", "*", "input"],
    ];
    pub(crate) const ANTHROPIC_EVENT: &[Path] = &[
        &["delta", "text"],
        &["delta", "thinking"],
        &["delta", "partial_json"],
        &["content_block", "text"],
        &["content_block", "thinking"],
        &["content_block", "name"],
    ];
    pub(crate) const ANTHROPIC_BODY: &[Path] = &[
        &["content", "*", "text"],
        &["content", "*", "thinking"],
        &["content", "*", "name"],
        &["content", "*", "input"],
    ];
    pub(crate) const TGI_EVENT: &[Path] = &[&["token", "text"]];
    pub(crate) const TGI_BODY: &[Path] = &[&["generated_text"]];
    pub(crate) const LLAMACPP: &[Path] = &[&["content"]];
    /// A body is one result, or an array of them when the request had several prompts.
    pub(crate) const LLAMACPP_BODY: &[Path] = &[&["content"], &["*", "content"]];
    pub(crate) const OLLAMA: &[Path] = &[
        &["message", "content"],
        &["message", "thinking"],
        &["message", "tool_calls", "*", "function", "name"],
        &["message", "tool_calls", "*", "function", "arguments"],
        &["response"],
        &["thinking"],
    ];
}

#[cfg(test)]
mod tests;
