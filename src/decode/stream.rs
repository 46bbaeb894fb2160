//! The per-response streaming decoder used on the data path: SSE framing plus the
//! dialect's event classification, reporting one [`EventInfo`] per complete event.
//!
//! It never fails: whatever cannot be decoded only sets [`StreamDecoder::is_broken`], so the
//! record can say `decode: unknown` while the bytes flow on untouched.

use crate::decode::openai::classify_chunk;
use crate::decode::sse::{SseEvent, SseFramer};
use crate::decode::{Api, EventInfo, StreamKind};

/// Incremental decoder for one streamed response.
#[derive(Debug)]
pub struct StreamDecoder {
    framer: SseFramer,
    broken: bool,
}

impl StreamDecoder {
    /// A decoder for this API and framing, or `None` when there is no decoder for the pair
    /// (the dialect is chosen, never assumed).
    pub fn new(api: Api, kind: StreamKind) -> Option<StreamDecoder> {
        match (api, kind) {
            (Api::ChatCompletions | Api::Completions, StreamKind::Sse) => Some(StreamDecoder {
                framer: SseFramer::new(),
                broken: false,
            }),
            _ => None,
        }
    }

    /// Feeds the next chunk of the body; `on_event` is called once per event that this chunk
    /// completes, in stream order.
    ///
    /// Every dispatched SSE event is reported, so the caller sees each event's arrival;
    /// events of other types (`event: ping`) and undecodable ones report as empty.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(EventInfo)) {
        let Self { framer, broken } = self;
        framer.push(chunk, |event| on_event(classify(event, broken)));
    }

    /// Ends the stream. An event not closed by its blank line is discarded (WHATWG), so for
    /// SSE nothing is reported here; the callback is kept so every framing ends alike.
    pub fn finish(&mut self, _on_event: impl FnMut(EventInfo)) {
        self.framer.finish();
    }

    /// Whether something in the stream could not be decoded (or was too large to).
    pub fn is_broken(&self) -> bool {
        self.broken || self.framer.overflowed()
    }
}

fn classify(event: SseEvent<'_>, broken: &mut bool) -> EventInfo {
    match event.event {
        "message" => classify_chunk(event.data).unwrap_or_else(|_| {
            *broken = true;
            EventInfo::default()
        }),
        "error" => EventInfo {
            error: true,
            ..EventInfo::default()
        },
        _ => EventInfo::default(),
    }
}
