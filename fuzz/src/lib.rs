//! What the fuzz targets share: how one fuzz input becomes a payload plus a way to cut it
//! into chunks, and the stream-decoder check every dialect target runs.
//!
//! # Input layout
//! Byte 0 is a header: its low 4 bits say how many *knob* bytes follow (0–15), its high 4
//! bits are flags a target may use (a small size cap, for one). The knobs give the chunk
//! sizes, cycled (0 is an empty chunk); the rest is the payload. A payload prefixed with a
//! single `0x00` is fed whole, which is how the fixtures seed the corpora (`fuzz/run.sh`).
//!
//! Each target decodes the payload fed whole and fed in those chunks and asserts the two
//! agree: the decoders promise the same result whatever the chunking.
//!
//! [`http1`] is the exception: the `http_exchange` and `h1_server` targets' input is raw
//! HTTP/1 bytes, and that module splits and reads them; [`exchange`] runs them through a
//! proxy.

pub mod exchange;
pub mod http1;

use goodput::decode::{
    Api, EventInfo, NdjsonFramer, SseFramer, StreamDecoder, StreamKind, TextBuf,
    parse_response_body, response_body_text,
};

/// One fuzz input, split as the module docs describe.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The high 4 bits of the header byte.
    pub flags: u8,
    pub knobs: &'a [u8],
    pub payload: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        let Some((&header, rest)) = data.split_first() else {
            return Input {
                flags: 0,
                knobs: &[],
                payload: &[],
            };
        };
        let (knobs, payload) = rest.split_at(usize::from(header & 0x0f).min(rest.len()));
        Input {
            flags: header >> 4,
            knobs,
            payload,
        }
    }

    /// The payload cut at the sizes the knobs give (the whole payload when there are none).
    pub fn chunks(&self) -> Vec<&'a [u8]> {
        let sizes = self.knobs;
        if sizes.iter().all(|&s| s == 0) {
            return vec![self.payload];
        }
        let mut chunks = Vec::new();
        let mut rest = self.payload;
        for &size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, tail) = rest.split_at(usize::from(size).min(rest.len()));
            chunks.push(chunk);
            rest = tail;
        }
        chunks
    }
}

/// Everything a stream decoder reports for one body.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded {
    pub fed: Vec<EventInfo>,
    pub finished: Vec<EventInfo>,
    pub broken: bool,
    pub text: Option<TextBuf>,
}

/// Runs a stream decoder for `api` over `chunks`, collecting text up to `text_limit` if set.
pub fn decode(
    api: Api,
    kind: StreamKind,
    chunks: &[&[u8]],
    text_limit: Option<usize>,
) -> Option<Decoded> {
    let mut decoder = StreamDecoder::new(api, kind)?;
    if let Some(limit) = text_limit {
        decoder.collect_text(limit);
    }
    let mut fed = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk, |e| fed.push(e));
    }
    let mut finished = Vec::new();
    decoder.finish(|e| finished.push(e));
    Some(Decoded {
        fed,
        finished,
        broken: decoder.is_broken(),
        text: decoder.take_text(),
    })
}

/// How many events (SSE) or non-blank lines (NDJSON) the framer finds in `payload`; the
/// decoder must report exactly one `EventInfo` per framed event while feeding.
fn framed_events(kind: StreamKind, payload: &[u8]) -> usize {
    let mut n = 0;
    match kind {
        StreamKind::Sse => SseFramer::new().push(payload, |_| n += 1),
        StreamKind::Ndjson => NdjsonFramer::new().push(payload, |_| n += 1),
        StreamKind::Json | StreamKind::Other => {}
    }
    n
}

/// The check of one dialect: its stream decoder over the payload fed whole and chunked, with
/// and without text collection, and its non-streaming body reader over the same bytes.
pub fn check_dialect(api: Api, kind: StreamKind, data: &[u8]) {
    let input = Input::new(data);
    let payload = input.payload;
    // A small limit (from the flags) exercises cutting the text at a character boundary.
    let limit = if input.flags == 0 {
        goodput::decode::text::DEFAULT_TEXT_LIMIT
    } else {
        usize::from(input.flags) * 4
    };
    let chunks = input.chunks();
    let Some(whole) = decode(api, kind, &[payload], Some(limit)) else {
        return;
    };
    let chunked = decode(api, kind, &chunks, Some(limit));
    assert_eq!(
        Some(&whole),
        chunked.as_ref(),
        "chunking changed the result"
    );
    let plain = decode(api, kind, &chunks, None);
    assert_eq!(
        plain.as_ref().map(|d| (&d.fed, &d.finished, d.broken)),
        Some((&whole.fed, &whole.finished, whole.broken)),
        "collecting text changed the events"
    );
    assert!(plain.is_some_and(|d| d.text.is_none()));

    assert_eq!(whole.fed.len(), framed_events(kind, payload));
    for e in whole.fed.iter().chain(&whole.finished) {
        assert!(
            e.content || !e.answer,
            "an answer event that is not content: {e:?}"
        );
    }
    if let Some(text) = &whole.text {
        assert!(text.text().len() <= limit);
        // Text is dropped once the stream reports its output count.
        let counted = whole
            .fed
            .iter()
            .chain(&whole.finished)
            .any(|e| e.usage.is_some_and(|u| u.output_tokens.is_some()));
        assert!(!counted, "text kept after the output token count arrived");
    }

    let _ = parse_response_body(api, payload);
    if let Some(text) = response_body_text(api, payload, limit) {
        assert!(text.text().len() <= limit);
    }
}
