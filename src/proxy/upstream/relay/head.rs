//! The upstream's response head, parsed with `httparse` by the rules hyper's HTTP/1 client
//! applies (`proto/h1/role.rs`), so that a response reads the same on either path: at most
//! 100 fields and hyper's buffer limit for the head, informational heads (1xx but 101)
//! skipped, and the body's delimiter by RFC 9112 section 6.3.

use bytes::{Bytes, BytesMut};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version,
    header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING},
};

use crate::proxy::upstream::framing::Delimiter;

/// hyper's own HTTP/1 read buffer limit, the most a response head could take before
/// `upstream.max_response_header_bytes` (tests parse with it).
#[cfg(test)]
pub const MAX_HEAD: usize = 8192 + 4096 * 100;
/// The most fields a response head may carry: hyper's.
pub const MAX_FIELDS: usize = 100;

/// A complete response head, as the forwarding service needs it.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub delimiter: Delimiter,
    /// The connection may carry another request once this response has ended.
    pub keep_alive: bool,
}

/// Why a response head cannot be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("malformed response head: {0}")]
    Parse(httparse::Error),
    #[error("response head larger than {0} bytes (upstream.max_response_header_bytes)")]
    TooLarge(usize),
    #[error("invalid status code in the response head")]
    Status,
    #[error("invalid header field in the response head")]
    Field,
    #[error("invalid Content-Length in the response head")]
    ContentLength,
    #[error("Transfer-Encoding in an HTTP/1.0 response")]
    TransferEncoding,
}

/// Parses the response head at the start of `buf` and takes it out of `buf`, leaving what
/// follows (the body's first bytes). `None` while the head is incomplete. Informational
/// heads before it are taken out and skipped, as hyper's client skips them.
pub fn parse(
    buf: &mut BytesMut,
    method: &Method,
    max_head: usize,
) -> Result<Option<Head>, HeadError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut res = httparse::Response::new(&mut slots);
        let len = match res.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= max_head => {
                return Err(HeadError::TooLarge(max_head));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(HeadError::Parse(e)),
        };
        if len > max_head {
            return Err(HeadError::TooLarge(max_head));
        }
        let code = res.code.ok_or(HeadError::Status)?;
        let status = StatusCode::from_u16(code).map_err(|_| HeadError::Status)?;
        let version = if res.version == Some(1) {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        // Where each field lies in the head, so that the values can be slices of it.
        let base = buf.as_ptr() as usize;
        let mut fields = [(0usize, 0usize, 0usize, 0usize); MAX_FIELDS];
        let count = res.headers.len();
        for (slot, h) in fields.iter_mut().zip(res.headers.iter()) {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            *slot = (name, name + h.name.len(), value, value + h.value.len());
        }
        let head: Bytes = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(count);
        let mut keep_alive = version == Version::HTTP_11;
        let mut saw_close = false;
        for &(n0, n1, v0, v1) in &fields[..count] {
            let name = HeaderName::from_bytes(&head[n0..n1]).map_err(|_| HeadError::Field)?;
            let value =
                HeaderValue::from_maybe_shared(head.slice(v0..v1)).map_err(|_| HeadError::Field)?;
            if name == CONNECTION {
                // Once any `Connection` line asks to close, a later `keep-alive` does not
                // undo it.
                if saw_close || has_token(&value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(&value, "keep-alive");
                }
            }
            headers.append(name, value);
        }
        let delimiter = match code {
            // An upgrade: the connection is no longer HTTP.
            101 => {
                return Ok(Some(Head {
                    status,
                    version,
                    headers,
                    delimiter: Delimiter::Length(0),
                    keep_alive: false,
                }));
            }
            100..=199 => continue,
            204 | 304 => Delimiter::Length(0),
            _ if method == Method::HEAD => Delimiter::Length(0),
            200..=299 if method == Method::CONNECT => {
                return Ok(Some(Head {
                    status,
                    version,
                    headers,
                    delimiter: Delimiter::Length(0),
                    keep_alive: false,
                }));
            }
            _ => delimiter(&headers, version)?,
        };
        let keep_alive = keep_alive && delimiter != Delimiter::Close;
        return Ok(Some(Head {
            status,
            version,
            headers,
            delimiter,
            keep_alive,
        }));
    }
}

/// RFC 9112 section 6.3, as hyper reads it for a response.
fn delimiter(headers: &HeaderMap, version: Version) -> Result<Delimiter, HeadError> {
    if headers.contains_key(TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(HeadError::TransferEncoding);
        }
        let chunked = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        // Not ending in `chunked`: the body runs until the connection closes.
        return Ok(if chunked {
            Delimiter::Chunked
        } else {
            Delimiter::Close
        });
    }
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| HeadError::ContentLength)?;
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HeadError::ContentLength);
            }
            let n: u64 = part.parse().map_err(|_| HeadError::ContentLength)?;
            if length.is_some_and(|l| l != n) {
                return Err(HeadError::ContentLength);
            }
            length = Some(n);
        }
    }
    Ok(length.map_or(Delimiter::Close, Delimiter::Length))
}

