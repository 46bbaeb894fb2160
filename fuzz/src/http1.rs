//! HTTP/1.1 framing for the `http_exchange` target: how one input splits into what the
//! client sends and what the upstream answers, which request heads the client's bytes
//! hold, the body of an upstream response when it is well-formed, and the responses the
//! proxy wrote back (which must always be well-framed, as far as they go).
//!
//! "Well-formed" is deliberately strict (one `Content-Length` of plain digits, or
//! `Transfer-Encoding: chunked` alone with no trailers, or neither and the body runs to
//! the close): only then does the target hold the proxy to passing the body on unchanged.

/// Between the client's bytes and the upstream's in one input. Bytes that happen to
/// contain it elsewhere only move the split; an input without it is all client bytes.
pub const SEPARATOR: &[u8] = b"\n--upstream--\n";

/// Response heads parsed at most; more is not well-formed here (hyper allows 100).
const MAX_HEADERS: usize = 64;

/// Bodies larger than this are not well-formed here (inputs are far smaller anyway).
const MAX_BODY: u64 = 1 << 20;

/// The client's bytes and the upstream's.
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match find(data, SEPARATOR) {
        Some(i) => (&data[..i], &data[i + SEPARATOR.len()..]),
        None => (data, &[]),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    /// No framing header: a request has no body, a response runs to the close.
    Unframed,
}

/// The framing headers, strictly: `None` for anything a careful peer might read two ways
/// (both headers, repeats, a coding other than chunked, a length that is not plain digits).
fn framing(headers: &[httparse::Header<'_>]) -> Option<Framing> {
    let named = |name: &str| -> Vec<&[u8]> {
        headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    };
    let te = named("transfer-encoding");
    let cl = named("content-length");
    match (te.as_slice(), cl.as_slice()) {
        ([], []) => Some(Framing::Unframed),
        ([v], []) => v
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked")
            .then_some(Framing::Chunked),
        ([], [v]) => {
            if v.is_empty() || !v.iter().all(u8::is_ascii_digit) || v.len() > 12 {
                return None;
            }
            let n = std::str::from_utf8(v).ok()?.parse::<u64>().ok()?;
            (n <= MAX_BODY).then_some(Framing::Length(n))
        }
        _ => None,
    }
}

/// Where a chunked body stands after the bytes available.
#[derive(Debug, PartialEq, Eq)]
pub enum ChunkedEnd {
    /// The last chunk and the empty trailer section: the message used this many bytes.
    Complete(usize),
    /// The bytes ran out before the end.
    Partial,
    /// Not valid chunked framing (the body decoded up to there is kept).
    Malformed,
}

/// Decodes chunked framing strictly: hex sizes, optional extensions, CRLF everywhere, and
/// no trailer fields.
pub fn decode_chunked(buf: &[u8]) -> (Vec<u8>, ChunkedEnd) {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_len) = find(&buf[at..], b"\r\n") else {
            // A size line still arriving, unless it is already wrong.
            let line = &buf[at..];
            let end = if size_line_prefix_ok(line) {
                ChunkedEnd::Partial
            } else {
                ChunkedEnd::Malformed
            };
            return (body, end);
        };
        let Some(size) = chunk_size(&buf[at..at + line_len]) else {
            return (body, ChunkedEnd::Malformed);
        };
        at += line_len + 2;
        if size == 0 {
            let rest = &buf[at..];
            return match rest.get(..2) {
                Some(b"\r\n") => (body, ChunkedEnd::Complete(at + 2)),
                Some(_) => (body, ChunkedEnd::Malformed),
                None if b"\r\n".starts_with(rest) => (body, ChunkedEnd::Partial),
                None => (body, ChunkedEnd::Malformed),
            };
        }
        let data_end = at.saturating_add(size);
        if data_end > buf.len() {
            body.extend_from_slice(&buf[at..]);
            return (body, ChunkedEnd::Partial);
        }
        body.extend_from_slice(&buf[at..data_end]);
        at = data_end;
        match buf.get(at..at + 2) {
            Some(b"\r\n") => at += 2,
            Some(_) => return (body, ChunkedEnd::Malformed),
            None if b"\r\n".starts_with(&buf[at..]) => return (body, ChunkedEnd::Partial),
            None => return (body, ChunkedEnd::Malformed),
        }
    }
}

