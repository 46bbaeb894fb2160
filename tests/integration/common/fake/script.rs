//! What the fake upstream answers: scripts of steps, write plans, and the bytes of chunked bodies and OpenAI chat events.

use super::*;

/// What the server does after it has received a request, step by step.
///
/// If every step runs (no [`Step::Reset`], [`Step::Close`] or [`Step::Stall`]), the
/// connection stays open for the next request, unless the
/// request asked for `Connection: close`. The script is not checked against HTTP: a response
/// whose framing is wrong or incomplete is exactly what some tests want.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// The steps, run in order.
    pub steps: Vec<Step>,
}

/// One thing the server does while answering a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write these bytes exactly, in one `write_all`, then flush. If the peer is already
    /// gone (or the write fails) the close is recorded and the script ends.
    Write(Bytes),
    /// Wait this long (watching for the peer going away meanwhile).
    Pause(Duration),
    /// Abort the connection with an RST: `SO_LINGER` 0, then drop the socket.
    Reset,
    /// Orderly close: shut down the write side (FIN), then drop the socket.
    Close,
    /// Never answer further; keep the socket open until the peer closes it, and record that.
    Stall,
    /// Wait until the test calls [`FakeUpstream::release`] (watching for the peer going
    /// away meanwhile): what follows happens when the test says, e.g. once the connection
    /// idles in the proxy's pool.
    Hold,
    /// Only as a script's first step: the script runs as soon as the request head has
    /// arrived, the body left unread (the upstream answers early), and the connection
    /// closes after the script. The request is recorded with an empty body.
    Early,
}

/// How [`Script::sse_chunked`] cuts the event bytes into HTTP chunks (one write each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WritePlan {
    /// One chunk per event.
    Whole,
    /// Every byte its own chunk and its own write: maximal fragmentation.
    Bytes1,
    /// Cut the concatenated events at these byte offsets (sorted and deduplicated here;
    /// offsets at 0 or past the end add nothing): events split across chunk boundaries.
    SplitAt(Vec<usize>),
    /// This many events per chunk (0 counts as 1); the last chunk may hold fewer.
    Coalesced(usize),
}

impl Script {
    /// A script of these steps.
    pub fn new(steps: Vec<Step>) -> Script {
        Script { steps }
    }

    /// This script with `step` appended.
    pub fn then(mut self, step: Step) -> Script {
        self.steps.push(step);
        self
    }

    /// This script with a [`Step::Pause`] of `delay` first: a slow first byte.
    pub fn delayed(mut self, delay: Duration) -> Script {
        self.steps.insert(0, Step::Pause(delay));
        self
    }

    /// A complete response in one write: status line, `headers` in order, then
    /// `content-length` (left out if `headers` already has `content-length` or
    /// `transfer-encoding`, or the status is 1xx or 204), the empty line and `body`.
    pub fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Script {
        let mut out = format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status)).into_bytes();
        let mut framed = (100..200).contains(&status) || status == 204;
        for (name, value) in headers {
            framed |= name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding");
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if !framed {
            out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        Script::new(vec![Step::Write(Bytes::from(out))])
    }

    /// A chunked SSE response: [`SSE_HEAD`] (`200 OK`, `content-type: text/event-stream`,
    /// `transfer-encoding: chunked`), the concatenated `events` as chunks cut by `write_plan`,
    /// then [`LAST_CHUNK`]. Each of these is its own write; `gap` is slept before every write
    /// after the head (nothing is slept when `gap` is zero). Empty pieces are skipped, since
    /// an empty chunk would end the body.
    pub fn sse_chunked(
        events: &[impl AsRef<[u8]>],
        write_plan: WritePlan,
        gap: Duration,
    ) -> Script {
        let mut steps = vec![Step::Write(Bytes::from_static(SSE_HEAD))];
        let chunks = plan_pieces(events, &write_plan)
            .into_iter()
            .map(|piece| http_chunk(&piece))
            .chain([Bytes::from_static(LAST_CHUNK)]);
        for chunk in chunks {
            if !gap.is_zero() {
                steps.push(Step::Pause(gap));
            }
            steps.push(Step::Write(chunk));
        }
        Script::new(steps)
    }

    /// [`SSE_HEAD`], the first `n_before` events one chunk each, then [`Step::Close`]: an
    /// orderly close without the last chunk (a truncated body).
    pub fn sse_then_close(events: &[impl AsRef<[u8]>], n_before: usize) -> Script {
        Self::sse_prefix(events, n_before).then(Step::Close)
    }

    /// [`SSE_HEAD`], one SSE comment event ([`SSE_COMMENT`]) as a chunk, then
    /// [`Step::Stall`]: headers arrive, tokens never do.
    pub fn stall_after_head() -> Script {
        Script::new(vec![
            Step::Write(Bytes::from_static(SSE_HEAD)),
            Step::Write(http_chunk(SSE_COMMENT)),
            Step::Stall,
        ])
    }

    /// Reads the request and never answers ([`Step::Stall`]), recording when the client
    /// gives up: for response-header timeout tests.
    pub fn no_response() -> Script {
        Script::new(vec![Step::Stall])
    }

    fn sse_prefix(events: &[impl AsRef<[u8]>], n_before: usize) -> Script {
        let mut steps = vec![Step::Write(Bytes::from_static(SSE_HEAD))];
        steps.extend(
            events
                .iter()
                .take(n_before)
                .map(|event| event.as_ref())
                .filter(|event| !event.is_empty())
                .map(|event| Step::Write(http_chunk(event))),
        );
        Script::new(steps)
    }
}

