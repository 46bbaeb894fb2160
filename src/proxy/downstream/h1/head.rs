//! A client's request head, parsed with `httparse` under hyper's server rules and limits
//! (hyper 1.x `proto/h1/role.rs`, `Server::parse`), so that goodput's own connection
//! accepts exactly the heads hyper's does and answers the others with hyper's status:
//!
//! - at most [`MAX_HEADERS`] fields and `server.max_request_header_bytes` of head, else 431;
//!   a request target over [`MAX_URI_LEN`] bytes, 414; anything `httparse`, `http::Method`
//!   or `http::Uri` refuses, 400;
//! - framing (RFC 9112 §6.3): `Transfer-Encoding` on HTTP/1.0 is 400, one whose last
//!   coding is not `chunked` is 400, and it wins over `Content-Length` (which is then
//!   removed, and the connection not kept alive); `Content-Length` must be digits only,
//!   and several must agree (else 400); a length past hyper's largest is 431;
//! - `Connection` (`close` sticks, HTTP/1.0 needs `keep-alive`), `Expect: 100-continue`,
//!   `Upgrade` (HTTP/1.1 only) and `CONNECT` as hyper reads them.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version, header};

/// Fields a head may have (hyper's `DEFAULT_MAX_HEADERS`).
pub const MAX_HEADERS: usize = 100;
/// The longest request target (hyper's `MAX_URI_LEN`).
pub const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;
/// The largest `Content-Length` hyper takes (`DecodedLength::MAX_LEN`).
const MAX_LENGTH: u64 = u64::MAX - 2;

/// Why a head is refused; the status hyper answers it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// 400: the method, target, version or a field does not parse, or the framing
    /// headers contradict each other.
    BadRequest,
    /// 414.
    UriTooLong,
    /// 431: too many fields, or a head (or a length) over the limit.
    TooLarge,
}

impl Reject {
    pub fn status(self) -> http::StatusCode {
        match self {
            Reject::BadRequest => http::StatusCode::BAD_REQUEST,
            Reject::UriTooLong => http::StatusCode::URI_TOO_LONG,
            Reject::TooLarge => http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }
}

/// How the request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    Length(u64),
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    /// `None`: no body (a length of 0).
    pub body: Option<BodyLength>,
    pub expect_continue: bool,
    pub keep_alive: bool,
    pub wants_upgrade: bool,
}

/// Parses the head at the start of `buf`, leaving `buf` untouched. `Ok(None)`: not
/// complete yet (and under the limit). `Ok(Some(len))`: the head is `buf[..len]`, to be
/// taken with [`take`].
pub fn complete(buf: &[u8], max_bytes: usize) -> Result<Option<usize>, Reject> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            if len > max_bytes {
                return Err(Reject::TooLarge);
            }
            Ok(Some(len))
        }
        Ok(httparse::Status::Partial) => {
            if buf.len() >= max_bytes {
                Err(Reject::TooLarge)
            } else {
                Ok(None)
            }
        }
        Err(httparse::Error::TooManyHeaders) => Err(Reject::TooLarge),
        Err(_) => Err(Reject::BadRequest),
    }
}

/// Takes the complete head of `len` bytes (from [`complete`]) off the front of `buf`;
/// the head's bytes come back beside it (or with the refusal).
pub fn take(buf: &mut BytesMut, len: usize) -> (Bytes, Result<Head, Reject>) {
    let slice = buf.split_to(len).freeze();
    let head = parse(&slice);
    (slice, head)
}

fn parse(slice: &Bytes) -> Result<Head, Reject> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    // Parsed again on the frozen bytes, so that every value shares them.
    let Ok(httparse::Status::Complete(_)) = req.parse(slice) else {
        return Err(Reject::BadRequest);
    };
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Err(Reject::BadRequest);
    };
    if path.len() > MAX_URI_LEN {
        return Err(Reject::UriTooLong);
    }
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| Reject::BadRequest)?;
    let uri =
        Uri::from_maybe_shared(slice.slice_ref(path.as_bytes())).map_err(|_| Reject::BadRequest)?;
    let is_http_11 = version == 1;
    let version = if is_http_11 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut keep_alive = is_http_11;
    let mut body = None;
    let mut expect_continue = false;
    let mut con_len: Option<u64> = None;
    let (mut is_cl, mut is_te, mut is_te_chunked) = (false, false, false);
    let mut wants_upgrade = method == Method::CONNECT;
    let mut saw_close = false;
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    for field in req.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| Reject::BadRequest)?;
        let value = field_value(slice, field.value)?;
        match name {
            header::TRANSFER_ENCODING => {
                if !is_http_11 {
                    return Err(Reject::BadRequest);
                }
                is_te = true;
                if is_cl && con_len.take().is_some() {
                    headers.remove(header::CONTENT_LENGTH);
                }
                if is_chunked(&value) {
                    is_te_chunked = true;
                    body = Some(BodyLength::Chunked);
                } else {
                    is_te_chunked = false;
                }
            }
            header::CONTENT_LENGTH => {
                is_cl = true;
                if is_te {
                    continue;
                }
                let len = digits(value.as_bytes()).ok_or(Reject::BadRequest)?;
                if let Some(prev) = con_len {
                    if prev != len {
                        return Err(Reject::BadRequest);
                    }
                    continue;
                }
                if len > MAX_LENGTH {
                    return Err(Reject::TooLarge);
                }
                body = (len > 0).then_some(BodyLength::Length(len));
                con_len = Some(len);
            }
            header::CONNECTION => {
                if saw_close || has_token(&value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(&value, "keep-alive");
                }
            }
            header::EXPECT => {
                expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
            }
            header::UPGRADE => wants_upgrade = is_http_11,
            _ => {}
        }
        headers.append(name, value);
    }
    if is_te && !is_te_chunked {
        return Err(Reject::BadRequest);
    }
    if is_te && is_cl {
        keep_alive = false;
    }
    Ok(Head {
        method,
        uri,
        version,
        headers,
        body,
        expect_continue,
        keep_alive,
        wants_upgrade,
    })
}

/// A field's value as a slice of the head's bytes (httparse has checked its bytes, as
/// hyper relies on).
fn field_value(slice: &Bytes, value: &[u8]) -> Result<HeaderValue, Reject> {
    if value.is_empty() {
        return Ok(HeaderValue::from_static(""));
    }
    HeaderValue::from_maybe_shared(slice.slice_ref(value)).or_else(|_| {
        // obs-text (bytes 0x80-0xFF) passes httparse and hyper's unchecked value; http's
        // checked constructor takes it too, so this is a control byte httparse let by.
        HeaderValue::from_bytes(value).map_err(|_| Reject::BadRequest)
    })
}

/// hyper's `from_digits`: ASCII digits only, at least one, no overflow.
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in bytes {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// hyper's `is_chunked_`: the last coding is `chunked`.
pub fn is_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// hyper's `connection_has`: a comma-separated token, case-insensitively.
pub fn has_token(value: &HeaderValue, token: &str) -> bool {
    value.to_str().is_ok_and(|s| {
        s.split(',')
            .any(|part| part.trim().eq_ignore_ascii_case(token))
    })
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
