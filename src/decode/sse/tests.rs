//! The event-stream framer against the WHATWG rules, its buffer reuse and size cap, and a
//! property test that chunking never changes the events.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

type Owned = (String, Vec<u8>);

fn feed(framer: &mut SseFramer, chunks: &[&[u8]]) -> Vec<Owned> {
    let mut out = Vec::new();
    for chunk in chunks {
        framer.push(chunk, |ev| {
            out.push((ev.event.to_owned(), ev.data.to_vec()))
        });
    }
    out
}

fn parse(chunks: &[&[u8]]) -> Vec<Owned> {
    feed(&mut SseFramer::new(), chunks)
}

fn msg(data: &str) -> Owned {
    ("message".to_owned(), data.as_bytes().to_vec())
}

#[test]
fn lf_crlf_and_cr_all_end_lines() {
    for stream in [
        &b"data: a\ndata: b\n\n"[..],
        b"data: a\r\ndata: b\r\n\r\n",
        b"data: a\rdata: b\r\r",
        b"data: a\r\ndata: b\r\r\n",
    ] {
        assert_eq!(parse(&[stream]), vec![msg("a\nb")], "{stream:?}");
    }
}

#[test]
fn cr_at_chunk_end_then_lf_is_one_line_end() {
    // Counted twice, the LF would be a blank line and split this into two events.
    assert_eq!(
        parse(&[b"data: a\r", b"\ndata: b\r\n\r\n"]),
        vec![msg("a\nb")]
    );
    // An empty chunk in between must not forget the CR.
    assert_eq!(
        parse(&[b"data: a\r", b"", b"\ndata: b\n\n"]),
        vec![msg("a\nb")]
    );
    // The blank line itself split as CR | LF dispatches once, and the next event is intact.
    assert_eq!(
        parse(&[b"data: a\n\r", b"\ndata: b\n\n"]),
        vec![msg("a"), msg("b")]
    );
}

#[test]
fn cr_at_chunk_end_then_other_byte_is_a_line_end() {
    assert_eq!(parse(&[b"data: a\r", b"\r"]), vec![msg("a")]);
    assert_eq!(parse(&[b"data: a\r", b"data: b\r\r"]), vec![msg("a\nb")]);
}

#[test]
fn leading_bom_is_skipped_even_when_split() {
    let stream = b"\xEF\xBB\xBFdata: x\n\n";
    assert_eq!(parse(&[stream]), vec![msg("x")]);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(parse(&bytes), vec![msg("x")]);
}

