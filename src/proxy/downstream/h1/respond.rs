//! Writing a response: the head and then each body frame from its own buffer, chunk
//! framing around it where the length is not known, gathered while a write waits for more
//! and flushed frame by frame.

use super::*;

/// A coalesced write waits for more while under this many bytes.
const ENOUGH_BYTES: usize = 32 << 10;

/// What is on its way to the client: bytes copied into `flat` (the head, chunk-size
/// lines, frames gathered while a write waited), then a frame written from its own
/// buffer, then that frame's chunk end.
struct Out {
    flat: Vec<u8>,
    flat_at: usize,
    data: Bytes,
    tail: &'static [u8],
}

impl Out {
    fn pending(&self) -> bool {
        self.flat_at < self.flat.len() || !self.data.is_empty() || !self.tail.is_empty()
    }

    fn advance(&mut self, mut n: usize) {
        let flat = (self.flat.len() - self.flat_at).min(n);
        self.flat_at += flat;
        n -= flat;
        let data = self.data.len().min(n);
        self.data.advance(data);
        n -= data;
        self.tail = &self.tail[n.min(self.tail.len())..];
        if self.flat_at == self.flat.len() && self.flat_at > 0 {
            self.flat.clear();
            self.flat_at = 0;
        }
    }

    /// Moves the frame written from its own buffer into `flat` (to gather more behind it).
    fn flatten(&mut self) {
        self.flat.extend_from_slice(&self.data);
        self.data = Bytes::new();
        self.flat.extend_from_slice(self.tail);
        self.tail = b"";
    }

    /// Adds a frame: zero-copy when nothing waits, copied behind what waits otherwise.
    fn frame(&mut self, encoder: Encoder, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let copy = !self.data.is_empty() || !self.tail.is_empty();
        if copy {
            self.flatten();
        }
        let tail: &'static [u8] = if encoder == Encoder::Chunked {
            let mut hex = [0u8; 16];
            let mut len = data.len();
            let mut i = hex.len();
            loop {
                i -= 1;
                hex[i] = b"0123456789ABCDEF"[len & 15];
                len >>= 4;
                if len == 0 {
                    break;
                }
            }
            self.flat.extend_from_slice(&hex[i..]);
            self.flat.extend_from_slice(b"\r\n");
            b"\r\n"
        } else {
            b""
        };
        if copy {
            self.flat.extend_from_slice(&data);
            self.flat.extend_from_slice(tail);
        } else {
            self.data = data;
            self.tail = tail;
        }
    }

    fn queued(&self) -> usize {
        self.flat.len() - self.flat_at + self.data.len() + self.tail.len()
    }
}

