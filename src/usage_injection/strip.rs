//! Removing the usage-only chunk (`"choices":[]` with a `usage` object) that usage
//! injection makes the upstream add, so the client receives exactly the bytes it would
//! have received without the proxy.
//!
//! The filter follows SSE event boundaries (blank lines; `\n`, `\r\n` and `\r` line ends)
//! incrementally, over any chunking. A frame made of whole events that are not the usage
//! chunk is passed on as the very same `Bytes` (no copy, no allocation). Only an event
//! that straddles frames is held back, and only while it could still be the usage chunk:
//! as soon as its `"choices"` array shows an element (or it grows past any usage chunk's
//! size) it is released and the rest of it flows through. An SSE client acts on an event
//! only once its blank line has arrived, so holding the start of an unfinished event never
//! delays what the client sees. Copies are made only for a straddling event and for the
//! frame the usage chunk is cut out of.

use std::borrow::Cow;

use bytes::Bytes;
use memchr::{memchr2, memmem};
use serde::Deserialize;
use serde_json::value::RawValue;

/// A usage-only chunk is a few hundred bytes; an unfinished event larger than this is not
/// one and is released.
pub(super) const MAX_USAGE_EVENT: usize = 16 << 10;

/// The per-response filter state.
#[derive(Debug, Default)]
pub struct UsageFilter {
    /// Bytes of the current, unfinished event, held while it may be the usage chunk.
    held: Vec<u8>,
    /// The current event is known not to be the usage chunk: its bytes pass through.
    passing: bool,
    /// The current line already has bytes (from an earlier frame).
    line_open: bool,
    /// The last frame ended in CR, so a leading LF belongs to that line end.
    pending_cr: bool,
    /// That CR ended an event (an LF after it starts nothing).
    cr_ended_event: bool,
    /// That CR ended the removed usage chunk: its LF is removed too.
    drop_lf: bool,
}

/// The bytes to forward from one frame, kept as a slice of it while contiguous.
enum Out {
    Nothing,
    Slice(usize, usize),
    Owned(Vec<u8>),
}

impl Out {
    fn keep(&mut self, data: &[u8], from: usize, to: usize) {
        if from == to {
            return;
        }
        match self {
            Out::Nothing => *self = Out::Slice(from, to),
            Out::Slice(_, b) if *b == from => *b = to,
            Out::Slice(a, b) => {
                let mut v = data.get(*a..*b).unwrap_or_default().to_vec();
                v.extend_from_slice(data.get(from..to).unwrap_or_default());
                *self = Out::Owned(v);
            }
            Out::Owned(v) => v.extend_from_slice(data.get(from..to).unwrap_or_default()),
        }
    }

    fn keep_bytes(&mut self, data: &[u8], bytes: &[u8]) {
        match self {
            Out::Nothing => *self = Out::Owned(bytes.to_vec()),
            Out::Slice(a, b) => {
                let mut v = data.get(*a..*b).unwrap_or_default().to_vec();
                v.extend_from_slice(bytes);
                *self = Out::Owned(v);
            }
            Out::Owned(v) => v.extend_from_slice(bytes),
        }
    }

    fn into_bytes(self, data: Bytes) -> Bytes {
        match self {
            Out::Nothing => Bytes::new(),
            Out::Slice(0, b) if b == data.len() => data,
            Out::Slice(a, b) => data.slice(a..b),
            Out::Owned(v) => Bytes::from(v),
        }
    }
}

impl UsageFilter {
    pub fn new() -> UsageFilter {
        UsageFilter::default()
    }

    /// Filters the next frame; the result may be empty (all of it held or removed).
    pub fn push(&mut self, data: Bytes) -> Bytes {
        // An empty frame (HTTP/2 allows them) changes nothing, not even a pending CR.
        if data.is_empty() {
            return data;
        }
        let bytes = &data[..];
        let mut out = Out::Nothing;
        let mut pos = 0;
        let mut region = 0;
        if std::mem::take(&mut self.pending_cr) && bytes.first() == Some(&b'\n') {
            pos = 1;
            if std::mem::take(&mut self.cr_ended_event) {
                if !self.drop_lf {
                    out.keep(bytes, 0, 1);
                }
                region = 1;
            }
        }
        self.drop_lf = false;
        self.cr_ended_event = false;
        while let Some(off) = bytes
            .get(pos..)
            .and_then(|rest| memchr2(b'\n', b'\r', rest))
        {
            let end = pos + off;
            let blank = !self.line_open && end == pos;
            let mut next = end + 1;
            let mut cr_at_end = false;
            if bytes.get(end) == Some(&b'\r') {
                match bytes.get(end + 1) {
                    Some(b'\n') => next = end + 2,
                    None => cr_at_end = true,
                    Some(_) => {}
                }
            }
            self.line_open = false;
            pos = next;
            if cr_at_end {
                self.pending_cr = true;
                self.cr_ended_event = blank;
            }
            if blank {
                let removed = self.end_event(bytes, region, next, &mut out);
                self.drop_lf = removed && cr_at_end;
                region = next;
            }
        }
        if pos < bytes.len() {
            self.line_open = true;
        }
        if region < bytes.len() {
            self.partial(bytes, region, &mut out);
        }
        out.into_bytes(data)
    }

