//! The NDJSON framer: the same lines and overflow flag whatever the chunking; no line
//! holds a line end, is blank or exceeds the size cap. A non-zero flag nibble sets a small
//! cap (so the overflow paths run), else the default one.

#![no_main]

use goodput::decode::NdjsonFramer;
use goodput::decode::ndjson::DEFAULT_MAX_LINE_BYTES;
use goodput_fuzz::Input;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq, Eq)]
struct Framed {
    lines: Vec<Vec<u8>>,
    last: Vec<Vec<u8>>,
    overflowed: bool,
}

fn frame(chunks: &[&[u8]], max: usize) -> Framed {
    let mut framer = NdjsonFramer::with_max_line_bytes(max);
    let mut lines = Vec::new();
    for chunk in chunks {
        framer.push(chunk, |l| lines.push(l.to_vec()));
    }
    let mut last = Vec::new();
    framer.finish(|l| last.push(l.to_vec()));
    Framed {
        lines,
        last,
        overflowed: framer.overflowed(),
    }
}

fuzz_target!(|data: &[u8]| {
    let input = Input::new(data);
    let max = match input.flags {
        0 => DEFAULT_MAX_LINE_BYTES,
        f => usize::from(f) * 8,
    };
    let whole = frame(&[input.payload], max);
    assert_eq!(
        whole,
        frame(&input.chunks(), max),
        "chunking changed the lines"
    );
    assert!(whole.last.len() <= 1);
    for line in whole.lines.iter().chain(&whole.last) {
        assert!(!line.contains(&b'\n'));
        assert!(!line.trim_ascii().is_empty());
        assert!(line.len() <= max);
    }
});