/// Whether a comma-separated field value lists `token`.
fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(bytes: &[u8], method: &Method) -> (Result<Option<Head>, HeadError>, BytesMut) {
        let mut buf = BytesMut::from(bytes);
        let head = parse(&mut buf, method, MAX_HEAD);
        (head, buf)
    }

    fn head(bytes: &[u8]) -> Head {
        match parsed(bytes, &Method::POST).0 {
            Ok(Some(h)) => h,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_chunked_head_leaves_the_body_in_the_buffer() {
        let (h, rest) = parsed(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello",
            &Method::POST,
        );
        let h = h.unwrap().unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.delimiter, Delimiter::Chunked);
        assert!(h.keep_alive);
        assert_eq!(h.headers["content-type"], "text/event-stream");
        assert_eq!(&rest[..], b"5\r\nhello");
    }

    #[test]
    fn an_incomplete_head_waits_and_a_huge_one_fails() {
        let (h, rest) = parsed(b"HTTP/1.1 200 OK\r\nContent-Le", &Method::GET);
        assert!(matches!(h, Ok(None)));
        assert_eq!(rest.len(), 27, "nothing taken");
        let mut big = b"HTTP/1.1 200 OK\r\nx: ".to_vec();
        big.resize(MAX_HEAD + 1, b'a');
        assert!(matches!(
            parsed(&big, &Method::GET).0,
            Err(HeadError::TooLarge(MAX_HEAD))
        ));
    }

    #[test]
    fn the_head_limit_is_the_one_given() {
        let limit = 8192;
        let mut head = b"HTTP/1.1 200 OK\r\nx: ".to_vec();
        head.resize(limit - 4, b'a');
        head.extend_from_slice(b"\r\n\r\n");
        let mut buf = BytesMut::from(&head[..]);
        assert!(matches!(parse(&mut buf, &Method::GET, limit), Ok(Some(_))));
        // One byte more, complete or still arriving: too large.
        head.insert(20, b'a');
        let mut buf = BytesMut::from(&head[..]);
        assert!(matches!(
            parse(&mut buf, &Method::GET, limit),
            Err(HeadError::TooLarge(8192))
        ));
        let mut buf = BytesMut::from(&head[..limit]);
        assert!(matches!(
            parse(&mut buf, &Method::GET, limit),
            Err(HeadError::TooLarge(8192))
        ));
    }

    #[test]
    fn informational_heads_are_skipped() {
        let (h, rest) = parsed(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            &Method::POST,
        );
        let h = h.unwrap().unwrap();
        assert_eq!(h.status, StatusCode::CREATED);
        assert_eq!(h.delimiter, Delimiter::Length(2));
        assert!(!h.headers.contains_key("link"));
        assert_eq!(&rest[..], b"ok");
        // A 100 alone: taken out, the final head still to come.
        let (h, rest) = parsed(b"HTTP/1.1 100 Continue\r\n\r\n", &Method::POST);
        assert!(matches!(h, Ok(None)));
        assert!(rest.is_empty());
    }

    #[test]
    fn the_delimiter_follows_rfc_9112() {
        let d = |bytes: &[u8], method: Method| match parsed(bytes, &method).0 {
            Ok(Some(h)) => Ok((h.delimiter, h.keep_alive)),
            Ok(None) => panic!("incomplete"),
            Err(e) => Err(e.to_string()),
        };
        let post = || Method::POST;
        assert_eq!(
            d(
                b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
                post()
            ),
            Ok((Delimiter::Length(0), true))
        );
        assert_eq!(
            d(
                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
                Method::HEAD
            ),
            Ok((Delimiter::Length(0), true))
        );
        assert_eq!(
            d(b"HTTP/1.1 200 OK\r\n\r\n", post()),
            Ok((Delimiter::Close, false))
        );
        assert_eq!(
            d(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                post()
            ),
            Ok((Delimiter::Close, false))
        );
        assert_eq!(
            d(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, CHUNKED\r\n\r\n",
                post()
            ),
            Ok((Delimiter::Chunked, true))
        );
        assert_eq!(
            d(
                b"HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\ncontent-length: 7\r\n\r\n",
                post()
            ),
            Ok((Delimiter::Length(7), true))
        );
        for bad in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length: 8\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: +7\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert!(d(bad, post()).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(matches!(
            parsed(b"HTTP/1.1 2000 OK\r\n\r\n", &Method::GET).0,
            Err(HeadError::Parse(_))
        ));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_fields() {
        assert!(!head(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n").keep_alive);
        assert!(
            head(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n")
                .keep_alive
        );
        assert!(
            !head(b"HTTP/1.1 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n")
                .keep_alive
        );
        assert!(!head(b"HTTP/1.1 101 Switching Protocols\r\n\r\n").keep_alive);
    }

    #[test]
    fn values_keep_their_bytes_and_names_are_lowercased() {
        let h = head(
            b"HTTP/1.1 200 OK\r\nX-Thing: a\xffb \r\nX-Thing: second\r\ncontent-length: 0\r\n\r\n",
        );
        let all: Vec<&[u8]> = h
            .headers
            .get_all("x-thing")
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(all, [&b"a\xffb"[..], b"second"]);
    }

    #[test]
    fn too_many_fields_fail() {
        let mut bytes = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_FIELDS {
            bytes.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        bytes.extend_from_slice(b"\r\n");
        assert!(matches!(
            parsed(&bytes, &Method::GET).0,
            Err(HeadError::Parse(httparse::Error::TooManyHeaders))
        ));
    }
}
