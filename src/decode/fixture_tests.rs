//! Every dialect's hand-written stream fixture (`fixtures/`, described in its README) decoded
//! end to end: the exact [`EventInfo`] sequence fed whole, one byte at a time, split at every
//! byte, and under random chunkings; and the per-stream totals the README promises. The body
//! fixtures are read in `body/tests.rs`.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use crate::decode::{Api, EventInfo, FinishReason, StreamDecoder, StreamKind, Usage};

/// Builds expected events tersely.
#[derive(Copy, Clone, Default)]
struct Ev(EventInfo);

impl Ev {
    fn answer() -> Ev {
        Ev(EventInfo {
            content: true,
            answer: true,
            ..EventInfo::default()
        })
    }
    fn reasoning() -> Ev {
        Ev(EventInfo {
            content: true,
            ..EventInfo::default()
        })
    }
    fn usage(mut self, input: Option<u64>, output: Option<u64>) -> Ev {
        self.0.usage = Some(Usage {
            input_tokens: input,
            output_tokens: output,
        });
        self
    }
    fn cached(mut self, n: u64) -> Ev {
        self.0.cached_input_tokens = Some(n);
        self
    }
    fn finish(mut self, reason: FinishReason) -> Ev {
        self.0.finish_reason = Some(reason);
        self
    }
    fn terminal(mut self) -> Ev {
        self.0.terminal = true;
        self
    }
    fn error(mut self) -> Ev {
        self.0.error = true;
        self
    }
}

const E: Ev = Ev(EventInfo {
    content: false,
    answer: false,
    usage: None,
    finish_reason: None,
    terminal: false,
    error: false,
    cached_input_tokens: None,
    engine: None,
});

fn times(ev: Ev, n: usize) -> impl Iterator<Item = Ev> {
    std::iter::repeat_n(ev, n)
}

pub(super) struct Fixture {
    name: &'static str,
    api: Api,
    kind: StreamKind,
    pub(super) bytes: &'static [u8],
    events: Vec<EventInfo>,
}

fn fixture(
    name: &'static str,
    api: Api,
    kind: StreamKind,
    bytes: &'static [u8],
    events: impl IntoIterator<Item = Ev>,
) -> Fixture {
    let events = events.into_iter().map(|e| e.0).collect();
    Fixture {
        name,
        api,
        kind,
        bytes,
        events,
    }
}

pub(super) fn streams() -> Vec<Fixture> {
    use FinishReason::*;
    use StreamKind::{Ndjson, Sse};
    let (a, r) = (Ev::answer(), Ev::reasoning());
    vec![
        fixture(
            "openai_chat_stream.sse",
            Api::ChatCompletions,
            Sse,
            include_bytes!("fixtures/openai_chat_stream.sse"),
            [
                E,
                r,
                r,
                a,
                a,
                a,
                E.finish(Stop),
                E.usage(Some(12), Some(9)),
                E.terminal(),
            ],
        ),
        fixture(
            "openai_responses_stream.sse",
            Api::Responses,
            Sse,
            include_bytes!("fixtures/openai_responses_stream.sse"),
            times(E, 4)
                .chain([r, r])
                .chain(times(E, 5))
                .chain([a, a, a])
                .chain(times(E, 3))
                .chain([E
                    .usage(Some(14), Some(22))
                    .cached(0)
                    .finish(Stop)
                    .terminal()]),
        ),
        fixture(
            "anthropic_messages_stream.sse",
            Api::Messages,
            Sse,
            include_bytes!("fixtures/anthropic_messages_stream.sse"),
            [
                E.usage(Some(600), None).cached(128),
                E,
                E,
                r,
                r,
                E,
                E,
                E,
                a,
                a,
                E,
                a,
                E,
                a,
                a,
                E,
                E.usage(None, Some(89)).finish(ToolCalls),
                E.terminal(),
            ],
        ),
        fixture(
            "anthropic_messages_error_stream.sse",
            Api::Messages,
            Sse,
            include_bytes!("fixtures/anthropic_messages_error_stream.sse"),
            [E.usage(Some(20), None), E, a, E.error().terminal()],
        ),
        fixture(
            "tgi_generate_stream.sse",
            Api::TgiGenerate {
                stream_endpoint: true,
            },
            Sse,
            include_bytes!("fixtures/tgi_generate_stream.sse"),
            times(a, 5).chain([E.usage(Some(7), Some(6)).finish(Stop).terminal()]),
        ),
        fixture(
            "llamacpp_completion_stream.sse",
            Api::LlamaCppCompletion,
            Sse,
            include_bytes!("fixtures/llamacpp_completion_stream.sse"),
            times(a, 4).chain([E.usage(Some(12), Some(4)).finish(Length).terminal()]),
        ),
        fixture(
            "ollama_chat_stream.ndjson",
            Api::OllamaChat,
            Ndjson,
            include_bytes!("fixtures/ollama_chat_stream.ndjson"),
            [
                r,
                r,
                a,
                a,
                E.usage(Some(26), Some(12)).finish(Stop).terminal(),
            ],
        ),
        fixture(
            "ollama_generate_stream.ndjson",
            Api::OllamaGenerate,
            Ndjson,
            include_bytes!("fixtures/ollama_generate_stream.ndjson"),
            times(a, 4).chain([E.usage(Some(31), Some(4)).finish(Length).terminal()]),
        ),
    ]
}

