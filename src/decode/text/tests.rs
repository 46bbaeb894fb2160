//! Text collection: what each dialect's events and bodies yield, unescaping, the limit,
//! dropping the text once usage arrives, and independence from the chunking.

use super::*;
use crate::decode::{Api, StreamDecoder, StreamKind, response_body_text};

fn fixture(name: &str) -> &'static [u8] {
    match name {
        "openai" => include_bytes!("../fixtures/openai_chat_stream.sse"),
        "responses" => include_bytes!("../fixtures/openai_responses_stream.sse"),
        "anthropic" => include_bytes!("../fixtures/anthropic_messages_stream.sse"),
        "tgi" => include_bytes!("../fixtures/tgi_generate_stream.sse"),
        "llamacpp" => include_bytes!("../fixtures/llamacpp_completion_stream.sse"),
        "ollama_chat" => include_bytes!("../fixtures/ollama_chat_stream.ndjson"),
        "ollama_generate" => include_bytes!("../fixtures/ollama_generate_stream.ndjson"),
        _ => unreachable!(),
    }
}

/// The fixture up to (not including) the line that starts with `marker`: the stream as it
/// would be without its usage report.
fn before<'a>(bytes: &'a [u8], marker: &str) -> &'a [u8] {
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .unwrap();
    &bytes[..at]
}

fn decode_text(api: Api, kind: StreamKind, bytes: &[u8], chunk: usize) -> Option<TextBuf> {
    let mut d = StreamDecoder::new(api, kind).unwrap();
    d.collect_text(DEFAULT_TEXT_LIMIT);
    for piece in bytes.chunks(chunk.max(1)) {
        d.feed(piece, |_| {});
    }
    d.finish(|_| {});
    d.take_text()
}

#[test]
fn each_dialect_yields_its_generated_text() {
    let cases: [(Api, StreamKind, &str, &str, &str); 7] = [
        (
            Api::ChatCompletions,
            StreamKind::Sse,
            "openai",
            r#"data: {"id":"chatcmpl-fx1","object":"chat.completion.chunk","created":1735689600,"model":"qwen3-8b","choices":[],"usage""#,
            "The user greets me.Hello! How can I help?",
        ),
        (
            Api::Responses,
            StreamKind::Sse,
            "responses",
            "event: response.completed",
            "Simple greeting; answer briefly.Hi there!",
        ),
        (
            Api::Messages,
            StreamKind::Sse,
            "anthropic",
            "event: message_delta",
            "The user wants the weather in Paris; call the tool.Let me check the weather.\
             get_weather{\"location\": \"Paris, France\"}",
        ),
        (
            Api::LlamaCppCompletion,
            StreamKind::Sse,
            "llamacpp",
            r#"data: {"index":0,"content":"","tokens":[],"id_slot":0,"stop":true"#,
            "Paris is the capital.",
        ),
        (
            Api::OllamaChat,
            StreamKind::Ndjson,
            "ollama_chat",
            r#"{"model":"qwen3","created_at":"2025-01-01T00:00:00.000000005Z""#,
            "The user says hi.Hello!",
        ),
        (
            Api::OllamaGenerate,
            StreamKind::Ndjson,
            "ollama_generate",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.000000005Z""#,
            "The sky is blue",
        ),
        (
            Api::TgiGenerate {
                stream_endpoint: true,
            },
            StreamKind::Sse,
            "tgi",
            r#"data:{"index":6,"#,
            "",
        ),
    ];
    for (api, kind, name, marker, want) in cases {
        let bytes = fixture(name);
        if marker.is_empty() || !bytes.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            panic!("{name}: marker not found");
        }
        let cut = before(bytes, marker);
        if name == "tgi" {
            // TGI's tokens: compare with the token texts the fixture carries.
            let text = decode_text(api, kind, cut, 4096).unwrap();
            assert!(text.text().starts_with(" Deep learning is"), "{text:?}");
            continue;
        }
        for chunk in [1, 7, 4096] {
            let text = decode_text(api, kind, cut, chunk).unwrap();
            assert_eq!(text.text(), want, "{name}, chunks of {chunk}");
        }
    }
}

#[test]
fn text_is_dropped_once_usage_arrives() {
    for (api, kind, name) in [
        (Api::ChatCompletions, StreamKind::Sse, "openai"),
        (Api::Responses, StreamKind::Sse, "responses"),
        (Api::Messages, StreamKind::Sse, "anthropic"),
        (Api::LlamaCppCompletion, StreamKind::Sse, "llamacpp"),
        (Api::OllamaChat, StreamKind::Ndjson, "ollama_chat"),
        (
            Api::TgiGenerate {
                stream_endpoint: true,
            },
            StreamKind::Sse,
            "tgi",
        ),
    ] {
        assert_eq!(decode_text(api, kind, fixture(name), 64), None, "{name}");
    }
}

