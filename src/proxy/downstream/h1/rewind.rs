//! The connection's I/O with the bytes already read put back in front, for a connection
//! handed over to hyper's server (an upgrade) after its request head was read.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, ReadBuf};

pub struct Rewind<IO> {
    prefix: Bytes,
    io: IO,
}

impl<IO> Rewind<IO> {
    pub fn new(prefix: Bytes, io: IO) -> Rewind<IO> {
        Rewind { prefix, io }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

write_through!(impl [IO: tokio::io::AsyncWrite + Unpin] for Rewind<IO>, |this| Pin::new(&mut this.get_mut().io));
