//! The request as written to the upstream: its head encoded as hyper's HTTP/1 client
//! encodes it (the same bytes, the same framing decision), then its body, with chunk
//! framing when its length is not known. Whatever the body has ready is gathered and
//! written with one vectored write, the head with the body's first bytes.

use std::{
    collections::VecDeque,
    io::{self, IoSlice},
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http::{
    HeaderMap, HeaderValue, Method,
    header::{CONTENT_LENGTH, TRANSFER_ENCODING},
    request::Parts,
};
use http_body::Body;
use sync_wrapper::SyncWrapper;
use tokio::io::AsyncWrite;

use crate::{BoxError, proxy::upstream::inline::ReqBody};

/// Bytes gathered before they are written, at most (a body frame is never split).
const GATHER: usize = 64 * 1024;
/// Buffers handed to one vectored write, at most.
const SLICES: usize = 32;

/// How the body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `Content-Length`: the bytes still owed.
    Length(u64),
    Chunked,
}

/// Why the request could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing the request upstream: {0}")]
    Io(#[source] io::Error),
    #[error("the request body failed: {0}")]
    Body(#[source] BoxError),
    #[error("the request body did not match its Content-Length")]
    Length,
}

impl WriteError {
    /// The client's body failed (or broke its length), not the upstream connection.
    pub fn is_body(&self) -> bool {
        !matches!(self, WriteError::Io(_))
    }
}

/// A request on its way out.
pub struct Outgoing {
    method: Method,
    /// Bytes ready to go out, in order.
    queue: VecDeque<Bytes>,
    queued: usize,
    /// `None` once the body has ended (or there is none). Wrapped so that the response
    /// body, which carries the request while it is still being written, stays `Sync`.
    body: Option<SyncWrapper<ReqBody>>,
    framing: Framing,
    /// Bytes written so far: none means the request may go on another connection.
    written: u64,
}

impl Outgoing {
    /// Encodes the head of `parts` (target in origin form, as built for the upstream) for
    /// `body`.
    pub fn new(mut parts: Parts, body: ReqBody) -> Outgoing {
        let framing = set_length(&mut parts.headers, &parts.method, &body);
        let mut head = Vec::with_capacity(64 + parts.headers.len() * 32);
        head.extend_from_slice(parts.method.as_str().as_bytes());
        head.push(b' ');
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        head.extend_from_slice(if target.is_empty() {
            b"/"
        } else {
            target.as_bytes()
        });
        head.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &parts.headers {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let queued = head.len();
        let ended = framing == Framing::Length(0) || body.is_end_stream();
        Outgoing {
            method: parts.method,
            queue: VecDeque::from([Bytes::from(head)]),
            queued,
            body: (!ended).then(|| SyncWrapper::new(body)),
            framing,
            written: 0,
        }
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Nothing has been written yet.
    pub fn unwritten(&self) -> bool {
        self.written == 0
    }

    /// Writes what it can: `Ready(Ok)` once the whole request is written.
    pub fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WriteError>> {
        loop {
            self.gather(cx)?;
            if self.queue.is_empty() {
                return if self.body.is_none() {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                };
            }
            let mut slices = [IoSlice::new(&[]); SLICES];
            let mut n = 0;
            for (slot, b) in slices.iter_mut().zip(self.queue.iter()) {
                *slot = IoSlice::new(b);
                n += 1;
            }
            match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(WriteError::Io(e))),
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(WriteError::Io(io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(mut wrote)) => {
                    self.written += wrote as u64;
                    self.queued -= wrote;
                    while wrote > 0 {
                        let Some(front) = self.queue.front_mut() else {
                            break;
                        };
                        if wrote >= front.len() {
                            wrote -= front.len();
                            self.queue.pop_front();
                        } else {
                            front.advance(wrote);
                            wrote = 0;
                        }
                    }
                }
            }
        }
    }

    /// Takes what the body has ready (up to [`GATHER`] bytes queued) and frames it.
    fn gather(&mut self, cx: &mut Context<'_>) -> Result<(), WriteError> {
        while self.queued < GATHER {
            let Some(body) = self.body.as_mut() else {
                return Ok(());
            };
            let body = body.get_mut();
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Some(Err(e))) => {
                    self.body = None;
                    return Err(WriteError::Body(e));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let ended = body.is_end_stream();
                    // Trailers are dropped, as hyper's client drops those no `Trailer`
                    // field announced (the proxy strips `Trailer`).
                    if let Ok(data) = frame.into_data() {
                        self.push_data(data)?;
                    }
                    if ended {
                        self.end()?;
                    }
                }
                Poll::Ready(None) => self.end()?,
            }
        }
        Ok(())
    }

    fn push_data(&mut self, data: Bytes) -> Result<(), WriteError> {
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.framing {
            Framing::Length(left) => {
                let len = data.len() as u64;
                if len > *left {
                    self.body = None;
                    return Err(WriteError::Length);
                }
                *left -= len;
                self.push(data);
            }
            Framing::Chunked => {
                self.push(Bytes::from(format!("{:X}\r\n", data.len())));
                self.push(data);
                self.push(Bytes::from_static(b"\r\n"));
            }
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), WriteError> {
        self.body = None;
        match self.framing {
            Framing::Length(0) => Ok(()),
            Framing::Length(_) => Err(WriteError::Length),
            Framing::Chunked => {
                self.push(Bytes::from_static(b"0\r\n\r\n"));
                Ok(())
            }
        }
    }

    fn push(&mut self, b: Bytes) {
        self.queued += b.len();
        self.queue.push_back(b);
    }
}

/// Sets the framing fields of the request head as hyper's HTTP/1.1 client does
/// (`Client::set_length`) and says how the body goes on the wire.
fn set_length(headers: &mut HeaderMap, method: &Method, body: &ReqBody) -> Framing {
    if body.is_end_stream() {
        headers.remove(TRANSFER_ENCODING);
        return Framing::Length(0);
    }
    let length = content_length(headers);
    if let Some(te) = headers.get_all(TRANSFER_ENCODING).iter().next_back() {
        let chunked = te
            .to_str()
            .ok()
            .and_then(|v| v.rsplit(',').next())
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        if !chunked {
            // Repaired as hyper repairs it: `chunked` appended to the last value.
            let mut repaired = te.as_bytes().to_vec();
            repaired.extend_from_slice(b", chunked");
            if let Ok(v) = HeaderValue::from_bytes(&repaired) {
                let mut all: Vec<HeaderValue> =
                    headers.get_all(TRANSFER_ENCODING).iter().cloned().collect();
                all.pop();
                all.push(v);
                headers.remove(TRANSFER_ENCODING);
                for v in all {
                    headers.append(TRANSFER_ENCODING, v);
                }
            }
        }
        headers.remove(CONTENT_LENGTH);
        return Framing::Chunked;
    }
    if let Some(n) = length {
        return Framing::Length(n);
    }
    match body.size_hint().exact() {
        Some(n) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
            Framing::Length(n)
        }
        None if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => {
            Framing::Length(0)
        }
        None => {
            headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            headers.remove(CONTENT_LENGTH);
            Framing::Chunked
        }
    }
}

