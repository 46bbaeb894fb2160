//! The response head as hyper's HTTP/1 server writes it (hyper 1.x `proto/h1/role.rs`,
//! `Server::encode`, and `conn.rs`'s `enforce_version`): the status line, the fields in
//! the map's order with lower-case names, a `Content-Length` or `Transfer-Encoding:
//! chunked` where the body needs one, `Connection` fixed for keep-alive and HTTP/1.0,
//! and a cached `Date`. The head is written from a buffer that lives only while it is
//! written; body frames are written from their own buffers.

use std::{cell::RefCell, time::SystemTime};

use http::{HeaderMap, HeaderValue, Method, StatusCode, Version, header};

use super::head::{has_token, is_chunked};

/// How the body is written after the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    /// Exactly this many bytes (0: none at all, whatever the body holds).
    Length(u64),
    Chunked,
    /// Until the connection closes (HTTP/1.0 without a length).
    Close,
}

/// What the connection knows when it writes a response head.
pub struct Exchange<'a> {
    pub method: &'a Method,
    /// The request's version.
    pub version: Version,
    /// Keep the connection open after this response.
    pub keep_alive: bool,
}

/// The body's length as hyper reads it from the body: `None` for a body that has ended.
pub type BodyLen = Option<Option<u64>>;

fn can_chunked(method: &Method, status: StatusCode) -> bool {
    if method == Method::HEAD
        || (method == Method::CONNECT && status.is_success())
        || status.is_informational()
    {
        false
    } else {
        !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
    }
}

fn can_have_content_length(method: &Method, status: StatusCode) -> bool {
    if status.is_informational() || (method == Method::CONNECT && status.is_success()) {
        false
    } else {
        !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
    }
}

