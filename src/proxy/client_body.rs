//! The client's request body as the forwarding service receives it, whichever HTTP/1
//! server read it: hyper's (`Incoming`, also every HTTP/2 and TLS request) or goodput's
//! own (`server.http1_own`, [`super::downstream`]'s `h1`). A leaf both wings name: the
//! upstream clients are typed on it, the client side builds it.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;

use crate::BoxError;

/// A request body from a client connection.
pub enum ClientSide {
    /// Read by hyper's server.
    Hyper(Incoming),
    /// Read by goodput's own HTTP/1.1 server connection (one box per request).
    Own(UnsyncBoxBody<Bytes, BoxError>),
}

impl From<Incoming> for ClientSide {
    fn from(body: Incoming) -> ClientSide {
        ClientSide::Hyper(body)
    }
}

impl Body for ClientSide {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientSide::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(|e| e.into()),
            ClientSide::Own(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientSide::Hyper(b) => b.is_end_stream(),
            ClientSide::Own(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientSide::Hyper(b) => b.size_hint(),
            ClientSide::Own(b) => b.size_hint(),
        }
    }
}
