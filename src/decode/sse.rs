//! Incremental framing of `text/event-stream` bodies into events.
//!
//! Implements the WHATWG event-stream interpretation
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>)
//! over arbitrarily split chunks: the same bytes give the same events whatever the chunking,
//! which is what makes per-event timestamps trustworthy. Dialect decoders sit on top of it.
//!
//! This runs for every chunk of every streamed response, so once its buffers have grown to
//! the stream's line and event sizes it does not allocate: lines wholly inside a chunk are
//! parsed in place, and only a line split across chunks is copied into the carry-over buffer.
//! The usual event, one `data:` line and a blank line within one chunk, is dispatched from
//! the chunk itself; other events gather their data in the event buffer.

use memchr::{memchr, memchr2};

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Default cap on one line or one event's data; see [`SseFramer::with_max_event_bytes`].
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 << 20;

/// One dispatched event, borrowed from the framer's buffers until the callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field, or `"message"` when absent or empty (as browsers do).
    pub event: &'a str,
    /// The `data:` lines joined with `\n`; raw bytes, not necessarily UTF-8.
    pub data: &'a [u8],
}

/// Incremental event-stream parser; feed it chunks with [`SseFramer::push`].
#[derive(Debug)]
pub struct SseFramer {
    /// Start of a line that has not seen its line end yet.
    line: Vec<u8>,
    event: EventBuilder,
    /// `Some(n)` while still at the stream start, having matched `n` bytes of a BOM.
    bom_matched: Option<usize>,
    /// The previous chunk ended in CR: an LF opening the next chunk belongs to that line end.
    pending_cr: bool,
    /// The current line outgrew the cap; drop bytes until its line end.
    discarding_line: bool,
    max_event_bytes: usize,
}

#[derive(Debug, Default)]
struct EventBuilder {
    /// Every `data:` value followed by `\n`; the last `\n` is dropped at dispatch.
    data: Vec<u8>,
    event_type: String,
    /// Part of this event was dropped for size, so it must not be dispatched.
    poisoned: bool,
    overflowed: bool,
}

impl Default for SseFramer {
    fn default() -> Self {
        Self::new()
    }
}

impl SseFramer {
    pub fn new() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// Caps the memory one stream can pin: a line or an event's data longer than `max` is
    /// dropped (and [`SseFramer::overflowed`] set) instead of buffered without bound.
    pub fn with_max_event_bytes(max: usize) -> Self {
        SseFramer {
            line: Vec::new(),
            event: EventBuilder::default(),
            bom_matched: Some(0),
            pending_cr: false,
            discarding_line: false,
            max_event_bytes: max,
        }
    }

    /// Feeds the next chunk, calling `on_event` for every event it completes.
    pub fn push(&mut self, chunk: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        let mut chunk = chunk;
        if let Some(mut matched) = self.bom_matched {
            let mut taken = 0;
            while let (Some(&want), Some(&got)) = (BOM.get(matched), chunk.get(taken)) {
                if want != got {
                    break;
                }
                matched += 1;
                taken += 1;
            }
            chunk = chunk.get(taken..).unwrap_or_default();
            if matched == BOM.len() {
                self.bom_matched = None;
            } else if chunk.is_empty() {
                // Still a BOM prefix; the next chunk decides.
                self.bom_matched = Some(matched);
                return;
            } else {
                // Not a BOM after all: the bytes held back are ordinary line bytes.
                self.bom_matched = None;
                self.scan(BOM.get(..matched).unwrap_or_default(), &mut on_event);
            }
        }
        self.scan(chunk, &mut on_event);
    }

    /// Ends the stream. Per the spec an event not closed by a blank line is discarded;
    /// returns whether anything was. The framer is then ready for a new stream (buffers keep
    /// their capacity); [`SseFramer::overflowed`] stays set.
    pub fn finish(&mut self) -> bool {
        let discarded = !self.line.is_empty() || self.discarding_line || self.event.pending();
        self.line.clear();
        self.event.reset();
        self.bom_matched = Some(0);
        self.pending_cr = false;
        self.discarding_line = false;
        discarded
    }

    /// Whether some line or event exceeded the size cap and was dropped.
    pub fn overflowed(&self) -> bool {
        self.event.overflowed
    }