/// A chunk size line without its CRLF: hex digits, then optionally `;` and an extension of
/// visible characters, spaces and tabs.
fn chunk_size(line: &[u8]) -> Option<usize> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 8 {
        return None;
    }
    let ext = &line[digits..];
    if !(ext.is_empty() || ext.first() == Some(&b';') && ext.iter().all(|&b| ext_byte(b))) {
        return None;
    }
    let hex = std::str::from_utf8(&line[..digits]).ok()?;
    let size = usize::from_str_radix(hex, 16).ok()?;
    (size as u64 <= MAX_BODY).then_some(size)
}

fn ext_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b)
}

/// Whether an unterminated size line could still become a valid one.
fn size_line_prefix_ok(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return true;
    }
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let ext = &line[digits..];
    digits > 0
        && digits <= 8
        && (ext.is_empty() || ext[0] == b';' && ext.iter().all(|&b| ext_byte(b)))
}

/// One request head found in the client's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentRequest {
    /// A `HEAD` request: its response has no body whatever its headers say.
    pub head: bool,
    /// An upgrade or `CONNECT`: what follows its response is no longer HTTP.
    pub tunnel: bool,
}

/// What the client's bytes hold: the requests whose heads are complete, in order, and
/// whether the bytes stop in the middle of a head (so the server waits for more).
#[derive(Debug, Default)]
pub struct Sent {
    pub requests: Vec<SentRequest>,
    pub cut_in_head: bool,
}

/// Walks the client's bytes request by request. It stops at the first request whose body
/// is cut short or whose framing a server should refuse; that request still counts (a
/// server answers it, with the upstream's response or with an error).
pub fn sent_requests(mut bytes: &[u8]) -> Sent {
    let mut sent = Sent::default();
    while !bytes.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let used = match req.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                sent.cut_in_head = true;
                return sent;
            }
            Err(_) => return sent,
        };
        let method = req.method.unwrap_or("");
        let upgrade = req
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("upgrade"));
        let this = SentRequest {
            head: method == "HEAD",
            tunnel: upgrade || method == "CONNECT",
        };
        sent.requests.push(this);
        if this.tunnel || req.version != Some(1) {
            return sent;
        }
        let rest = &bytes[used..];
        let body_len = match framing(req.headers) {
            Some(Framing::Unframed) => 0,
            Some(Framing::Length(n)) => match usize::try_from(n) {
                Ok(n) if n <= rest.len() => n,
                _ => return sent,
            },
            Some(Framing::Chunked) => match decode_chunked(rest) {
                (_, ChunkedEnd::Complete(n)) => n,
                _ => return sent,
            },
            None => return sent,
        };
        bytes = &rest[body_len..];
    }
    sent
}

/// A well-formed upstream response: its status and its body.
#[derive(Debug)]
pub struct UpstreamResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The upstream's bytes as one well-formed, complete HTTP/1.1 final response with a body
/// (not 1xx, 204 or 304), or `None`.
pub fn upstream_response(bytes: &[u8]) -> Option<UpstreamResponse> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(used) = resp.parse(bytes).ok()? else {
        return None;
    };
    let status = resp.code?;
    if resp.version != Some(1) || !(200..=599).contains(&status) || status == 204 || status == 304 {
        return None;
    }
    let rest = &bytes[used..];
    let body = match framing(resp.headers)? {
        Framing::Unframed => rest.to_vec(),
        Framing::Length(n) => rest.get(..usize::try_from(n).ok()?)?.to_vec(),
        Framing::Chunked => match decode_chunked(rest) {
            (body, ChunkedEnd::Complete(_)) => body,
            _ => return None,
        },
    };
    Some(UpstreamResponse { status, body })
}

