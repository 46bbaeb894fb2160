//! No input makes a decoder, a body reader or the request reader panic: damaged fixtures
//! and arbitrary bytes, through every dialect. A small-scale stand-in for the fuzz targets,
//! run with the unit tests.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use crate::decode::fixture_tests::streams;
use crate::decode::{
    Api, StreamDecoder, StreamKind, inspect_request, parse_response_body, response_body_text,
};

/// Every decoder pair, for the no-panic properties.
const PAIRS: [(Api, StreamKind); 8] = [
    (Api::ChatCompletions, StreamKind::Sse),
    (Api::Completions, StreamKind::Sse),
    (Api::Responses, StreamKind::Sse),
    (Api::Messages, StreamKind::Sse),
    (
        Api::TgiGenerate {
            stream_endpoint: true,
        },
        StreamKind::Sse,
    ),
    (Api::LlamaCppCompletion, StreamKind::Sse),
    (Api::OllamaChat, StreamKind::Ndjson),
    (Api::OllamaGenerate, StreamKind::Ndjson),
];

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// Damaged fixtures (bytes replaced, cut, or spliced from another dialect) never panic
    /// any decoder, body reader or request reader; they may only mark the stream broken.
    #[test]
    fn damaged_input_never_panics(
        which in any::<prop::sample::Index>(),
        other in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        splice in any::<prop::sample::Index>(),
        chunk in 1usize..64,
    ) {
        let streams = streams();
        let f = which.get(&streams);
        let mut bytes = f.bytes.to_vec();
        for (at, byte) in &edits {
            let at = at.index(bytes.len());
            bytes[at] = *byte;
        }
        let donor = other.get(&streams).bytes;
        bytes.truncate(splice.index(bytes.len() + 1));
        bytes.extend_from_slice(&donor[splice.index(donor.len() + 1)..]);
        for (api, kind) in PAIRS {
            let mut decoder = StreamDecoder::new(api, kind).expect("a decoder");
            decoder.collect_text(256);
            for piece in bytes.chunks(chunk) {
                decoder.feed(piece, |e| assert!(e.content || !e.answer));
            }
            decoder.finish(|_| {});
            let _ = decoder.is_broken();
            let _ = decoder.take_text();
            let _ = parse_response_body(api, &bytes);
            let _ = response_body_text(api, &bytes, 256);
            let _ = inspect_request(api, &bytes);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        for (api, kind) in PAIRS {
            let mut decoder = StreamDecoder::new(api, kind).expect("a decoder");
            decoder.collect_text(256);
            decoder.feed(&bytes, |_| {});
            decoder.finish(|_| {});
            let _ = parse_response_body(api, &bytes);
            let _ = response_body_text(api, &bytes, 256);
            let _ = inspect_request(api, &bytes);
        }
    }
}