#[test]
fn without_collect_text_nothing_is_kept() {
    let mut d = StreamDecoder::new(Api::ChatCompletions, StreamKind::Sse).unwrap();
    d.feed(before(fixture("openai"), "data: [DONE]"), |_| {});
    assert_eq!(d.take_text(), None);
}

#[test]
fn escapes_are_unescaped_and_tool_calls_included() {
    let events = concat!(
        r#"data: {"choices":[{"delta":{"content":"a\"b\u00e9\n"}}]}"#,
        "\n\n",
        r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"x\":"}}]}}]}"#,
        "\n\n",
        r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}"#,
        "\n\n",
        r#"data: {"choices":[{"index":0,"text":"legacy"},{"index":1,"text":" two"}]}"#,
        "\n\n",
    );
    let text = decode_text(Api::ChatCompletions, StreamKind::Sse, events.as_bytes(), 5).unwrap();
    assert_eq!(text.text(), "a\"b\u{e9}\nf{\"x\":1}legacy two");
}

#[test]
fn the_limit_cuts_at_a_character_boundary_and_counts_the_rest() {
    let mut buf = TextBuf::new(5);
    buf.push("abc");
    buf.push("dé€");
    assert_eq!(buf.text(), "abcd");
    assert_eq!(buf.dropped(), 5);
    buf.push("more");
    assert_eq!((buf.text(), buf.dropped()), ("abcd", 9));
    assert!(!buf.is_empty());
    assert!(TextBuf::new(4).is_empty());
}

#[test]
fn odd_documents_add_nothing_and_never_panic() {
    for doc in [
        &b""[..],
        b"[1,2",
        b"{\"choices\":5}",
        b"{\"choices\":[{\"delta\":{\"content\":5}}]}",
        b"{\"choices\":[{\"delta\":{\"content\":null}}]}",
        b"{\"choices\":[{\"delta\":{\"content\":\"\\ud800\"}}]}",
        b"\"just a string\"",
    ] {
        let mut buf = TextBuf::new(100);
        collect(doc, paths::OPENAI_EVENT, &mut buf);
        assert!(
            buf.text().len() <= 1,
            "{:?}: {buf:?}",
            String::from_utf8_lossy(doc)
        );
    }
}

#[test]
fn bodies_yield_their_text() {
    let cases: [(Api, &[u8], &str); 7] = [
        (
            Api::ChatCompletions,
            include_bytes!("../fixtures/openai_chat_body.json"),
            "Hi thereA greeting.",
        ),
        (
            Api::Responses,
            include_bytes!("../fixtures/openai_responses_body.json"),
            "get_weather{\"location\":\"Paris, France\"}",
        ),
        (
            Api::Messages,
            include_bytes!("../fixtures/anthropic_messages_body.json"),
            "Two plus two.4",
        ),
        (
            Api::TgiGenerate {
                stream_endpoint: false,
            },
            include_bytes!("../fixtures/tgi_generate_body.json"),
            " Deep learning is a subset of machine learning that uses neural networks with many layers",
        ),
        (
            Api::LlamaCppCompletion,
            include_bytes!("../fixtures/llamacpp_completion_body.json"),
            " Paris.",
        ),
        (
            Api::OllamaChat,
            include_bytes!("../fixtures/ollama_chat_body.json"),
            "The sky is blue because of Rayleigh scattering.",
        ),
        (
            Api::LlamaCppCompletion,
            br#"[{"content":"a","stop":true},{"content":"b","stop":true}]"#,
            "ab",
        ),
    ];
    for (api, body, want) in cases {
        let text = response_body_text(api, body, 1 << 20).unwrap();
        assert_eq!(text.text(), want, "{api:?}");
    }
    assert_eq!(response_body_text(Api::Unknown, b"{}", 10), None);
}

#[test]
fn tool_use_input_objects_are_taken_as_raw_json() {
    let body = br#"{"content":[{"type":"tool_use","name":"f","input":{"a": [1, 2]}}]}"#;
    let text = response_body_text(Api::Messages, body, 100).unwrap();
    assert_eq!(text.text(), r#"f{"a": [1, 2]}"#);
}
