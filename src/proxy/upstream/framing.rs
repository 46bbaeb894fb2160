//! A strict, incremental observer of an HTTP/1.1 response body's framing, for a response
//! path that relays the upstream's bytes as they were read (chunk framing included)
//! instead of decoding and encoding them again.
//!
//! The relay hands every read to [`Framing::feed`] before forwarding it. The observer
//! says how many of those bytes belong to the body (any after its end are not the body's),
//! where the payload lies within them (the measurement tap reads that, never the framing),
//! and whether the body ended. On bytes that break the framing it stops with a
//! [`Violation`] at the first bad byte: everything before it is a prefix of a well-framed
//! body, so the relay forwards that prefix and then closes the client connection. A client
//! never receives framing the observer did not accept, so a malformed upstream cannot
//! desynchronise the client connection.
//!
//! The grammar and limits are hyper's (its HTTP/1 decoder, `proto/h1/decode.rs`): the same
//! chunk-size line (hex digits, then optional spaces or tabs, then `;` and an extension
//! without a bare LF), 16 KiB of chunk extensions per body, trailers of at most 16 KiB and
//! 100 fields that must parse as header fields. A differential test runs both over the
//! same byte streams; fuzz target `framing` checks that any cutting of the bytes into
//! reads gives the same result.

use std::ops::Range;

/// How the response delimits its body (RFC 9112, section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delimiter {
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// `Content-Length`.
    Length(u64),
    /// Neither: the body runs until the upstream closes the connection.
    Close,
}

/// Why the bytes are not a well-framed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A chunk-size line without a hex size, or with another byte where a digit, space,
    /// `;` or CR may be.
    ChunkSize,
    /// A chunk size beyond 64 bits.
    ChunkSizeOverflow,
    /// A bare LF in a chunk extension.
    ChunkExtension,
    /// More than 16 KiB of chunk extensions in the body.
    ChunkExtensionsTooLong,
    /// CR not followed by LF at the end of a chunk-size line or of the last chunk.
    ChunkLineEnd,
    /// Chunk data not followed by CRLF.
    ChunkDataEnd,
    /// Trailers over the limits, or fields that do not parse.
    Trailers,
    /// The upstream closed the connection before the body's end.
    Truncated,
}

impl Violation {
    pub fn as_str(self) -> &'static str {
        match self {
            Violation::ChunkSize => "chunk_size",
            Violation::ChunkSizeOverflow => "chunk_size_overflow",
            Violation::ChunkExtension => "chunk_extension",
            Violation::ChunkExtensionsTooLong => "chunk_extensions_too_long",
            Violation::ChunkLineEnd => "chunk_line_end",
            Violation::ChunkDataEnd => "chunk_data_end",
            Violation::Trailers => "trailers",
            Violation::Truncated => "truncated",
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for Violation {}

/// A violation found in a read: the bytes before `at` were a well-framed prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken {
    pub at: usize,
    pub violation: Violation,
}

/// What one read was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Bytes of the read that belong to the body; any after them came after its end.
    pub used: usize,
    /// The body ended within them.
    pub done: bool,
}

/// Chunk extensions allowed per body (hyper's `CHUNKED_EXTENSIONS_LIMIT`).
const EXTENSIONS_LIMIT: u64 = 16 * 1024;
/// Trailer bytes allowed (hyper's `TRAILER_LIMIT`).
const TRAILER_BYTES: usize = 16 * 1024;
/// Trailer fields allowed (hyper's `DEFAULT_MAX_HEADERS`).
const TRAILER_FIELDS: usize = 100;

/// Where a chunked body's parse stands; the names are hyper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
    End,
}

/// The observer of one response body.
#[derive(Debug)]
pub struct Framing {
    delimiter: Delimiter,
    state: Chunk,
    /// The size being read, then what is left of the chunk's data; for `Length`, what is
    /// left of the body.
    remaining: u64,
    extensions: u64,
    /// The trailer section as read, once one began (rare: kept to check it whole).
    trailers: Option<Vec<u8>>,
    trailer_fields: usize,
    done: bool,
    broken: Option<Violation>,
}