fn decode(f: &Fixture, chunks: &[&[u8]]) -> (Vec<EventInfo>, bool) {
    let mut decoder = StreamDecoder::new(f.api, f.kind).expect("a decoder for the fixture");
    let mut events = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk, |e| events.push(e));
    }
    decoder.finish(|e| events.push(e));
    (events, decoder.is_broken())
}

#[test]
fn fixtures_decode_to_the_exact_events() {
    for f in streams() {
        let (events, broken) = decode(&f, &[f.bytes]);
        assert!(!broken, "{}", f.name);
        assert_eq!(events.len(), f.events.len(), "{}: {events:#?}", f.name);
        for (i, (got, want)) in events.iter().zip(&f.events).enumerate() {
            assert_eq!(got, want, "{} event {i}", f.name);
        }
    }
}

#[test]
fn fixtures_decode_alike_one_byte_at_a_time() {
    for f in streams() {
        let bytes: Vec<&[u8]> = f.bytes.chunks(1).collect();
        assert_eq!(decode(&f, &bytes), (f.events.clone(), false), "{}", f.name);
    }
}

#[test]
fn fixtures_decode_alike_split_at_every_byte() {
    for f in streams() {
        for at in 0..=f.bytes.len() {
            let (head, tail) = f.bytes.split_at(at);
            assert_eq!(
                decode(&f, &[head, tail]).0,
                f.events,
                "{} split at {at}",
                f.name
            );
        }
    }
}

/// What the measurement makes of a stream, merged as its timeline does.
#[derive(Debug, PartialEq, Eq)]
struct Totals {
    content: usize,
    answer: usize,
    input: Option<u64>,
    output: Option<u64>,
    finish: Option<FinishReason>,
    terminal: bool,
    error: bool,
}

fn totals(events: &[EventInfo]) -> Totals {
    let mut t = Totals {
        content: 0,
        answer: 0,
        input: None,
        output: None,
        finish: None,
        terminal: false,
        error: false,
    };
    for e in events {
        assert!(e.content || !e.answer, "answer without content");
        t.content += usize::from(e.content);
        t.answer += usize::from(e.answer);
        if let Some(u) = e.usage {
            t.input = u.input_tokens.or(t.input);
            t.output = u.output_tokens.or(t.output);
        }
        t.finish = e.finish_reason.or(t.finish);
        t.terminal |= e.terminal;
        t.error |= e.error;
    }
    t
}

/// One row of the table in `fixtures/README.md`: content and answer events, input and
/// output tokens, finish reason, and whether the stream reports an error.
fn row(
    counts: (usize, usize),
    tokens: (Option<u64>, Option<u64>),
    finish: Option<FinishReason>,
    error: bool,
) -> Totals {
    let (content, answer) = counts;
    let (input, output) = tokens;
    Totals {
        content,
        answer,
        input,
        output,
        finish,
        terminal: true,
        error,
    }
}

/// The table in `fixtures/README.md`, which integration tests rely on.
#[test]
fn fixture_totals_match_the_readme() {
    use FinishReason::*;
    let readme = [
        (
            "openai_chat_stream.sse",
            row((5, 3), (Some(12), Some(9)), Some(Stop), false),
        ),
        (
            "openai_responses_stream.sse",
            row((5, 3), (Some(14), Some(22)), Some(Stop), false),
        ),
        (
            "anthropic_messages_stream.sse",
            row((7, 5), (Some(600), Some(89)), Some(ToolCalls), false),
        ),
        (
            "anthropic_messages_error_stream.sse",
            row((1, 1), (Some(20), None), None, true),
        ),
        (
            "tgi_generate_stream.sse",
            row((5, 5), (Some(7), Some(6)), Some(Stop), false),
        ),
        (
            "llamacpp_completion_stream.sse",
            row((4, 4), (Some(12), Some(4)), Some(Length), false),
        ),
        (
            "ollama_chat_stream.ndjson",
            row((4, 2), (Some(26), Some(12)), Some(Stop), false),
        ),
        (
            "ollama_generate_stream.ndjson",
            row((4, 4), (Some(31), Some(4)), Some(Length), false),
        ),
    ];
    let streams = streams();
    assert_eq!(streams.len(), readme.len());
    for (f, (name, want)) in streams.iter().zip(readme) {
        assert_eq!(f.name, name);
        assert_eq!(totals(&f.events), want, "{name}");
    }
}

#[test]
fn fixture_cut_before_its_end_has_no_terminal() {
    for f in streams() {
        // Drop the last event's bytes (and its blank line): the terminal event never comes.
        let body = f.bytes.trim_ascii_end();
        let cut = body.len() - 3;
        let (events, _) = decode(&f, &[&f.bytes[..cut]]);
        assert!(events.iter().all(|e| !e.terminal), "{}", f.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// Any chunking of any fixture gives the identical event sequence.
    #[test]
    fn any_chunking_of_any_fixture_gives_the_same_events(
        which in any::<prop::sample::Index>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let streams = streams();
        let f = which.get(&streams);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(f.bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut start = 0;
        for cut in cuts {
            chunks.push(&f.bytes[start..cut]);
            start = cut;
        }
        chunks.push(&f.bytes[start..]);
        prop_assert_eq!(decode(f, &chunks), (f.events.clone(), false), "{}", f.name);
    }
}