/// Writes the head into `dst`; returns the body's encoder and whether the connection
/// stays open after this response.
pub fn encode(
    status: StatusCode,
    headers: &mut HeaderMap,
    body: BodyLen,
    ex: &Exchange<'_>,
    dst: &mut Vec<u8>,
) -> (Encoder, bool) {
    let keep_alive = ex.keep_alive;
    // enforce_version
    let out_version = match ex.version {
        Version::HTTP_10 => {
            let says_keep_alive = headers
                .get_all(header::CONNECTION)
                .iter()
                .any(|v| has_token(v, "keep-alive"));
            if !says_keep_alive {
                // The head is HTTP/1.1 here: hyper adds keep-alive when it wants it.
                if keep_alive {
                    headers.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
                }
            }
            Version::HTTP_10
        }
        _ => {
            if !keep_alive
                && !headers
                    .get_all(header::CONNECTION)
                    .iter()
                    .any(|v| has_token(v, "close"))
            {
                headers.append(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Version::HTTP_11
        }
    };
    let method = ex.method;
    let mut is_last = !keep_alive;
    let mut wrote_len = false;
    if method == Method::CONNECT && status.is_success() {
        wrote_len = true;
        is_last = true;
    }
    if out_version == Version::HTTP_11 && status == StatusCode::OK {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        dst.extend_from_slice(if out_version == Version::HTTP_10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.push(b' ');
        dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    let mut encoder = Encoder::Length(0);
    let mut wrote_date = false;
    let mut prev_len: Option<u64> = None;
    let mut open_line: Option<HeaderName2> = None;
    let mut must_write_chunked = false;
    let end_line = |dst: &mut Vec<u8>, open: &mut Option<HeaderName2>, chunked: bool| {
        if open.take().is_some() {
            dst.extend_from_slice(if chunked { b", chunked\r\n" } else { b"\r\n" });
        }
    };
    let mut last_name: Option<&header::HeaderName> = None;
    for (name, value) in headers.iter() {
        let new_name = last_name != Some(name);
        if new_name {
            end_line(dst, &mut open_line, must_write_chunked);
            last_name = Some(name);
        }
        let continuing = open_line.is_some();
        match *name {
            header::CONTENT_LENGTH => match body {
                Some(Some(known)) => {
                    if !continuing && !wrote_len {
                        encoder = Encoder::Length(known);
                        dst.extend_from_slice(b"content-length: ");
                        dst.extend_from_slice(value.as_bytes());
                        wrote_len = true;
                        open_line = Some(HeaderName2);
                    }
                    continue;
                }
                Some(None) => {
                    let Some(len) = digits(value.as_bytes()) else {
                        continue;
                    };
                    if prev_len.is_some() {
                        continue;
                    }
                    encoder = Encoder::Length(len);
                    dst.extend_from_slice(b"content-length: ");
                    dst.extend_from_slice(value.as_bytes());
                    wrote_len = true;
                    open_line = Some(HeaderName2);
                    prev_len = Some(len);
                    continue;
                }
                None => {
                    if method != Method::HEAD {
                        continue;
                    }
                    wrote_len = true;
                }
            },
            header::TRANSFER_ENCODING => {
                if out_version == Version::HTTP_10 || !can_chunked(method, status) {
                    continue;
                }
                wrote_len = true;
                must_write_chunked = !is_chunked(value);
                if continuing {
                    dst.extend_from_slice(b", ");
                } else {
                    encoder = Encoder::Chunked;
                    dst.extend_from_slice(b"transfer-encoding: ");
                    open_line = Some(HeaderName2);
                }
                dst.extend_from_slice(value.as_bytes());
                continue;
            }
            header::CONNECTION => {
                if !is_last && has_token(value, "close") {
                    is_last = true;
                }
                if continuing {
                    dst.extend_from_slice(b", ");
                } else {
                    dst.extend_from_slice(b"connection: ");
                    open_line = Some(HeaderName2);
                }
                dst.extend_from_slice(value.as_bytes());
                continue;
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    end_line(dst, &mut open_line, must_write_chunked);
    if !wrote_len {
        encoder = match body {
            Some(None) => {
                if out_version == Version::HTTP_10 || !can_chunked(method, status) {
                    Encoder::Close
                } else {
                    dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
                    Encoder::Chunked
                }
            }
            None | Some(Some(0)) => {
                if can_have_content_length(method, status) && method != Method::HEAD {
                    dst.extend_from_slice(b"content-length: 0\r\n");
                }
                Encoder::Length(0)
            }
            Some(Some(len)) => {
                if can_have_content_length(method, status) {
                    dst.extend_from_slice(b"content-length: ");
                    dst.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
                    dst.extend_from_slice(b"\r\n");
                    Encoder::Length(len)
                } else {
                    Encoder::Length(0)
                }
            }
        };
    }
    if !can_chunked(method, status) {
        encoder = Encoder::Length(0);
    }
    if !wrote_date {
        dst.extend_from_slice(b"date: ");
        date(dst);
        dst.extend_from_slice(b"\r\n\r\n");
    } else {
        dst.extend_from_slice(b"\r\n");
    }
    if encoder == Encoder::Close {
        is_last = true;
    }
    (encoder, !is_last)
}

/// Marks a field line left open for more values.
struct HeaderName2;

fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// The head of an answer the connection gives itself (a refused request head): hyper's.
/// `version`: the connection's last request's (HTTP/1.1 before the first).
pub fn error_head(status: StatusCode, version: Version, dst: &mut Vec<u8>) {
    let mut headers = HeaderMap::new();
    let ex = Exchange {
        method: &Method::GET,
        version,
        keep_alive: false,
    };
    // hyper's automatic answer has no request method: no HEAD exception applies.
    encode(status, &mut headers, None, &ex, dst);
}

/// Appends the current `Date` (formatted once a second, as hyper caches it).
fn date(dst: &mut Vec<u8>) {
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs || c.1.is_empty() {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        dst.extend_from_slice(c.1.as_bytes());
    });
}