    fn scan(&mut self, chunk: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
        let mut rest = chunk;
        if self.pending_cr && !rest.is_empty() {
            self.pending_cr = false;
            if let Some(after_lf) = rest.strip_prefix(b"\n") {
                rest = after_lf;
            }
        }
        while let Some(pos) = memchr2(b'\n', b'\r', rest) {
            let (line, tail) = rest.split_at(pos);
            let after = self.skip_line_end(tail);
            if let Some(after_blank) = self.single_data_line(line, after, on_event) {
                rest = after_blank;
                continue;
            }
            self.end_line(line, on_event);
            rest = after;
        }
        self.carry(rest);
    }

    /// What follows the line end `tail` starts with (CR, LF or CRLF); a CR ending the chunk
    /// leaves an LF opening the next chunk to be skipped.
    fn skip_line_end<'a>(&mut self, tail: &'a [u8]) -> &'a [u8] {
        let (terminator, after) = tail.split_at(1);
        if terminator != b"\r" {
            return after;
        }
        match after.strip_prefix(b"\n") {
            Some(after_lf) => after_lf,
            None => {
                if after.is_empty() {
                    self.pending_cr = true;
                }
                after
            }
        }
    }

    /// The usual event, one `data:` line and a blank line, both whole in this chunk and
    /// with nothing pending: dispatched from the chunk itself, without copying its data into
    /// the event buffer. Returns what follows the blank line, or `None` (and changes
    /// nothing) when the line is anything else, to go the general way.
    fn single_data_line<'a>(
        &mut self,
        line: &[u8],
        after: &'a [u8],
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) -> Option<&'a [u8]> {
        let value = line.strip_prefix(b"data:")?;
        if !self.line.is_empty()
            || self.discarding_line
            || self.event.pending()
            || line.len() > self.max_event_bytes
            || !matches!(after.first(), Some(b'\n' | b'\r'))
        {
            return None;
        }
        let value = value.strip_prefix(b" ").unwrap_or(value);
        on_event(SseEvent {
            event: "message",
            data: value,
        });
        Some(self.skip_line_end(after))
    }

    fn end_line(&mut self, tail: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
        if self.discarding_line {
            self.discarding_line = false;
            self.event.poisoned = true;
        } else if self.line.len() + tail.len() > self.max_event_bytes {
            // Checked for in-place lines too, so that whether a long line is dropped does not
            // depend on where the chunks were cut.
            self.line.clear();
            self.event.poison();
        } else if self.line.is_empty() {
            self.event.line(tail, self.max_event_bytes, on_event);
        } else {
            self.line.extend_from_slice(tail);
            self.event.line(&self.line, self.max_event_bytes, on_event);
            self.line.clear();
        }
    }

    fn carry(&mut self, partial: &[u8]) {
        if partial.is_empty() || self.discarding_line {
            return;
        }
        if self.line.len() + partial.len() > self.max_event_bytes {
            self.line.clear();
            self.discarding_line = true;
            self.event.overflowed = true;
        } else {
            self.line.extend_from_slice(partial);
        }
    }
}

impl EventBuilder {
    fn line(&mut self, line: &[u8], max: usize, on_event: &mut impl FnMut(SseEvent<'_>)) {
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line.starts_with(b":") {
            return;
        }
        let (name, value) = match memchr(b':', line) {
            Some(colon) => {
                let (name, value) = line.split_at(colon);
                let value = value.get(1..).unwrap_or_default();
                (name, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match name {
            b"data" => {
                if self.poisoned {
                    return;
                }
                if self.data.len() + value.len() + 1 > max {
                    self.poison();
                    return;
                }
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => {
                self.event_type.clear();
                self.event_type.push_str(&String::from_utf8_lossy(value));
            }
            // `id` and `retry` only matter to a reconnecting browser; nothing to time here.
            _ => {}
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(SseEvent<'_>)) {
        if !self.poisoned && !self.data.is_empty() {
            let data = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
            let event = match self.event_type.as_str() {
                "" => "message",
                other => other,
            };
            on_event(SseEvent { event, data });
        }
        self.reset();
    }

    fn poison(&mut self) {
        self.poisoned = true;
        self.overflowed = true;
        self.data.clear();
    }

    fn pending(&self) -> bool {
        self.poisoned || !self.data.is_empty() || !self.event_type.is_empty()
    }

    fn reset(&mut self) {
        self.data.clear();
        self.event_type.clear();
        self.poisoned = false;
    }
}

#[cfg(test)]
mod tests;
