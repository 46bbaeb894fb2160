//! Recognising the next chunk of a stream by the bytes around its text.
//!
//! The chunks of one stream differ in little but their text: the same `id`, `object`,
//! `created`, `model`, the same choice, the same nulls. [`ChunkTemplate`] keeps the last
//! chunk whose only text was one plain string. A chunk that starts and ends with the same
//! bytes around a plain, non-empty string in between is the same JSON with another string
//! value, so it classifies the same: two comparisons and one scan instead of a parse.
//!
//! Why that is exact: the string's bytes hold no `"`, `\` or control character, so the
//! string token ends where the template's did and every other token is unchanged; the
//! classification reads that string only for "non-empty, no escapes", true of both.

use std::ops::Range;

use super::{EventText, classify_chunk_text, scan::special_at};
use crate::decode::EventInfo;

/// The last chunk of a stream whose only text was one plain string (see the module doc).
#[derive(Debug, Default)]
pub struct ChunkTemplate {
    /// The chunk, trimmed; empty until a chunk qualifies.
    raw: Vec<u8>,
    /// Where its text is in `raw`.
    text: Range<usize>,
    info: EventInfo,
}

impl ChunkTemplate {
    /// [`classify_chunk_text`], through the template when the chunk fits it.
    pub fn classify<'a>(
        &mut self,
        data: &'a [u8],
    ) -> Result<(EventInfo, EventText<'a>), serde_json::Error> {
        let trimmed = data.trim_ascii();
        if let Some(text) = self.fit(trimmed) {
            return Ok((self.info, EventText::One(text)));
        }
        let (info, text) = classify_chunk_text(trimmed)?;
        self.learn(trimmed, info, text);
        Ok((info, text))
    }

    /// The text of `data` if it is the template with another plain, non-empty string.
    pub(super) fn fit<'a>(&self, data: &'a [u8]) -> Option<&'a str> {
        if self.raw.is_empty() {
            return None;
        }
        let prefix = self.raw.get(..self.text.start)?;
        let suffix = self.raw.get(self.text.end..)?;
        let end = data.len().checked_sub(suffix.len())?;
        if end <= prefix.len() || !data.starts_with(prefix) || !data.ends_with(suffix) {
            return None;
        }
        let text = data.get(prefix.len()..end)?;
        if special_at(text).is_some() {
            return None;
        }
        std::str::from_utf8(text).ok()
    }

    /// Keeps `data` as the template if its only text was one plain string without usage;
    /// otherwise the template stays as it was.
    fn learn(&mut self, data: &[u8], info: EventInfo, text: EventText<'_>) {
        let EventText::One(text) = text else {
            return;
        };
        if info.usage.is_some() || text.is_empty() {
            return;
        }
        // The text is borrowed from `data`; where exactly is the distance of the pointers.
        let start = (text.as_ptr() as usize).wrapping_sub(data.as_ptr() as usize);
        let Some(end) = start
            .checked_add(text.len())
            .filter(|&end| end <= data.len())
        else {
            return;
        };
        self.raw.clear();
        self.raw.extend_from_slice(data);
        self.text = start..end;
        self.info = info;
    }
}

/// Whether a template fed the lines of `data` in order (`data:` stripped) agrees with
/// [`classify_chunk_text`] on every one: for the fuzz target `openai_scan` and the tests.
pub(super) fn agrees(data: &[u8]) -> bool {
    let mut template = ChunkTemplate::default();
    data.split(|&b| b == b'\n').all(|line| {
        let chunk = line.strip_prefix(b"data:").unwrap_or(line);
        match (template.classify(chunk), classify_chunk_text(chunk)) {
            (Ok(fast), Ok(slow)) => fast == slow,
            (Err(_), Err(_)) => true,
            _ => false,
        }
    })
}