/// Writes the head and the body; `Ok(true)` when the response ended cleanly, `Ok(false)`
/// when the client left.
pub(super) async fn respond<IO, B>(
    conn: &Conn<IO>,
    head: Vec<u8>,
    encoder: Encoder,
    mut body: Pin<Box<B>>,
    eof: &mut bool,
    half_close: bool,
) -> Result<bool, ConnError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut out = Out {
        flat: head,
        flat_at: 0,
        data: Bytes::new(),
        tail: b"",
    };
    let mut remaining = match encoder {
        Encoder::Length(n) => Some(n),
        _ => None,
    };
    // A body that may carry no bytes is not read at all (HEAD, 204, 304), as hyper drops it.
    let mut ended = remaining == Some(0);
    let mut flushed = false;
    let finish = |out: &mut Out, remaining: Option<u64>| -> Result<(), ConnError> {
        match (encoder, remaining) {
            (Encoder::Chunked, _) => {
                out.flatten();
                out.flat.extend_from_slice(b"0\r\n\r\n");
                Ok(())
            }
            (Encoder::Length(_), Some(n)) if n > 0 => Err(ConnError::Body(
                "body shorter than its content-length".into(),
            )),
            _ => Ok(()),
        }
    };
    let take = |out: &mut Out,
                remaining: &mut Option<u64>,
                frame: http_body::Frame<Bytes>|
     -> Result<(), ConnError> {
        let Ok(data) = frame.into_data() else {
            // Trailers: hyper writes them only where a `Trailer` field allows; dropped.
            return Ok(());
        };
        if let Some(left) = remaining.as_mut() {
            let n = data.len() as u64;
            if n > *left {
                return Err(ConnError::Body(
                    "body longer than its content-length".into(),
                ));
            }
            *left -= n;
        }
        out.frame(encoder, data);
        Ok(())
    };
    if ended {
        finish(&mut out, remaining)?;
    }
    let mut first = true;
    poll_fn(|cx| {
        if std::mem::take(&mut first) && !ended {
            // The head goes out with the first frame when it is ready with it.
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Err(e) = take(&mut out, &mut remaining, frame) {
                        return Poll::Ready(Err(e));
                    }
                }
                Poll::Ready(None) => {
                    ended = true;
                    if let Err(e) = finish(&mut out, remaining) {
                        return Poll::Ready(Err(e));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(ConnError::Body(e.into()))),
                Poll::Pending => {}
            }
        }
        loop {
            if out.pending() {
                let mut shared = lock(conn);
                let Some(io) = shared.io.as_mut() else {
                    return Poll::Ready(Ok(false));
                };
                let parts = [
                    IoSlice::new(&out.flat[out.flat_at..]),
                    IoSlice::new(&out.data),
                    IoSlice::new(out.tail),
                ];
                match Pin::new(io).poll_write_vectored(cx, &parts) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(std::io::Error::from(
                            std::io::ErrorKind::WriteZero,
                        )
                        .into()));
                    }
                    Poll::Ready(Ok(n)) => {
                        out.advance(n);
                        flushed = false;
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {
                        drop(shared);
                        // Gather what the body has ready behind the waiting write.
                        if !ended && out.queued() < ENOUGH_BYTES {
                            match body.as_mut().poll_frame(cx) {
                                Poll::Ready(Some(Ok(frame))) => {
                                    if let Err(e) = take(&mut out, &mut remaining, frame) {
                                        return Poll::Ready(Err(e));
                                    }
                                    out.flatten();
                                    continue;
                                }
                                Poll::Ready(None) => {
                                    ended = true;
                                    if let Err(e) = finish(&mut out, remaining) {
                                        return Poll::Ready(Err(e));
                                    }
                                    out.flatten();
                                    continue;
                                }
                                Poll::Ready(Some(Err(e))) => {
                                    return Poll::Ready(Err(ConnError::Body(e.into())));
                                }
                                Poll::Pending => {}
                            }
                        }
                        if client_gone(conn, cx, eof, half_close) {
                            return Poll::Ready(Ok(false));
                        }
                        return Poll::Pending;
                    }
                }
            }
            if !ended {
                // Asked for more before the flush, as hyper does: a frame counts as
                // delivered once a flush completes after the body was polled again.
                match body.as_mut().poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Err(e) = take(&mut out, &mut remaining, frame) {
                            return Poll::Ready(Err(e));
                        }
                        continue;
                    }
                    Poll::Ready(None) => {
                        ended = true;
                        if let Err(e) = finish(&mut out, remaining) {
                            return Poll::Ready(Err(e));
                        }
                        continue;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(ConnError::Body(e.into())));
                    }
                    Poll::Pending => {}
                }
            }
            if !flushed {
                let mut shared = lock(conn);
                let Some(io) = shared.io.as_mut() else {
                    return Poll::Ready(Ok(false));
                };
                match Pin::new(io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => flushed = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if ended {
                return Poll::Ready(Ok(true));
            }
            if client_gone(conn, cx, eof, half_close) {
                return Poll::Ready(Ok(false));
            }
            return Poll::Pending;
        }
    })
    .await
}