/// Every `Content-Length` value, when they all agree on one valid length.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for part in value.to_str().ok()?.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u64 = part.parse().ok()?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        }
    }
    length
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::Request;
    use http_body_util::{BodyExt, Empty, Full};

    use super::*;

    fn boxed<B>(body: B) -> ReqBody
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        body.map_err(Into::into).boxed_unsync()
    }

    /// Everything the request puts on the wire, written into a vector.
    async fn wire(req: Request<ReqBody>) -> Result<String, WriteError> {
        let (parts, body) = req.into_parts();
        let mut out = Outgoing::new(parts, body);
        let mut sink: Vec<u8> = Vec::new();
        std::future::poll_fn(|cx| out.poll_write(&mut sink, cx)).await?;
        Ok(String::from_utf8_lossy(&sink).into_owned())
    }

    /// A body of unknown length sending `chunks`.
    struct Chunks(std::collections::VecDeque<&'static str>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(http_body::Frame::data(Bytes::from_static(c.as_bytes())))),
            )
        }
    }

    fn stream(chunks: &[&'static str]) -> ReqBody {
        boxed(Chunks(chunks.iter().copied().collect()))
    }

    #[tokio::test]
    async fn a_sized_body_goes_out_with_its_length() {
        let req = Request::post("/v1/chat/completions?x=1")
            .header("host", "up")
            .header("content-type", "application/json")
            .body(boxed(Full::new(Bytes::from_static(b"{\"a\":1}"))))
            .unwrap();
        assert_eq!(
            wire(req).await.unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: up\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
        );
    }

    #[tokio::test]
    async fn a_body_of_unknown_length_is_chunked_and_get_has_none() {
        let req = Request::post("/p")
            .body(stream(&["ab", "", "cde"]))
            .unwrap();
        assert_eq!(
            wire(req).await.unwrap(),
            "POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
        );
        let req = Request::get("/")
            .body(boxed(Empty::<Bytes>::new()))
            .unwrap();
        assert_eq!(wire(req).await.unwrap(), "GET / HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn a_body_that_breaks_its_length_fails() {
        let req = Request::post("/p")
            .header("content-length", "3")
            .body(stream(&["ab", "cd"]))
            .unwrap();
        assert!(matches!(wire(req).await, Err(WriteError::Length)));
        let req = Request::post("/p")
            .header("content-length", "5")
            .body(stream(&["ab"]))
            .unwrap();
        assert!(matches!(wire(req).await, Err(WriteError::Length)));
    }

    #[tokio::test]
    async fn the_head_is_the_one_hypers_client_writes() {
        // The same request through hyper's client connection, against what it wrote.
        let build = || {
            Request::post("/v1/completions")
                .header("host", "127.0.0.1:9")
                .header("x-a", "1")
                .header("x-a", "2")
                .header("content-length", "2")
                .body(boxed(Full::new(Bytes::from_static(b"hi"))))
                .unwrap()
        };
        let ours = wire(build()).await.unwrap();
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
                .await
                .unwrap();
        tokio::spawn(conn);
        tokio::spawn(async move { send.send_request(build()).await });
        let mut theirs = vec![0u8; ours.len()];
        tokio::io::AsyncReadExt::read_exact(&mut server, &mut theirs)
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&theirs), ours);
    }
}