/// `data` framed as one HTTP/1.1 chunk: lowercase hex size, CRLF, data, CRLF.
pub fn http_chunk(data: &[u8]) -> Bytes {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// Decodes a complete chunked body (chunk extensions and trailers allowed, then ignored).
/// Returns the data and how many input bytes the body took, or `None` when `input` is
/// malformed or ends before the last chunk and its trailer section.
pub fn decode_chunked(input: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut data = Vec::new();
    let mut pos = 0;
    loop {
        let line = take_line(input, &mut pos)?;
        let size = parse_chunk_size(line)?;
        if size == 0 {
            // Trailer section: field lines up to an empty line.
            while !take_line(input, &mut pos)?.is_empty() {}
            return Some((data, pos));
        }
        let end = pos.checked_add(size)?;
        data.extend_from_slice(input.get(pos..end)?);
        pos = end;
        if !take_line(input, &mut pos)?.is_empty() {
            return None;
        }
    }
}

/// Realistic OpenAI `chat.completion.chunk` stream events, each `data: {...}\n\n`: the
/// role-only first chunk (`"content":""`, not a token), `n_tokens` content chunks
/// (`"tok0 "`, `"tok1 "`, ...) the last of which has `"finish_reason":"stop"` (with no
/// tokens, one empty-delta chunk carries it), with `with_usage` a usage-only chunk
/// (`"choices":[]`, `prompt_tokens` 7, `completion_tokens` `n_tokens`), then `data: [DONE]`.
pub fn openai_chat_events(n_tokens: usize, with_usage: bool) -> Vec<Vec<u8>> {
    const PREFIX: &str =
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","#;
    let event = |json: String| format!("data: {json}\n\n").into_bytes();
    let mut events = vec![event(format!(
        r#"{PREFIX}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}"#
    ))];
    for i in 0..n_tokens {
        let finish = if i + 1 == n_tokens {
            r#""stop""#
        } else {
            "null"
        };
        events.push(event(format!(
            r#"{PREFIX}"choices":[{{"index":0,"delta":{{"content":"tok{i} "}},"finish_reason":{finish}}}]}}"#
        )));
    }
    if n_tokens == 0 {
        events.push(event(format!(
            r#"{PREFIX}"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}]}}"#
        )));
    }
    if with_usage {
        let total = n_tokens + 7;
        events.push(event(format!(
            r#"{PREFIX}"choices":[],"usage":{{"prompt_tokens":7,"completion_tokens":{n_tokens},"total_tokens":{total}}}}}"#
        )));
    }
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// The standard reason phrase, or `Unknown`.
fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// The pieces (chunk payloads) `plan` cuts `events` into, empty pieces left out.
fn plan_pieces(events: &[impl AsRef<[u8]>], plan: &WritePlan) -> Vec<Vec<u8>> {
    let all: Vec<u8> = events
        .iter()
        .flat_map(|e| e.as_ref().iter().copied())
        .collect();
    let pieces: Vec<Vec<u8>> = match plan {
        WritePlan::Whole => events.iter().map(|e| e.as_ref().to_vec()).collect(),
        WritePlan::Bytes1 => all.iter().map(|b| vec![*b]).collect(),
        WritePlan::SplitAt(offsets) => {
            let mut cuts: Vec<usize> = offsets.iter().map(|o| (*o).min(all.len())).collect();
            cuts.push(all.len());
            cuts.sort_unstable();
            cuts.dedup();
            let mut start = 0;
            cuts.into_iter()
                .map(|cut| {
                    let piece = all.get(start..cut).unwrap_or_default().to_vec();
                    start = cut;
                    piece
                })
                .collect()
        }
        WritePlan::Coalesced(n) => events
            .chunks((*n).max(1))
            .map(|group| {
                group
                    .iter()
                    .flat_map(|e| e.as_ref().iter().copied())
                    .collect()
            })
            .collect(),
    };
    pieces.into_iter().filter(|p| !p.is_empty()).collect()
}

/// Takes one CRLF-terminated line from `input` at `pos`, advancing past the CRLF.
fn take_line<'a>(input: &'a [u8], pos: &mut usize) -> Option<&'a [u8]> {
    let rest = input.get(*pos..)?;
    let len = rest.windows(2).position(|w| w == b"\r\n")?;
    *pos += len + 2;
    rest.get(..len)
}

/// The size of a chunk-size line (`1a;ext=x`), rejecting anything that is not hex.
pub(super) fn parse_chunk_size(line: &[u8]) -> Option<usize> {
    let size = line.split(|b| *b == b';').next()?;
    let size = std::str::from_utf8(size).ok()?.trim_matches([' ', '\t']);
    if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    usize::from_str_radix(size, 16).ok()
}