impl Framing {
    pub fn new(delimiter: Delimiter) -> Framing {
        let (remaining, done) = match delimiter {
            Delimiter::Length(n) => (n, n == 0),
            Delimiter::Chunked | Delimiter::Close => (0, false),
        };
        Framing {
            delimiter,
            state: Chunk::Start,
            remaining,
            extensions: 0,
            trailers: None,
            trailer_fields: 0,
            done,
            broken: None,
        }
    }

    /// The body has ended (a violation is not an end).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Reads `bytes`, the next the upstream sent; `payload` is given the range of every
    /// run of body payload within them, in order. After a violation or the end, nothing
    /// more is read.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        mut payload: impl FnMut(Range<usize>),
    ) -> Result<Fed, Broken> {
        if let Some(violation) = self.broken {
            return Err(Broken { at: 0, violation });
        }
        if self.done {
            return Ok(Fed {
                used: 0,
                done: true,
            });
        }
        let result = match self.delimiter {
            Delimiter::Close => {
                if !bytes.is_empty() {
                    payload(0..bytes.len());
                }
                Ok(bytes.len())
            }
            Delimiter::Length(_) => {
                let used =
                    usize::try_from(self.remaining).map_or(bytes.len(), |r| r.min(bytes.len()));
                if used > 0 {
                    payload(0..used);
                }
                self.remaining -= used as u64;
                self.done = self.remaining == 0;
                Ok(used)
            }
            Delimiter::Chunked => self.chunked(bytes, &mut payload),
        };
        match result {
            Ok(used) => Ok(Fed {
                used,
                done: self.done,
            }),
            Err(broken) => {
                self.broken = Some(broken.violation);
                Err(broken)
            }
        }
    }

    /// The upstream closed its side: the end of a close-delimited body, a violation for
    /// any other that had not ended.
    pub fn eof(&mut self) -> Result<(), Violation> {
        if let Some(violation) = self.broken {
            return Err(violation);
        }
        if self.done {
            return Ok(());
        }
        if self.delimiter == Delimiter::Close {
            self.done = true;
            return Ok(());
        }
        self.broken = Some(Violation::Truncated);
        Err(Violation::Truncated)
    }

    fn chunked(
        &mut self,
        bytes: &[u8],
        payload: &mut impl FnMut(Range<usize>),
    ) -> Result<usize, Broken> {
        let mut i = 0;
        while i < bytes.len() && self.state != Chunk::End {
            if self.state == Chunk::Data {
                let take = usize::try_from(self.remaining)
                    .map_or(bytes.len() - i, |r| r.min(bytes.len() - i));
                payload(i..i + take);
                i += take;
                self.remaining -= take as u64;
                if self.remaining == 0 {
                    self.state = Chunk::DataCr;
                }
                continue;
            }
            self.state = self
                .step(bytes[i])
                .map_err(|violation| Broken { at: i, violation })?;
            i += 1;
        }
        if self.state == Chunk::End {
            if let Some(trailers) = self.trailers.take()
                && !trailers_parse(&trailers, self.trailer_fields)
            {
                // The section is only known bad at its last byte.
                return Err(Broken {
                    at: i - 1,
                    violation: Violation::Trailers,
                });
            }
            self.done = true;
        }
        Ok(i)
    }

    /// One byte of the chunked framing outside a chunk's data.
    fn step(&mut self, b: u8) -> Result<Chunk, Violation> {
        match self.state {
            Chunk::Start => {
                self.remaining = 0;
                self.size_digit(b).ok_or(Violation::ChunkSize)??;
                Ok(Chunk::Size)
            }
            Chunk::Size => match self.size_digit(b) {
                Some(digit) => digit.map(|()| Chunk::Size),
                None => after_size(b),
            },
            Chunk::SizeLws => after_size(b),
            Chunk::Extension => match b {
                b'\r' => Ok(Chunk::SizeLf),
                b'\n' => Err(Violation::ChunkExtension),
                _ => {
                    self.extensions += 1;
                    if self.extensions >= EXTENSIONS_LIMIT {
                        Err(Violation::ChunkExtensionsTooLong)
                    } else {
                        Ok(Chunk::Extension)
                    }
                }
            },
            Chunk::SizeLf => match (b, self.remaining) {
                (b'\n', 0) => Ok(Chunk::EndCr),
                (b'\n', _) => Ok(Chunk::Data),
                _ => Err(Violation::ChunkLineEnd),
            },
            Chunk::DataCr => (b == b'\r')
                .then_some(Chunk::DataLf)
                .ok_or(Violation::ChunkDataEnd),
            Chunk::DataLf => (b == b'\n')
                .then_some(Chunk::Start)
                .ok_or(Violation::ChunkDataEnd),
            Chunk::EndCr => {
                if b == b'\r' {
                    self.keep_trailer_byte(b, false)?;
                    Ok(Chunk::EndLf)
                } else {
                    self.keep_trailer_byte(b, true)?;
                    Ok(Chunk::Trailer)
                }
            }
            Chunk::EndLf => {
                if b != b'\n' {
                    return Err(Violation::ChunkLineEnd);
                }
                self.keep_trailer_byte(b, false)?;
                Ok(Chunk::End)
            }
            Chunk::Trailer => {
                self.keep_trailer_byte(b, false)?;
                Ok(if b == b'\r' {
                    Chunk::TrailerLf
                } else {
                    Chunk::Trailer
                })
            }
            Chunk::TrailerLf => {
                if b != b'\n' || self.trailer_fields >= TRAILER_FIELDS {
                    return Err(Violation::Trailers);
                }
                self.trailer_fields += 1;
                self.keep_trailer_byte(b, false)?;
                Ok(Chunk::EndCr)
            }
            // Never stepped: data is taken in runs, the end reads nothing.
            Chunk::Data | Chunk::End => Err(Violation::ChunkSize),
        }
    }

    /// `None` if `b` is no hex digit; else the size with it added, or an overflow.
    fn size_digit(&mut self, b: u8) -> Option<Result<(), Violation>> {
        let digit = char::from(b).to_digit(16)?;
        Some(
            self.remaining
                .checked_mul(16)
                .and_then(|n| n.checked_add(u64::from(digit)))
                .map(|n| self.remaining = n)
                .ok_or(Violation::ChunkSizeOverflow),
        )
    }

    /// A byte of the trailer section, kept once the section began (`begin`: its first
    /// byte, which begins it); at the limit, a violation.
    fn keep_trailer_byte(&mut self, b: u8, begin: bool) -> Result<(), Violation> {
        let buf = match (&mut self.trailers, begin) {
            (Some(buf), _) => buf,
            (None, true) => {
                // hyper starts the section without checking its first byte.
                self.trailers = Some(vec![b]);
                return Ok(());
            }
            (None, false) => return Ok(()),
        };
        buf.push(b);
        if buf.len() >= TRAILER_BYTES {
            return Err(Violation::Trailers);
        }
        Ok(())
    }
}

/// After the size's digits: optional spaces or tabs, an extension, or the line's end.
fn after_size(b: u8) -> Result<Chunk, Violation> {
    match b {
        b'\t' | b' ' => Ok(Chunk::SizeLws),
        b';' => Ok(Chunk::Extension),
        b'\r' => Ok(Chunk::SizeLf),
        _ => Err(Violation::ChunkSize),
    }
}

/// Whether a trailer section of `fields` lines parses as header fields, as hyper requires.
fn trailers_parse(section: &[u8], fields: usize) -> bool {
    let mut headers = vec![httparse::EMPTY_HEADER; fields];
    match httparse::parse_headers(section, &mut headers) {
        Ok(httparse::Status::Complete((_, parsed))) => parsed.iter().all(|h| {
            http::HeaderName::from_bytes(h.name.as_bytes()).is_ok()
                && http::HeaderValue::from_bytes(h.value).is_ok()
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
