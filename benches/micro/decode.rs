//! SSE framing and the per-dialect stream decoders, fed the way the data path feeds them:
//! one `push`/`feed` per body frame read from the upstream.

use std::hint::black_box;

use bytes::Bytes;
use goodput::decode::{Api, SseFramer, StreamDecoder, StreamKind, text::DEFAULT_TEXT_LIMIT};

use crate::cases::Case;
use crate::corpus::{self, FIXTURES};

pub fn cases() -> Vec<Case> {
    let events = corpus::openai_events();
    let mut cases = vec![
        framer("sse/openai 1 event per read", events.clone()),
        framer("sse/openai 16 KiB reads", corpus::reads(&events, 16 << 10)),
        framer(
            "sse/openai 97 B reads (split events)",
            corpus::reads(&events, 97),
        ),
        decoder(
            "decoder/openai_chat 100 tokens",
            "/v1/chat/completions",
            false,
            events.clone(),
            None,
        ),
        decoder(
            "decoder/openai_chat 100 tokens +text",
            "/v1/chat/completions",
            false,
            events,
            Some(DEFAULT_TEXT_LIMIT),
        ),
    ];
    for f in FIXTURES {
        let terminator: &[u8] = if f.ndjson { b"\n" } else { b"\n\n" };
        let reads = corpus::split_events(f.bytes, terminator);
        let name: &'static str = Box::leak(format!("decoder/{} fixture", f.name).into_boxed_str());
        cases.push(decoder(name, f.path, f.ndjson, reads, None));
    }
    cases
}

fn framer(name: &'static str, reads: Vec<Bytes>) -> Case {
    let mut framer = SseFramer::new();
    let mut events = 0u64;
    for r in &reads {
        framer.push(r, |_| events += 1);
    }
    framer.finish();
    let bytes = corpus::total_bytes(&reads);
    Case::new(name, events, bytes, "stream", move || {
        for r in &reads {
            framer.push(black_box(r), |e| {
                black_box(e);
            });
        }
        framer.finish();
    })
}

fn decoder(
    name: &'static str,
    path: &str,
    ndjson: bool,
    reads: Vec<Bytes>,
    text: Option<usize>,
) -> Case {
    let kind = if ndjson {
        StreamKind::Ndjson
    } else {
        StreamKind::Sse
    };
    let api = Api::from_path(path);
    let fresh = move || {
        let mut d = StreamDecoder::new(api, kind);
        if let (Some(d), Some(limit)) = (d.as_mut(), text) {
            d.collect_text(limit);
        }
        d
    };
    let mut events = 0u64;
    if let Some(mut d) = fresh() {
        for r in &reads {
            d.feed(r, |_| events += 1);
        }
        d.finish(|_| events += 1);
    }
    let bytes = corpus::total_bytes(&reads);
    // A decoder per stream, as per request on the data path.
    Case::new(name, events.max(1), bytes, "stream", move || {
        if let Some(mut d) = fresh() {
            for r in &reads {
                d.feed(black_box(r), |e| {
                    black_box(e);
                });
            }
            d.finish(|e| {
                black_box(e);
            });
            black_box(d.take_text());
        }
    })
}
