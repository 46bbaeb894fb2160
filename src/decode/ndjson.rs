//! Incremental framing of newline-delimited JSON bodies (`application/x-ndjson`, as Ollama
//! streams) into lines.
//!
//! A record ends at `\n`; a `\r` before it is dropped so `\r\n` works too; blank lines are
//! not records. Lines are reported whatever the chunking, which is what makes per-line
//! timestamps trustworthy; the Ollama decoder sits on top of it.
//!
//! Like [`crate::decode::sse`] this runs for every chunk of every streamed response, so once
//! its buffer has grown to the stream's line size it does not allocate: lines wholly inside
//! a chunk are reported in place, and only a line split across chunks is copied into the
//! carry-over buffer.

use memchr::memchr;

/// Default cap on one line; see [`NdjsonFramer::with_max_line_bytes`]. Ollama's last
/// `/api/generate` line carries the whole `context` token array, so it can be large.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// Incremental NDJSON line splitter; feed it chunks with [`NdjsonFramer::push`].
#[derive(Debug)]
pub struct NdjsonFramer {
    /// Start of a line that has not seen its `\n` yet.
    line: Vec<u8>,
    /// The current line outgrew the cap; drop bytes until its `\n`.
    discarding_line: bool,
    overflowed: bool,
    max_line_bytes: usize,
}

impl Default for NdjsonFramer {
    fn default() -> Self {
        Self::new()
    }
}

impl NdjsonFramer {
    pub fn new() -> Self {
        Self::with_max_line_bytes(DEFAULT_MAX_LINE_BYTES)
    }

    /// Caps the memory one stream can pin: a line longer than `max` is dropped (and
    /// [`NdjsonFramer::overflowed`] set) instead of buffered without bound.
    pub fn with_max_line_bytes(max: usize) -> Self {
        NdjsonFramer {
            line: Vec::new(),
            discarding_line: false,
            overflowed: false,
            max_line_bytes: max,
        }
    }

    /// Feeds the next chunk, calling `on_line` for every non-blank line it completes, without
    /// its line end.
    pub fn push(&mut self, chunk: &[u8], mut on_line: impl FnMut(&[u8])) {
        let mut rest = chunk;
        while let Some(pos) = memchr(b'\n', rest) {
            let (line, tail) = rest.split_at(pos);
            self.end_line(line, &mut on_line);
            rest = tail.get(1..).unwrap_or_default();
        }
        self.carry(rest);
    }

    /// Ends the stream, reporting a last line that has no `\n` (JSON Lines allows that; a
    /// line torn by a cut stream is reported too, and fails to parse upstairs). The framer
    /// is then ready for a new stream (the buffer keeps its capacity);
    /// [`NdjsonFramer::overflowed`] stays set.
    pub fn finish(&mut self, mut on_line: impl FnMut(&[u8])) {
        if !self.discarding_line {
            emit(&self.line, &mut on_line);
        }
        self.line.clear();
        self.discarding_line = false;
    }

    /// Whether some line exceeded the size cap and was dropped.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn end_line(&mut self, tail: &[u8], on_line: &mut impl FnMut(&[u8])) {
        if self.discarding_line {
            self.discarding_line = false;
        } else if self.line.len() + tail.len() > self.max_line_bytes {
            // Checked for in-place lines too, so that whether a long line is dropped does not
            // depend on where the chunks were cut.
            self.line.clear();
            self.overflowed = true;
        } else if self.line.is_empty() {
            emit(tail, on_line);
        } else {
            self.line.extend_from_slice(tail);
            emit(&self.line, on_line);
            self.line.clear();
        }
    }

    fn carry(&mut self, partial: &[u8]) {
        if partial.is_empty() || self.discarding_line {
            return;
        }
        if self.line.len() + partial.len() > self.max_line_bytes {
            self.line.clear();
            self.discarding_line = true;
            self.overflowed = true;
        } else {
            self.line.extend_from_slice(partial);
        }
    }
}

fn emit(line: &[u8], on_line: &mut impl FnMut(&[u8])) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if !line.trim_ascii().is_empty() {
        on_line(line);
    }
}

#[cfg(test)]
mod tests;
