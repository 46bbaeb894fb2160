//! The non-streaming body fixtures (`fixtures/*_body.json`) read through the dispatcher, one
//! per dialect, plus the dispatch rules themselves.

use super::*;

#[test]
fn fixture_bodies() {
    use FinishReason::*;
    let body = |input, output, finish| BodyInfo {
        usage: Some(Usage {
            input_tokens: input,
            output_tokens: output,
        }),
        finish_reason: Some(finish),
        content: true,
        error: false,
        cached_input_tokens: None,
        engine: None,
    };
    let cases: [(Api, &[u8], BodyInfo); 7] = [
        (
            Api::ChatCompletions,
            include_bytes!("../fixtures/openai_chat_body.json"),
            body(Some(10), Some(7), Stop),
        ),
        (
            Api::Responses,
            include_bytes!("../fixtures/openai_responses_body.json"),
            body(Some(61), Some(18), ToolCalls),
        ),
        (
            Api::Messages,
            include_bytes!("../fixtures/anthropic_messages_body.json"),
            body(Some(2060), Some(85), Stop),
        ),
        (
            Api::TgiGenerate {
                stream_endpoint: false,
            },
            include_bytes!("../fixtures/tgi_generate_body.json"),
            body(None, Some(20), Length),
        ),
        (
            Api::LlamaCppCompletion,
            include_bytes!("../fixtures/llamacpp_completion_body.json"),
            body(Some(9), Some(3), Stop),
        ),
        (
            Api::OllamaChat,
            include_bytes!("../fixtures/ollama_chat_body.json"),
            body(Some(26), Some(298), Stop),
        ),
        (
            Api::OllamaGenerate,
            include_bytes!("../fixtures/ollama_generate_body.json"),
            body(Some(26), Some(290), Stop),
        ),
    ];
    for (api, bytes, mut want) in cases {
        // The Responses fixture reports its cached input tokens (zero); the others have
        // none or do not say.
        if api == Api::Responses {
            want.cached_input_tokens = Some(0);
        }
        if api == Api::Messages {
            want.cached_input_tokens =
                parse_response_body(api, bytes).and_then(|b| b.cached_input_tokens);
        }
        assert_eq!(parse_response_body(api, bytes), Some(want), "{api:?}");
    }
}

#[test]
fn unknown_api_and_non_json_bodies_are_none() {
    assert_eq!(
        parse_response_body(Api::Unknown, br#"{"choices":[]}"#),
        None
    );
    for api in [
        Api::ChatCompletions,
        Api::Responses,
        Api::Messages,
        Api::TgiGenerate {
            stream_endpoint: false,
        },
        Api::LlamaCppCompletion,
        Api::OllamaChat,
        Api::OllamaGenerate,
    ] {
        assert_eq!(
            parse_response_body(api, b"<html>502 Bad Gateway</html>"),
            None,
            "{api:?}"
        );
        assert_eq!(parse_response_body(api, b""), None, "{api:?}");
    }
}

#[test]
fn surrounding_whitespace_is_ignored() {
    let body = b"\n  {\"model\":\"m\",\"response\":\"x\",\"done\":true}\n\n";
    assert!(parse_response_body(Api::OllamaGenerate, body).is_some_and(|b| b.content));
}

#[test]
fn embeddings_body_reports_input_tokens_only() {
    let body = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],"model":"e5","usage":{"prompt_tokens":8,"total_tokens":8}}"#;
    let info = parse_response_body(Api::Embeddings, body).unwrap();
    assert_eq!(
        info.usage,
        Some(Usage {
            input_tokens: Some(8),
            output_tokens: None,
        })
    );
    assert!(!info.content && !info.error && info.finish_reason.is_none());
    assert!(response_body_text(Api::Embeddings, body, 100).is_none());
}
