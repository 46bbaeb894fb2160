//! The SSE framer: the same events, end-of-stream verdict and overflow flag whatever the
//! chunking; no event's data over the size cap. A non-zero flag nibble sets a small cap
//! (so the overflow paths run), else the default one.

#![no_main]

use goodput::decode::SseFramer;
use goodput::decode::sse::DEFAULT_MAX_EVENT_BYTES;
use goodput_fuzz::Input;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq, Eq)]
struct Framed {
    events: Vec<(String, Vec<u8>)>,
    discarded: bool,
    overflowed: bool,
}

fn frame(chunks: &[&[u8]], max: usize) -> Framed {
    let mut framer = SseFramer::with_max_event_bytes(max);
    let mut events = Vec::new();
    for chunk in chunks {
        framer.push(chunk, |e| {
            events.push((e.event.to_owned(), e.data.to_vec()))
        });
    }
    let discarded = framer.finish();
    Framed {
        events,
        discarded,
        overflowed: framer.overflowed(),
    }
}

fuzz_target!(|data: &[u8]| {
    let input = Input::new(data);
    let max = match input.flags {
        0 => DEFAULT_MAX_EVENT_BYTES,
        f => usize::from(f) * 8,
    };
    let whole = frame(&[input.payload], max);
    assert_eq!(
        whole,
        frame(&input.chunks(), max),
        "chunking changed the events"
    );
    for (event, data) in &whole.events {
        assert!(!event.is_empty());
        assert!(
            data.len() < max,
            "{} bytes of data under a cap of {max}",
            data.len()
        );
    }
});
