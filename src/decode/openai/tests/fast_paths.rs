//! The two fast paths in front of the classifier: the scanner and the chunk template.
//! Wherever either answers, the classifier must agree.

use super::*;

// The scanner: it answers for the usual chunks, leaves the unusual to serde, and wherever
// it answers, serde agrees.

fn scanned(data: &str) -> Option<(EventInfo, EventText<'_>)> {
    scan::classify(data.as_bytes())
}

#[test]
fn the_scanner_answers_for_the_chunks_engines_send() {
    let chunks = [
        chat(r#"{"role":"assistant","content":""}"#, "null"),
        chat(r#"{"content":"Hello"}"#, "null"),
        chat(r#"{"content":" wörld 🙂"}"#, "null"),
        chat(r#"{"content":"line\nbreak \u00e9"}"#, "null"),
        chat(r#"{"reasoning_content":"think","content":null}"#, "null"),
        chat(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]}"#, "null"),
        chat("{}", r#""stop""#),
        chat(r#"{"content":"x"}"#, r#""length""#),
        r#"{"id":"c","object":"text_completion","created":1,"choices":[{"index":0,"text":"hi","logprobs":{"tokens":["hi"],"token_logprobs":[-0.25,1e-3,-1.5E+2]},"finish_reason":null}],"model":"m"}"#.to_owned(),
        r#" { "choices" : [ ] , "usage" : null , "error" : null } "#.to_owned(),
        r#"{"choices":null}"#.to_owned(),
        r#"{"object":"error","message":"engine died"}"#.to_owned(),
        "{}".to_owned(),
    ];
    for c in &chunks {
        let fast = scanned(c.trim()).unwrap_or_else(|| panic!("scanner declined {c}"));
        assert!(scan_agrees(c.as_bytes()), "{c}");
        assert_eq!(classify_chunk_text(c.as_bytes()).unwrap(), fast, "{c}");
    }
    assert_eq!(info(&chat(r#"{"content":"Hello"}"#, "null")), answer());
    assert!(
        scanned(r#"{"object":"error","message":"m"}"#)
            .unwrap()
            .0
            .error
    );
}

#[test]
fn the_scanner_leaves_the_unusual_to_serde() {
    let unusual = [
        // Fields it does not read itself.
        r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#"{"error":{"message":"boom"}}"#,
        r#"{"choices":[{"message":{"content":"body"}}]}"#,
        r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"st\u006fp"}]}"#,
        r#"{"cho\u0069ces":[{"delta":{"content":"x"}}]}"#,
        // What serde's derive rejects or reads differently.
        r#"{"choices":[],"choices":[]}"#,
        r#"{"choices":[{"delta":null,"delta":{"content":"x"}}]}"#,
        r#"{"choices":[{"delta":{"content":null,"content":"x"}}]}"#,
        r#"{"object":null,"object":"error"}"#,
        r#"{"usage":null,"usage":null}"#,
        r#"{"choices":[{"delta":["x"]}]}"#,
        r#"{"choices":[null]}"#,
        r#"{"choices":{}}"#,
        r#"{"choices":[{"finish_reason":1}]}"#,
        // Not strict JSON, or not an object.
        r#"{"choices":[],}"#,
        r#"{"a":01}"#,
        r#"{"a":1.}"#,
        r#"{"a":"\x"}"#,
        "{\"a\":\"tab\there\"}",
        r#"{"a":tru}"#,
        r#"{"a":1} x"#,
        r#"["choices"]"#,
        r#"{"a":1"#,
    ];
    for u in unusual {
        assert!(scanned(u).is_none(), "scanner answered for {u}");
        assert!(scan_agrees(u.as_bytes()), "{u}");
    }
    let deep = format!(r#"{{"a":{}1{}}}"#, "[".repeat(70), "]".repeat(70));
    assert!(scanned(&deep).is_none());
    assert!(scanned(&format!(r#"{{"a":{}1{}}}"#, "[".repeat(20), "]".repeat(20))).is_some());
}

mod scan_agreement {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::super::super::scan_agrees;

    fn keys(names: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop::sample::select(names).prop_map(|k| format!("\"{k}\""))
    }

    /// An object of `first` (when given) and then up to three `more` fields.
    fn object(
        first: impl Strategy<Value = Option<(String, String)>>,
        more: impl Strategy<Value = (String, String)>,
    ) -> impl Strategy<Value = String> {
        (first, prop::collection::vec(more, 0..4)).prop_map(|(first, more)| {
            let body: Vec<String> = first
                .into_iter()
                .chain(more)
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            format!("{{{}}}", body.join(","))
        })
    }

    /// JSON-ish values: mostly valid, with the odd malformed piece.
    fn value() -> impl Strategy<Value = String> {
        let valid = prop::sample::select(vec![
            "null",
            "true",
            "false",
            "0",
            "-1.5e3",
            "\"\"",
            "\"x\"",
            "\"stop\"",
            "\"error\"",
            "\"a\\nb\"",
            "\"\\u00e9\"",
            "\"é\"",
            "[]",
            "{}",
            "\" \"",
        ]);
        let malformed = prop::sample::select(vec!["01", "1.", "\"\\q\"", "tru", "\"", "\"\t\""]);
        let leaf = prop_oneof![30 => valid, 1 => malformed].prop_map(str::to_owned);
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                object(Just(None), (keys(&["a", "content", "x\\u0041"]), inner)),
            ]
        })
    }

    /// A delta or message: the fields the classifier reads, at times repeated, and others.
    fn message() -> impl Strategy<Value = String> {
        let key = keys(&[
            "content",
            "reasoning_content",
            "reasoning",
            "tool_calls",
            "function_call",
            "refusal",
            "role",
            "role",
            "content",
            "content",
            "conte\\u006et",
        ]);
        let text = prop::sample::select(vec!["\"x\"", "\"\"", "null", "\"a\\nb\"", "\" é\""])
            .prop_map(str::to_owned);
        object(Just(None), (key, prop_oneof![4 => text, 1 => value()]))
    }

    fn choice() -> impl Strategy<Value = String> {
        let finish = prop::sample::select(vec!["null", "\"stop\"", "\"length\"", "\"tool_calls\""])
            .prop_map(str::to_owned);
        let delta =
            prop::option::weighted(0.8, message().prop_map(|m| ("\"delta\"".to_owned(), m)));
        let key = keys(&[
            "index",
            "index",
            "logprobs",
            "logprobs",
            "finish_reason",
            "finish_reason",
            "text",
            "delta",
            "message",
        ]);
        object(
            delta,
            (key, prop_oneof![1 => message(), 2 => finish, 2 => value()]),
        )
    }

    /// A chunk, mostly shaped like an engine's.
    fn chunk() -> impl Strategy<Value = String> {
        let choices =
            prop::collection::vec(choice(), 0..3).prop_map(|v| format!("[{}]", v.join(",")));
        let first =
            prop::option::weighted(0.9, choices.prop_map(|c| ("\"choices\"".to_owned(), c)));
        let key = keys(&[
            "id", "id", "model", "model", "object", "object", "created", "usage", "error",
            "choices",
        ]);
        object(
            first,
            (key, prop_oneof![4 => value(), 1 => Just("null".to_owned())]),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2048,
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]

        /// Wherever the scanner answers, serde's derive gives the same event.
        #[test]
        fn scanner_and_serde_agree(
            chunk in chunk(),
            ws in prop::sample::select(vec!["", " ", "\n\t"]),
        ) {
            let spaced = chunk.replace(':', &format!("{ws}:{ws}")).replace(',', &format!("{ws},"));
            for c in [&chunk, &spaced] {
                prop_assert!(scan_agrees(c.as_bytes()), "{}", c);
            }
        }
    }
}

// The chunk template: most chunks of a stream are recognised by the bytes around their
// text, and every answer is the classifier's.

fn content_chunk(text: &str) -> String {
    chat(&format!(r#"{{"content":"{text}"}}"#), "null")
}

#[test]
fn the_template_recognises_the_next_chunks_and_agrees_with_the_classifier() {
    let mut template = ChunkTemplate::default();
    let role = chat(r#"{"role":"assistant","content":""}"#, "null");
    assert_eq!(
        template.classify(role.as_bytes()).unwrap().1,
        EventText::None
    );
    assert!(
        template.fit(content_chunk("a").as_bytes()).is_none(),
        "nothing learnt yet"
    );
    template
        .classify(content_chunk("Hello").as_bytes())
        .unwrap();
    for text in [
        " world",
        "é 🙂",
        "x",
        "a much longer piece of text than before",
    ] {
        let chunk = content_chunk(text);
        assert_eq!(template.fit(chunk.trim().as_bytes()), Some(text), "{chunk}");
        let (info, got) = template.classify(chunk.as_bytes()).unwrap();
        assert_eq!((info, got), classify_chunk_text(chunk.as_bytes()).unwrap());
        assert_eq!((info, got), (answer(), EventText::One(text)));
    }
    // What must go through the classifier: escapes, the empty string, other bytes around.
    let misses = [
        content_chunk(r#"say \"hi\""#),
        content_chunk(r"line\nbreak"),
        content_chunk(""),
        content_chunk("tab\there"),
        chat(r#"{"content":"x"}"#, r#""stop""#),
        chat(r#"{"reasoning_content":"x"}"#, "null"),
        r#"{"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":3}}"#.to_owned(),
    ];
    for chunk in &misses {
        assert!(template.fit(chunk.trim().as_bytes()).is_none(), "{chunk}");
        let mut fresh = ChunkTemplate::default();
        fresh.classify(content_chunk("Hello").as_bytes()).unwrap();
        assert_eq!(
            fresh.classify(chunk.as_bytes()).ok(),
            classify_chunk_text(chunk.as_bytes()).ok(),
            "{chunk}"
        );
    }
    // A miss with one plain string becomes the template; others leave it as it was.
    let finish = chat(r#"{"content":"end"}"#, r#""length""#);
    template.classify(finish.as_bytes()).unwrap();
    let next = chat(r#"{"content":"more"}"#, r#""length""#);
    assert_eq!(template.fit(next.as_bytes()), Some("more"));
    template.classify(b"[DONE]").unwrap();
    assert_eq!(template.fit(next.as_bytes()), Some("more"));
}

mod template_agreement {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::super::super::template_agrees;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 1024,
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]

        /// A stream of chunks around a few shapes, with texts plain and not: the template
        /// gives the classifier's answer for every chunk.
        #[test]
        fn template_and_classifier_agree(
            chunks in prop::collection::vec(
                (
                    prop::sample::select(vec![
                        (r#"{"id":"a","choices":[{"index":0,"delta":{"content":"#, r#"},"finish_reason":null}]}"#),
                        (r#"{"id":"a","choices":[{"index":0,"delta":{"content":"#, r#"},"finish_reason":"stop"}]}"#),
                        (r#"{"id":"a","choices":[{"index":0,"delta":{"reasoning":"#, r#"}}]}"#),
                        (r#"{"choices":[{"text":"#, r#"}],"usage":null}"#),
                        (r#"{"choices":[{"delta":{"content":"#, r#",{"content":"x"}}]}"#),
                        (r#"{"choices":[{"delta":{"content":"#, r#"}}],"usage":{"completion_tokens":2}}"#),
                    ]),
                    prop_oneof![
                        3 => "[a-z é🙂]{1,12}".prop_map(|t| format!("\"{t}\"")),
                        1 => prop::sample::select(vec![
                            r#""""#, r#""a\"b""#, r#""a\\""#, "\"a\tb\"", r#""\u00e9""#, "null",
                            "1", r#"["x"]"#, r#""a"b""#, r#""a""#,
                        ]).prop_map(str::to_owned),
                    ],
                ),
                1..12,
            ),
        ) {
            let lines: Vec<String> =
                chunks.into_iter().map(|((head, tail), text)| format!("data: {head}{text}{tail}")).collect();
            let stream = lines.join("\n");
            prop_assert!(template_agrees(stream.as_bytes()), "{}", stream);
        }
    }
}
