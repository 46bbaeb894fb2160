//! The hook through which a request's body, once complete, can be copied elsewhere (the
//! shadow, `crate::shadow`). The measurement layer asks a [`Mirror`] once per request,
//! at its head, whether a copy is wanted; the request body tap hands the body's chunks
//! (refcounted handles, already kept for inspection) to the [`MirrorTicket`] when the
//! body is complete. Nothing is copied, awaited or allocated per chunk on the way.

use std::time::Instant;

use bytes::Bytes;

use crate::decode::Api;

/// What the layer knows of a request when it asks for a copy.
#[derive(Debug)]
pub struct MirrorHead<'a> {
    pub parts: &'a http::request::Parts,
    /// The request's id (the `x-request-id` it carries upstream).
    pub id: &'a str,
    pub api: Api,
    /// Salted hash of the tenant header, for class matching.
    pub tenant: Option<u64>,
    pub t_arrival: Instant,
}

/// Decides, per request head, whether a copy is taken.
pub trait Mirror: Send + Sync + std::fmt::Debug {
    /// A ticket when this request is to be copied; `None` costs nothing further.
    fn ticket(&self, head: &MirrorHead<'_>) -> Option<Box<dyn MirrorTicket>>;
}

/// Why a body taken a ticket for was not handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmirrored {
    /// Larger than `measure.request_inspect_limit`: its chunks were not kept.
    TooLarge,
    /// The client's body failed or the request ended before the body did.
    Incomplete,
}

/// One request's copy, waiting for the body.
pub trait MirrorTicket: Send {
    /// Body bytes of the primary's answer kept (as handles to its frames, nothing copied)
    /// for the copy's answers to be compared with it off the data path; 0 keeps none.
    fn answer_limit(&self) -> u64 {
        0
    }
    /// The body is complete; `chunks` are handles to all of it, in order.
    fn body_complete(self: Box<Self>, chunks: &[Bytes]);
    /// The body will not be complete, or was not kept.
    fn abandon(self: Box<Self>, why: Unmirrored);
}