    /// The stream ended: whatever is held goes out unchanged (an unfinished event is the
    /// upstream's to send; the client's parser discards it as it would have).
    pub fn finish(&mut self) -> Bytes {
        self.passing = false;
        Bytes::from(std::mem::take(&mut self.held))
    }

    /// Whether bytes are held back.
    pub fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// An event ends at `to`; returns whether it was the usage chunk (and removed).
    fn end_event(&mut self, bytes: &[u8], from: usize, to: usize, out: &mut Out) -> bool {
        if std::mem::take(&mut self.passing) {
            out.keep(bytes, from, to);
            return false;
        }
        let tail = bytes.get(from..to).unwrap_or_default();
        if self.held.is_empty() {
            if is_usage_only(tail) {
                return true;
            }
            out.keep(bytes, from, to);
            return false;
        }
        self.held.extend_from_slice(tail);
        let removed = is_usage_only(&self.held);
        if !removed {
            out.keep_bytes(bytes, &self.held);
        }
        self.held.clear();
        removed
    }

    /// The current event continues past this frame from `from`.
    fn partial(&mut self, bytes: &[u8], from: usize, out: &mut Out) {
        if self.passing {
            out.keep(bytes, from, bytes.len());
            return;
        }
        let tail = bytes.get(from..).unwrap_or_default();
        let decided = if self.held.is_empty() {
            !could_be_usage(tail)
        } else {
            self.held.extend_from_slice(tail);
            !could_be_usage(&self.held)
        };
        if !decided {
            if self.held.is_empty() {
                self.held.extend_from_slice(tail);
            }
            return;
        }
        self.passing = true;
        if self.held.is_empty() {
            out.keep(bytes, from, bytes.len());
        } else {
            out.keep_bytes(bytes, &self.held);
            self.held.clear();
        }
    }
}

/// Whether a complete event is a usage-only chunk: at most [`MAX_USAGE_EVENT`] bytes, a
/// `data:` JSON object whose `choices` is an empty array and whose `usage` is an object.
/// The size and the first `"choices"` of the data are judged as [`could_be_usage`] judges
/// an unfinished event, so the verdict is the same however the event was chunked.
fn is_usage_only(event: &[u8]) -> bool {
    if event.len() > MAX_USAGE_EVENT || memmem::find(event, b"\"usage\"").is_none() {
        return false;
    }
    let data = data_of(event);
    if first_choices_empty(&data) != Some(true) {
        return false;
    }
    let Ok(wire) = serde_json::from_slice::<Wire<'_>>(data.trim_ascii()) else {
        return false;
    };
    let empty_choices = wire.choices.is_some_and(|c| {
        let c = c.get();
        c.starts_with('[') && c.get(1..c.len() - 1).is_some_and(|s| s.trim().is_empty())
    });
    empty_choices && wire.usage.is_some_and(|u| u.get().starts_with('{'))
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    choices: Option<&'a RawValue>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

/// Whether an unfinished event may still turn out to be the usage chunk. Its data lines so
/// far are a prefix of the finished event's, so what is decided here stays decided.
fn could_be_usage(start: &[u8]) -> bool {
    start.len() <= MAX_USAGE_EVENT && first_choices_empty(&data_of(start)) != Some(false)
}

/// Whether the first `"choices"` in the data is followed by an empty array: `None` while
/// the data so far does not tell.
fn first_choices_empty(data: &[u8]) -> Option<bool> {
    let at = memmem::find(data, b"\"choices\"")?;
    let rest = data.get(at + 9..).unwrap_or_default().trim_ascii_start();
    let rest = match rest.split_first() {
        None => return None,
        Some((b':', after)) => after.trim_ascii_start(),
        Some(_) => return Some(false),
    };
    let rest = match rest.split_first() {
        None => return None,
        Some((b'[', after)) => after.trim_ascii_start(),
        Some(_) => return Some(false),
    };
    rest.first().map(|&b| b == b']')
}

/// The event's `data:` lines joined with `\n` (borrowed when there is one).
fn data_of(event: &[u8]) -> Cow<'_, [u8]> {
    let mut found: Option<Cow<'_, [u8]>> = None;
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        let Some(value) = line.strip_prefix(b"data:") else {
            continue;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        found = Some(match found {
            None => Cow::Borrowed(value),
            Some(prev) => {
                let mut joined = prev.into_owned();
                joined.push(b'\n');
                joined.extend_from_slice(value);
                Cow::Owned(joined)
            }
        });
    }
    found.unwrap_or_default()
}