/// One response the proxy wrote to the client.
#[derive(Debug)]
pub struct Received {
    pub status: u16,
    /// The body as far as it arrived, framing removed.
    pub body: Vec<u8>,
    /// The body reached its end (by its framing, or by the close for an unframed one).
    pub complete: bool,
}

/// Reads the proxy's responses to `sent` out of what the client received (`closed`: the
/// proxy closed the connection after it). Interim 1xx responses are skipped; a 101 ends
/// the walk (the tunnel's bytes follow). Panics on anything a client could misread: a
/// response head that does not parse, both framing headers, or broken chunked framing.
pub fn received_responses(mut bytes: &[u8], sent: &[SentRequest], closed: bool) -> Vec<Received> {
    let mut out = Vec::new();
    let mut requests = sent.iter();
    let mut current = requests.next();
    while let Some(req) = current {
        if bytes.is_empty() {
            break;
        }
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut resp = httparse::Response::new(&mut headers);
        let used = match resp.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => break,
            Err(e) => panic!(
                "the proxy wrote a response head that does not parse ({e}): {:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ),
        };
        let status = resp.code.unwrap_or(0);
        let rest = &bytes[used..];
        if status == 101 {
            break;
        }
        if (100..200).contains(&status) {
            bytes = rest;
            continue;
        }
        // A response without a body is framed by the request or the status alone; its
        // `Content-Length` is only informative (and passed on as the upstream wrote it).
        let no_body = req.head || status == 204 || status == 304;
        let framing = if no_body {
            Some(Framing::Length(0))
        } else {
            framing(resp.headers)
        };
        let Some(framing) = framing else {
            panic!(
                "the proxy wrote ambiguous framing headers: {:?}",
                resp.headers
                    .iter()
                    .map(|h| (h.name, String::from_utf8_lossy(h.value)))
                    .collect::<Vec<_>>()
            );
        };
        let (body, used, complete) = match framing {
            Framing::Length(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let take = n.min(rest.len());
                (rest[..take].to_vec(), take, take == n)
            }
            Framing::Chunked => match decode_chunked(rest) {
                (body, ChunkedEnd::Complete(n)) => (body, n, true),
                (body, ChunkedEnd::Partial) => (body, rest.len(), false),
                (_, ChunkedEnd::Malformed) => panic!(
                    "the proxy wrote malformed chunked framing: {:?}",
                    String::from_utf8_lossy(&rest[..rest.len().min(300)])
                ),
            },
            Framing::Unframed => (rest.to_vec(), rest.len(), closed),
        };
        out.push(Received {
            status,
            body,
            complete,
        });
        if !complete || req.tunnel {
            break;
        }
        bytes = &rest[used..];
        current = requests.next();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked() {
        assert_eq!(
            decode_chunked(b"3\r\nabc\r\n0\r\n\r\nX"),
            (b"abc".to_vec(), ChunkedEnd::Complete(13))
        );
        assert_eq!(decode_chunked(b"3\r\nab").1, ChunkedEnd::Partial);
        assert_eq!(decode_chunked(b"3;x=y\r").1, ChunkedEnd::Partial);
        assert_eq!(decode_chunked(b"zz\r\n").1, ChunkedEnd::Malformed);
        assert_eq!(
            decode_chunked(b"0\r\nX: y\r\n\r\n").1,
            ChunkedEnd::Malformed
        );
    }

    #[test]
    fn requests_and_responses() {
        let sent = sent_requests(
            b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\nhiHEAD / HTTP/1.1\r\n\r\nGET / HT",
        );
        assert_eq!(sent.requests.len(), 2);
        assert!(sent.requests[1].head && sent.cut_in_head);
        let got = received_responses(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n\
              HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
            &sent.requests,
            false,
        );
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].body, b"ok");
        assert!(got[1].complete && got[1].body.is_empty());
        let up = upstream_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA");
        assert_eq!(up.map(|u| u.body), Some(b"ok".to_vec()));
        assert!(upstream_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\no").is_none());
    }
}