#[test]
fn only_one_leading_bom_is_skipped() {
    // A second BOM becomes part of the field name, which then is not `data`.
    assert_eq!(parse(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"]), vec![]);
    assert_eq!(
        parse(&[b"data: x\n\n\xEF\xBB\xBFdata: y\n\n"]),
        vec![msg("x")]
    );
}

#[test]
fn partial_bom_bytes_are_not_lost() {
    // Dropping the held-back 0xEF would turn the field name into `data`.
    assert_eq!(parse(&[b"\xEFdata: x\n\n"]), vec![]);
    assert_eq!(parse(&[b"\xEF", b"data: x\n\n"]), vec![]);
    assert_eq!(parse(&[b"\xEF\xBB", b"\n", b"data: x\n\n"]), vec![msg("x")]);
}

#[test]
fn comments_are_ignored() {
    assert_eq!(parse(&[b": keep-alive\n\n"]), vec![]);
    assert_eq!(parse(&[b":\n\n"]), vec![]);
    assert_eq!(parse(&[b"data: a\n: ping\ndata: b\n\n"]), vec![msg("a\nb")]);
}

#[test]
fn exactly_one_space_after_colon_is_stripped() {
    assert_eq!(parse(&[b"data:x\n\n"]), vec![msg("x")]);
    assert_eq!(parse(&[b"data: x\n\n"]), vec![msg("x")]);
    assert_eq!(parse(&[b"data:  x \n\n"]), vec![msg(" x ")]);
    assert_eq!(parse(&[b"data:\tx\n\n"]), vec![msg("\tx")]);
    assert_eq!(parse(&[b"data: a: b\n\n"]), vec![msg("a: b")]);
}

#[test]
fn line_without_colon_is_field_with_empty_value() {
    assert_eq!(parse(&[b"data\n\n"]), vec![msg("")]);
    assert_eq!(parse(&[b"data\ndata\n\n"]), vec![msg("\n")]);
    assert_eq!(parse(&[b"event\ndata: x\n\n"]), vec![msg("x")]);
}

#[test]
fn data_lines_join_with_lf() {
    assert_eq!(
        parse(&[b"data: a\ndata:\ndata: b\n\n"]),
        vec![msg("a\n\nb")]
    );
    assert_eq!(parse(&[b"data: a\ndata:\n\n"]), vec![msg("a\n")]);
}

#[test]
fn event_without_data_is_not_dispatched_and_resets_type() {
    assert_eq!(parse(&[b"event: foo\n\n"]), vec![]);
    assert_eq!(parse(&[b"id: 7\nretry: 10\n\n"]), vec![]);
    assert_eq!(parse(&[b"event: foo\n\ndata: x\n\n"]), vec![msg("x")]);
}

#[test]
fn event_type_is_kept_and_reset_after_dispatch() {
    let events = parse(&[b"event: delta\ndata: x\n\ndata: y\n\nevent:\ndata: z\n\n"]);
    assert_eq!(
        events,
        vec![("delta".to_owned(), b"x".to_vec()), msg("y"), msg("z")]
    );
    // The last `event:` line wins.
    assert_eq!(
        parse(&[b"event: a\nevent: b\ndata: x\n\n"]),
        vec![("b".to_owned(), b"x".to_vec())]
    );
}

#[test]
fn id_retry_and_unknown_fields_do_not_disturb() {
    let events = parse(&[b"id: 1\nretry: soon\nfoo: bar\ndata: x\nid\nretry: 5\n\n"]);
    assert_eq!(events, vec![msg("x")]);
}

#[test]
fn field_names_are_exact() {
    assert_eq!(parse(&[b"Data: x\n\n data: y\n\ndata : z\n\n"]), vec![]);
}

#[test]
fn bytes_are_kept_and_event_type_is_lossy() {
    let events = parse(&[b"event: a\xFFb\ndata: \xFF\xFE\n\n"]);
    assert_eq!(events, vec![("a\u{FFFD}b".to_owned(), vec![0xFF, 0xFE])]);
}

#[test]
fn many_events_in_one_chunk_keep_order() {
    let events = parse(&[b"data: 1\n\ndata: 2\r\n\r\ndata: 3\r\r"]);
    assert_eq!(events, vec![msg("1"), msg("2"), msg("3")]);
}

#[test]
fn event_is_reported_by_the_chunk_that_completes_it() {
    let mut framer = SseFramer::new();
    assert_eq!(feed(&mut framer, &[b"data: he"]), vec![]);
    assert_eq!(feed(&mut framer, &[b"llo\n"]), vec![]);
    assert_eq!(feed(&mut framer, &[b"\ndata: x"]), vec![msg("hello")]);
}

#[test]
fn incomplete_trailing_event_is_discarded() {
    let mut framer = SseFramer::new();
    assert_eq!(
        feed(&mut framer, &[b"data: a\n\ndata: b\n"]),
        vec![msg("a")]
    );
    assert!(framer.finish());
    let mut framer = SseFramer::new();
    assert_eq!(feed(&mut framer, &[b"data: a\n\ndata: b"]), vec![msg("a")]);
    assert!(framer.finish());
    let mut framer = SseFramer::new();
    assert_eq!(feed(&mut framer, &[b"data: a\n\n: bye\n"]), vec![msg("a")]);
    assert!(!framer.finish());
}

#[test]
fn finish_resets_for_a_new_stream() {
    let mut framer = SseFramer::new();
    feed(&mut framer, &[b"event: x\ndata: stale\n", b"data: tail"]);
    framer.finish();
    assert_eq!(
        feed(&mut framer, &[b"\xEF\xBB\xBFdata: new\n\n"]),
        vec![msg("new")]
    );
}

#[test]
fn whole_lines_are_parsed_in_place() {
    let mut framer = SseFramer::new();
    let events = feed(&mut framer, &[b"event: e\ndata: a\n\ndata: b\r\n\r\n"]);
    assert_eq!(events, vec![("e".to_owned(), b"a".to_vec()), msg("b")]);
    // Only a line split across chunks may be copied into the carry-over buffer.
    assert_eq!(framer.line.capacity(), 0);
}

#[test]
fn a_one_line_event_in_one_chunk_is_not_copied() {
    let mut framer = SseFramer::new();
    let chunk = b"data: a\n\ndata:b\r\n\r\ndata: c\r\rdata: d\n\r";
    let mut seen = Vec::new();
    framer.push(chunk, |e| {
        // Borrowed from the chunk itself, not from the framer's event buffer.
        assert!(chunk.as_ptr_range().contains(&e.data.as_ptr()));
        seen.push((e.event.to_owned(), e.data.to_vec()));
    });
    assert_eq!(seen, vec![msg("a"), msg("b"), msg("c"), msg("d")]);
    assert_eq!(framer.event.data.capacity(), 0);
    // The CR that ended the chunk may be half of a CRLF: the LF opening the next chunk is
    // not another (empty) line.
    let events = feed(&mut framer, &[b"\ndata: e\n\n"]);
    assert_eq!(events, vec![msg("e")]);
    // Anything else goes the general way, with the same result.
    let events = feed(&mut framer, &[b"data: f\ndata: g\n\nevent: x\ndata: h\n\n"]);
    assert_eq!(events, vec![msg("f\ng"), ("x".to_owned(), b"h".to_vec())]);
}

#[test]
fn buffers_are_reused_once_warm() {
    let mut framer = SseFramer::new();
    let event = b"data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\n";
    let split = event.len() / 2;
    let (head, tail) = event.split_at(split);
    let mut count = 0;
    framer.push(head, |_| count += 1);
    framer.push(tail, |_| count += 1);
    let (line_ptr, line_cap) = (framer.line.as_ptr(), framer.line.capacity());
    let (data_ptr, data_cap) = (framer.event.data.as_ptr(), framer.event.data.capacity());
    for _ in 0..1000 {
        framer.push(head, |_| count += 1);
        framer.push(tail, |_| count += 1);
    }
    assert_eq!(count, 1001);
    assert_eq!(
        (framer.line.as_ptr(), framer.line.capacity()),
        (line_ptr, line_cap)
    );
    assert_eq!(
        (framer.event.data.as_ptr(), framer.event.data.capacity()),
        (data_ptr, data_cap)
    );
}

#[test]
fn oversized_data_is_dropped_and_flagged() {
    let mut framer = SseFramer::with_max_event_bytes(16);
    let events = feed(
        &mut framer,
        &[b"data: 0123456789\ndata: 0123456789\n\ndata: ok\n\n"],
    );
    assert_eq!(events, vec![msg("ok")]);
    assert!(framer.overflowed());
}

#[test]
fn oversized_split_line_is_dropped_and_flagged() {
    let mut framer = SseFramer::with_max_event_bytes(16);
    let events = feed(
        &mut framer,
        &[
            b"data: 0123",
            b"456789abcdef",
            b"ghij\n",
            b"\ndata: ok\n",
            b"\n",
        ],
    );
    assert_eq!(events, vec![msg("ok")]);
    assert!(framer.overflowed());
    let mut framer = SseFramer::with_max_event_bytes(16);
    assert_eq!(
        feed(&mut framer, &[b"data: 01234", b"56789\n\n"]),
        vec![msg("0123456789")]
    );
    assert!(!framer.overflowed());
}

/// Found by the `sse` fuzz target: a line over the cap whose data alone fits was kept when
/// it arrived in one chunk and dropped when split.
#[test]
fn oversized_line_is_dropped_whatever_the_chunking() {
    let stream: &[u8] = b"data: 0123456789AB\n\ndata: ok\n\n";
    for cut in 0..=stream.len() {
        let (a, b) = stream.split_at(cut);
        let mut framer = SseFramer::with_max_event_bytes(16);
        assert_eq!(feed(&mut framer, &[a, b]), vec![msg("ok")], "cut at {cut}");
        assert!(framer.overflowed(), "cut at {cut}");
    }
}

// ---- property: chunking never changes the events ----

#[derive(Debug, Clone)]
enum Line {
    Data { value: String, space: bool },
    Event { value: String, space: bool },
    Comment(String),
    Id(String),
    Retry(String),
}

#[derive(Debug, Clone)]
struct GenEvent {
    lines: Vec<Line>,
}

/// Values never hold a line end; they may hold colons, spaces and non-ASCII text.
fn value() -> impl Strategy<Value = String> {
    "[ a-z:é{}\"\\[\\]\t]{0,12}"
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        4 => (value(), any::<bool>()).prop_map(|(value, space)| Line::Data { value, space }),
        1 => (value(), any::<bool>()).prop_map(|(value, space)| Line::Event { value, space }),
        1 => value().prop_map(Line::Comment),
        1 => value().prop_map(Line::Id),
        1 => value().prop_map(Line::Retry),
    ]
}

fn gen_event() -> impl Strategy<Value = GenEvent> {
    prop::collection::vec(line(), 0..6).prop_map(|lines| GenEvent { lines })
}

/// Writes `name:value` so that the framer's one-space stripping gives `value` back.
fn field(out: &mut Vec<u8>, name: &str, value: &str, space: bool) {
    out.extend_from_slice(name.as_bytes());
    out.push(b':');
    if space || value.starts_with(' ') {
        out.push(b' ');
    }
    out.extend_from_slice(value.as_bytes());
}

const ENDINGS: [&[u8]; 3] = [b"\n", b"\r\n", b"\r"];

/// Renders the stream and the events a correct parser must produce from it.
fn render(
    bom: bool,
    events: &[GenEvent],
    trailing: &GenEvent,
    endings: &[usize],
) -> (Vec<u8>, Vec<Owned>) {
    let mut out = Vec::new();
    let mut expected = Vec::new();
    let mut endings = endings.iter().cycle();
    let mut prev_cr = false;
    if bom {
        out.extend_from_slice(BOM);
    }
    let mut end_line = |out: &mut Vec<u8>, empty: bool| {
        let mut ending = ENDINGS[*endings.next().unwrap_or(&0)];
        // "\r" then an empty line ended by "\n" is the single line end "\r\n", not two.
        if prev_cr && empty && ending == b"\n" {
            ending = b"\r\n";
        }
        prev_cr = ending == b"\r";
        out.extend_from_slice(ending);
    };
    for (i, event) in events.iter().chain([trailing]).enumerate() {
        let mut data: Option<String> = None;
        let mut kind = String::new();
        for line in &event.lines {
            match line {
                Line::Data { value, space } => {
                    field(&mut out, "data", value, *space);
                    match &mut data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(value);
                        }
                        None => data = Some(value.clone()),
                    }
                }
                Line::Event { value, space } => {
                    field(&mut out, "event", value, *space);
                    kind.clone_from(value);
                }
                Line::Comment(text) => {
                    out.push(b':');
                    out.extend_from_slice(text.as_bytes());
                }
                Line::Id(v) => field(&mut out, "id", v, true),
                Line::Retry(v) => field(&mut out, "retry", v, false),
            }
            end_line(&mut out, false);
        }
        if i == events.len() {
            break; // the trailing event never gets its blank line
        }
        end_line(&mut out, true);
        if let Some(data) = data {
            let kind = if kind.is_empty() {
                "message".to_owned()
            } else {
                kind
            };
            expected.push((kind, data.into_bytes()));
        }
    }
    (out, expected)
}

fn stream_case() -> impl Strategy<Value = (Vec<u8>, Vec<Owned>, Vec<usize>)> {
    (
        any::<bool>(),
        prop::collection::vec(gen_event(), 0..8),
        gen_event(),
        prop::collection::vec(0..ENDINGS.len(), 1..16),
        prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    )
        .prop_map(|(bom, events, trailing, endings, cuts)| {
            let (bytes, expected) = render(bom, &events, &trailing, &endings);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            cuts.sort_unstable();
            (bytes, expected, cuts)
        })
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
    // Regressions go beside this file (`tests.regressions`), inside the module that owns
    // them, rather than in a crate-root directory.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn chunking_never_changes_events((bytes, expected, cuts) in stream_case()) {
        let mut whole_framer = SseFramer::new();
        let whole = feed(&mut whole_framer, &[&bytes]);
        whole_framer.finish();
        prop_assert_eq!(&whole, &expected);

        let split = parse(&split_at_all(&bytes, &cuts));
        prop_assert_eq!(&split, &expected);

        let single: Vec<&[u8]> = bytes.chunks(1).collect();
        prop_assert_eq!(&parse(&single), &expected);
    }
}
