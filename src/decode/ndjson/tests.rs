//! The NDJSON framer: line ends, blank lines, the unterminated last line, buffer reuse, the
//! size cap, and a property test that chunking never changes the lines.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

fn feed(framer: &mut NdjsonFramer, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for chunk in chunks {
        framer.push(chunk, |line| out.push(line.to_vec()));
    }
    out
}

/// Feeds the chunks and ends the stream, as the decoder does.
fn lines(framer: &mut NdjsonFramer, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut out = feed(framer, chunks);
    framer.finish(|line| out.push(line.to_vec()));
    out
}

fn parse(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    lines(&mut NdjsonFramer::new(), chunks)
}

fn owned(lines: &[&str]) -> Vec<Vec<u8>> {
    lines.iter().map(|l| l.as_bytes().to_vec()).collect()
}

#[test]
fn lf_and_crlf_end_lines() {
    assert_eq!(
        parse(&[b"{\"a\":1}\n{\"b\":2}\n"]),
        owned(&["{\"a\":1}", "{\"b\":2}"])
    );
    assert_eq!(
        parse(&[b"{\"a\":1}\r\n{\"b\":2}\r\n"]),
        owned(&["{\"a\":1}", "{\"b\":2}"])
    );
}

#[test]
fn cr_split_from_its_lf_is_still_dropped() {
    assert_eq!(
        parse(&[b"{\"a\":1}\r", b"\n{\"b\":2}\n"]),
        owned(&["{\"a\":1}", "{\"b\":2}"])
    );
}

#[test]
fn only_one_trailing_cr_is_dropped_and_lone_cr_is_not_a_line_end() {
    assert_eq!(parse(&[b"a\r\r\n"]), owned(&["a\r"]));
    assert_eq!(parse(&[b"a\rb\n"]), owned(&["a\rb"]));
}

#[test]
fn blank_lines_are_not_records() {
    assert_eq!(parse(&[b"\n\r\n  \n{}\n\t\r\n\n"]), owned(&["{}"]));
}

#[test]
fn line_is_reported_by_the_chunk_that_completes_it() {
    let mut framer = NdjsonFramer::new();
    assert!(feed(&mut framer, &[b"{\"response\":\"he"]).is_empty());
    assert!(feed(&mut framer, &[b"llo\"}"]).is_empty());
    assert_eq!(
        feed(&mut framer, &[b"\n{"]),
        owned(&["{\"response\":\"hello\"}"])
    );
}

#[test]
fn last_line_without_line_end_is_reported_at_finish() {
    let mut framer = NdjsonFramer::new();
    assert_eq!(feed(&mut framer, &[b"{}\n{\"done\":true}"]), owned(&["{}"]));
    let mut rest = Vec::new();
    framer.finish(|l| rest.push(l.to_vec()));
    assert_eq!(rest, owned(&["{\"done\":true}"]));
}

#[test]
fn finish_resets_for_a_new_stream() {
    let mut framer = NdjsonFramer::new();
    lines(&mut framer, &[b"{\"stale\""]);
    assert_eq!(lines(&mut framer, &[b"{}\n"]), owned(&["{}"]));
}

#[test]
fn whole_lines_are_reported_in_place() {
    let mut framer = NdjsonFramer::new();
    assert_eq!(feed(&mut framer, &[b"{}\n[]\r\n"]), owned(&["{}", "[]"]));
    // Only a line split across chunks may be copied into the carry-over buffer.
    assert_eq!(framer.line.capacity(), 0);
}

#[test]
fn buffer_is_reused_once_warm() {
    let mut framer = NdjsonFramer::new();
    let line = b"{\"message\":{\"role\":\"assistant\",\"content\":\"hello\"},\"done\":false}\n";
    let (head, tail) = line.split_at(line.len() / 2);
    let mut count = 0;
    framer.push(head, |_| count += 1);
    framer.push(tail, |_| count += 1);
    let (ptr, cap) = (framer.line.as_ptr(), framer.line.capacity());
    for _ in 0..1000 {
        framer.push(head, |_| count += 1);
        framer.push(tail, |_| count += 1);
    }
    assert_eq!(count, 1001);
    assert_eq!((framer.line.as_ptr(), framer.line.capacity()), (ptr, cap));
}

#[test]
fn oversized_lines_are_dropped_and_flagged_however_chunked() {
    let stream = b"0123456789abcdefg\nok\n";
    for size in [1, 3, 5, stream.len()] {
        let mut framer = NdjsonFramer::with_max_line_bytes(16);
        let chunks: Vec<&[u8]> = stream.chunks(size).collect();
        assert_eq!(
            lines(&mut framer, &chunks),
            owned(&["ok"]),
            "chunk size {size}"
        );
        assert!(framer.overflowed());
    }
    let mut framer = NdjsonFramer::with_max_line_bytes(16);
    assert_eq!(
        lines(&mut framer, &[b"0123456789", b"abcdef\n"]),
        owned(&["0123456789abcdef"])
    );
    assert!(!framer.overflowed());
}

#[test]
fn oversized_unterminated_line_is_not_reported_at_finish() {
    let mut framer = NdjsonFramer::with_max_line_bytes(4);
    assert!(lines(&mut framer, &[b"{}\n", b"0123", b"456"]) == owned(&["{}"]));
    assert!(framer.overflowed());
}

// ---- property: chunking never changes the lines ----

/// Line content never holds `\n`; it may hold `\r` in the middle, spaces and non-ASCII text.
fn content() -> impl Strategy<Value = String> {
    "[a-z{}\":, é\r]{0,16}"
}

#[derive(Debug, Clone)]
struct GenLine {
    text: String,
    crlf: bool,
}

fn gen_line() -> impl Strategy<Value = GenLine> {
    (content(), any::<bool>()).prop_map(|(text, crlf)| GenLine { text, crlf })
}

/// Renders the body and the lines a correct framer must report from it.
fn render(body: &[GenLine], last: &str, max: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut out = Vec::new();
    let mut expected = Vec::new();
    let mut expect = |raw: &[u8]| {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.len() <= max && !line.trim_ascii().is_empty() {
            expected.push(line.to_vec());
        }
    };
    for line in body {
        let mut raw = line.text.as_bytes().to_vec();
        if line.crlf {
            raw.push(b'\r');
        }
        expect(&raw);
        out.extend_from_slice(&raw);
        out.push(b'\n');
    }
    expect(last.as_bytes());
    out.extend_from_slice(last.as_bytes());
    (out, expected)
}

fn split_at_all<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for &cut in cuts {
        pieces.push(&bytes[start..cut]);
        start = cut;
    }
    pieces.push(&bytes[start..]);
    pieces
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn chunking_never_changes_lines(
        body in prop::collection::vec(gen_line(), 0..12),
        last in content(),
        max in 4usize..40,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let (bytes, expected) = render(&body, &last, max);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();

        let whole = lines(&mut NdjsonFramer::with_max_line_bytes(max), &[&bytes]);
        prop_assert_eq!(&whole, &expected);

        let split = lines(&mut NdjsonFramer::with_max_line_bytes(max), &split_at_all(&bytes, &cuts));
        prop_assert_eq!(&split, &expected);

        let single: Vec<&[u8]> = bytes.chunks(1).collect();
        prop_assert_eq!(&lines(&mut NdjsonFramer::with_max_line_bytes(max), &single), &expected);
    }
}
