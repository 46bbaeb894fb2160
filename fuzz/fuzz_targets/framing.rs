//! The relay's framing observer (`proxy::Framing`): the same payload, bytes used and
//! verdict whatever the cutting into reads; payload ranges inside their read, in order and
//! never more than the bytes used; a violation inside its read; nothing read after the end
//! or a violation. The flags nibble picks the delimiter: 0–9 chunked, 10–13 a length of
//! 0, ½, 1 or 1½ times the payload's, 14–15 the close.

#![no_main]

use goodput::proxy::{Delimiter, Framing, Violation};
use goodput_fuzz::Input;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq, Eq)]
struct Observed {
    payload: Vec<u8>,
    used: usize,
    done: bool,
    broken: Option<Violation>,
}

fn observe(delimiter: Delimiter, pieces: &[&[u8]]) -> Observed {
    let mut framing = Framing::new(delimiter);
    let mut seen = Observed {
        payload: Vec::new(),
        used: 0,
        done: framing.is_done(),
        broken: None,
    };
    for piece in pieces {
        if seen.done || seen.broken.is_some() {
            // Nothing more is read.
            let again = framing.feed(piece, |_| panic!("payload after the end"));
            match again {
                Ok(fed) => assert_eq!((fed.used, fed.done), (0, true)),
                Err(b) => assert_eq!((b.at, Some(b.violation)), (0, seen.broken)),
            }
            continue;
        }
        let mut end = 0;
        let fed = framing.feed(piece, |r| {
            assert!(
                r.start >= end && r.start < r.end && r.end <= piece.len(),
                "{r:?}"
            );
            end = r.end;
            seen.payload.extend_from_slice(&piece[r]);
        });
        match fed {
            Ok(fed) => {
                assert!(end <= fed.used && fed.used <= piece.len());
                assert!(fed.done || fed.used == piece.len());
                seen.used += fed.used;
                seen.done = fed.done;
            }
            Err(b) => {
                assert!(end <= b.at && b.at < piece.len(), "{b:?}");
                seen.used += b.at;
                seen.broken = Some(b.violation);
            }
        }
    }
    if !seen.done && seen.broken.is_none() {
        match framing.eof() {
            Ok(()) => seen.done = true,
            Err(v) => seen.broken = Some(v),
        }
    }
    assert!(seen.payload.len() <= seen.used);
    assert_eq!(framing.is_done(), seen.done);
    seen
}

fuzz_target!(|data: &[u8]| {
    let input = Input::new(data);
    let len = input.payload.len() as u64;
    let delimiter = match input.flags {
        0..=9 => Delimiter::Chunked,
        f @ 10..=13 => Delimiter::Length(len * u64::from(f - 10) / 2),
        _ => Delimiter::Close,
    };
    let whole = observe(delimiter, &[input.payload]);
    assert_eq!(
        whole,
        observe(delimiter, &input.chunks()),
        "the reads changed the result"
    );
    match delimiter {
        Delimiter::Length(n) if whole.broken.is_none() => {
            assert_eq!(whole.payload.len() as u64, n)
        }
        Delimiter::Close => assert_eq!(whole.payload, input.payload),
        _ => {}
    }
});
