//! Module-level behaviour: path and content-type classification, finish-reason
//! normalization, and the stream decoder's framing, dispatch and failure handling per dialect.

use super::*;

#[test]
fn api_from_path() {
    let cases = [
        ("/v1/chat/completions", Api::ChatCompletions),
        ("/chat/completions", Api::ChatCompletions),
        ("/v1/chat/completions/", Api::ChatCompletions),
        ("/openai/v1/chat/completions", Api::ChatCompletions),
        (
            "/openai/deployments/gpt/chat/completions",
            Api::ChatCompletions,
        ),
        ("/v1/completions", Api::Completions),
        ("/completions", Api::Completions),
        ("/proxy/v1/completions//", Api::Completions),
        ("/v1/chat/completions/chatcmpl-123", Api::Unknown),
        ("/v1/embeddings", Api::Embeddings),
        ("/v1/models", Api::Unknown),
        ("/metrics", Api::Unknown),
        ("/v1/messages", Api::Messages),
        ("/anthropic/v1/messages/", Api::Messages),
        ("/v1/messages/count_tokens", Api::Unknown),
        ("/v1/threads/thread_1/messages", Api::Unknown),
        ("/v1/responses", Api::Responses),
        ("/openai/responses", Api::Responses),
        ("/v1/responses/resp_123", Api::Unknown),
        (
            "/generate",
            Api::TgiGenerate {
                stream_endpoint: false,
            },
        ),
        (
            "/tgi/generate_stream/",
            Api::TgiGenerate {
                stream_endpoint: true,
            },
        ),
        ("/completion", Api::LlamaCppCompletion),
        ("/llama/completion", Api::LlamaCppCompletion),
        ("/api/chat", Api::OllamaChat),
        ("/ollama/api/chat/", Api::OllamaChat),
        ("/api/generate", Api::OllamaGenerate),
        ("/api/embed", Api::Unknown),
        ("/api/chatx", Api::Unknown),
        ("/generatex", Api::Unknown),
        ("/v1/chatcompletions", Api::Unknown),
        ("completions", Api::Unknown),
        ("/", Api::Unknown),
        ("", Api::Unknown),
    ];
    for (path, want) in cases {
        assert_eq!(Api::from_path(path), want, "{path}");
    }
}

#[test]
fn api_labels() {
    assert_eq!(Api::ChatCompletions.as_str(), "chat_completions");
    assert_eq!(Api::Completions.as_str(), "completions");
    assert_eq!(Api::Responses.as_str(), "responses");
    assert_eq!(Api::Messages.as_str(), "messages");
    for stream_endpoint in [false, true] {
        assert_eq!(
            Api::TgiGenerate { stream_endpoint }.as_str(),
            "tgi_generate"
        );
    }
    assert_eq!(Api::LlamaCppCompletion.as_str(), "llamacpp_completion");
    assert_eq!(Api::OllamaChat.as_str(), "ollama_chat");
    assert_eq!(Api::OllamaGenerate.as_str(), "ollama_generate");
    assert_eq!(Api::Embeddings.as_str(), "embeddings");
    assert_eq!(Api::Unknown.as_str(), "unknown");
}

#[test]
fn only_generation_apis_are_judged() {
    for path in [
        "/v1/chat/completions",
        "/v1/messages",
        "/api/generate",
        "/generate",
    ] {
        let api = Api::from_path(path);
        assert!(
            api.is_generation() && is_generation_label(api.as_str()),
            "{path}"
        );
    }
    for path in ["/metrics", "/health", "/v1/models", "/v1/embeddings"] {
        let api = Api::from_path(path);
        assert!(
            !api.is_generation() && !is_generation_label(api.as_str()),
            "{path}"
        );
    }
    assert!(!is_generation_label("upgrade"));
}

#[test]
fn finish_reason_from_wire() {
    use FinishReason::*;
    let cases = [
        ("stop", Stop),
        ("end_turn", Stop),
        ("stop_sequence", Stop),
        ("eos_token", Stop),
        ("STOP", Stop),
        ("length", Length),
        ("max_tokens", Length),
        ("max_output_tokens", Length),
        ("model_context_window_exceeded", Length),
        ("refusal", ContentFilter),
        ("tool_calls", ToolCalls),
        ("function_call", ToolCalls),
        ("tool_use", ToolCalls),
        ("content_filter", ContentFilter),
        ("abort", Other),
        ("", Other),
    ];
    for (wire, want) in cases {
        assert_eq!(FinishReason::from_wire(wire), want, "{wire}");
    }
}

#[test]
fn finish_reason_labels_round_trip() {
    use FinishReason::*;
    for reason in [Stop, Length, ToolCalls, ContentFilter] {
        assert_eq!(FinishReason::from_wire(reason.as_str()), reason);
    }
    assert_eq!(Other.as_str(), "other");
    assert_eq!(ToolCalls.as_str(), "tool_calls");
}

#[test]
fn stream_kind_from_content_type() {
    let cases = [
        (Some("text/event-stream"), StreamKind::Sse),
        (Some("text/event-stream; charset=utf-8"), StreamKind::Sse),
        (Some("Text/Event-Stream;charset=UTF-8"), StreamKind::Sse),
        (Some("application/x-ndjson"), StreamKind::Ndjson),
        (Some("application/jsonl"), StreamKind::Ndjson),
        (Some("application/json"), StreamKind::Json),
        (Some(" application/json ; charset=utf-8"), StreamKind::Json),
        (Some("application/problem+json"), StreamKind::Json),
        (Some("application/PROBLEM+JSON"), StreamKind::Json),
        (Some("text/plain"), StreamKind::Other),
        (Some("application/jsonx"), StreamKind::Other),
        (Some(""), StreamKind::Other),
        (None, StreamKind::Other),
    ];
    for (ct, want) in cases {
        assert_eq!(StreamKind::from_content_type(ct), want, "{ct:?}");
    }
}

#[test]
fn decoder_only_for_known_dialect_and_framing() {
    let tgi = Api::TgiGenerate {
        stream_endpoint: true,
    };
    for api in [
        Api::ChatCompletions,
        Api::Completions,
        Api::Responses,
        Api::Messages,
        tgi,
        Api::LlamaCppCompletion,
    ] {
        assert!(
            StreamDecoder::new(api, StreamKind::Sse).is_some(),
            "{api:?}"
        );
        for kind in [StreamKind::Json, StreamKind::Ndjson, StreamKind::Other] {
            assert!(StreamDecoder::new(api, kind).is_none(), "{api:?} {kind:?}");
        }
    }
    for api in [Api::OllamaChat, Api::OllamaGenerate] {
        assert!(
            StreamDecoder::new(api, StreamKind::Ndjson).is_some(),
            "{api:?}"
        );
        for kind in [StreamKind::Json, StreamKind::Sse, StreamKind::Other] {
            assert!(StreamDecoder::new(api, kind).is_none(), "{api:?} {kind:?}");
        }
    }
    for kind in [
        StreamKind::Sse,
        StreamKind::Ndjson,
        StreamKind::Json,
        StreamKind::Other,
    ] {
        assert!(StreamDecoder::new(Api::Unknown, kind).is_none(), "{kind:?}");
    }
}

/// A vLLM-style chat stream with a keep-alive comment and usage at the end.
const CHAT_STREAM: &[u8] = b": ping\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\r\n\r\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\\n\"},\"finish_reason\":null}]}\r\r\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

fn decode_chunks(chunks: &[&[u8]]) -> (Vec<EventInfo>, bool) {
    let mut decoder = StreamDecoder::new(Api::ChatCompletions, StreamKind::Sse).unwrap();
    let mut events = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk, |e| events.push(e));
    }
    decoder.finish(|e| events.push(e));
    (events, decoder.is_broken())
}

#[test]
fn decodes_a_chat_stream() {
    let (events, broken) = decode_chunks(&[CHAT_STREAM]);
    assert!(!broken);
    let content: Vec<bool> = events.iter().map(|e| e.content).collect();
    assert_eq!(content, [false, true, true, false, false, false]);
    assert!(events.iter().all(|e| e.answer == e.content));
    assert_eq!(events[3].finish_reason, Some(FinishReason::Stop));
    assert_eq!(
        events[4].usage,
        Some(Usage {
            input_tokens: Some(7),
            output_tokens: Some(2)
        })
    );
    let terminal: Vec<bool> = events.iter().map(|e| e.terminal).collect();
    assert_eq!(terminal, [false, false, false, false, false, true]);
}

#[test]
fn chunking_does_not_change_decoded_events() {
    let (whole, _) = decode_chunks(&[CHAT_STREAM]);
    let bytes: Vec<&[u8]> = CHAT_STREAM.chunks(1).collect();
    assert_eq!(decode_chunks(&bytes).0, whole);
    for size in [2, 3, 7, 64] {
        let chunks: Vec<&[u8]> = CHAT_STREAM.chunks(size).collect();
        assert_eq!(decode_chunks(&chunks).0, whole, "chunk size {size}");
    }
}

#[test]
fn event_reported_when_completed() {
    let mut decoder = StreamDecoder::new(Api::Completions, StreamKind::Sse).unwrap();
    let mut events = Vec::new();
    decoder.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\n", |e| {
        events.push(e)
    });
    assert!(events.is_empty());
    decoder.feed(b"\n", |e| events.push(e));
    assert_eq!(events.len(), 1);
    assert!(events[0].content);
}

#[test]
fn truncated_stream_has_no_terminal() {
    let (events, broken) = decode_chunks(&[b"data: {\"choices\":[]}\n\ndata: [DONE]"]);
    assert_eq!(events.len(), 1);
    assert!(!events[0].terminal);
    assert!(!broken);
}

#[test]
fn error_event_and_error_object_are_flagged() {
    let (events, broken) = decode_chunks(&[
        b"event: error\ndata: upstream overloaded\n\n",
        b"data: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n",
    ]);
    assert!(!broken);
    assert_eq!(events.iter().filter(|e| e.error).count(), 2);
}

#[test]
fn undecodable_data_marks_broken_and_decoding_goes_on() {
    let (events, broken) = decode_chunks(&[
        b"data: not json\n\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n",
    ]);
    assert!(broken);
    assert_eq!(events.len(), 2);
    assert_eq!(events[0], EventInfo::default());
    assert!(events[1].content);
}

#[test]
fn other_event_types_are_reported_empty_and_not_classified() {
    let (events, broken) =
        decode_chunks(&[b"event: ping\ndata: {\"choices\":[{\"text\":\"x\"}]}\n\n"]);
    assert!(!broken);
    assert_eq!(events, vec![EventInfo::default()]);
}

fn decode_as(api: Api, kind: StreamKind, chunks: &[&[u8]]) -> (Vec<EventInfo>, bool) {
    let mut decoder = StreamDecoder::new(api, kind).unwrap();
    let mut events = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk, |e| events.push(e));
    }
    decoder.finish(|e| events.push(e));
    (events, decoder.is_broken())
}

#[test]
fn ndjson_stream_with_crlf_and_a_last_line_without_line_end() {
    let (events, broken) = decode_as(
        Api::OllamaGenerate,
        StreamKind::Ndjson,
        &[
            b"{\"response\":\"a\",\"done\":false}\r\n\r\n{\"response\":\"b\",",
            b"\"done\":false}\n{\"response\":\"\",\"done\":true,\"eval_count\":2}",
        ],
    );
    assert!(!broken);
    let flags: Vec<(bool, bool)> = events.iter().map(|e| (e.answer, e.terminal)).collect();
    assert_eq!(flags, [(true, false), (true, false), (false, true)]);
    assert_eq!(events[2].usage.and_then(|u| u.output_tokens), Some(2));
}

#[test]
fn ndjson_line_torn_by_a_cut_is_not_a_decode_failure() {
    let (events, broken) = decode_as(
        Api::OllamaChat,
        StreamKind::Ndjson,
        &[b"{\"message\":{\"content\":\"a\"},\"done\":false}\n{\"message\":{\"con"],
    );
    assert!(
        !broken,
        "the missing terminal line already says the stream was cut"
    );
    assert_eq!(events.len(), 1);
    assert!(!events[0].terminal);
}

#[test]
fn ndjson_garbage_line_marks_broken_and_decoding_goes_on() {
    let (events, broken) = decode_as(
        Api::OllamaChat,
        StreamKind::Ndjson,
        &[b"<html>\n{\"message\":{\"content\":\"a\"},\"done\":false}\n"],
    );
    assert!(broken);
    assert_eq!(events.len(), 2);
    assert!(events[1].answer);
}

#[test]
fn foreign_stream_on_a_known_path_is_a_decode_failure_not_a_cut() {
    // SGLang's native `/generate` shares TGI's path but not its events.
    let (events, broken) = decode_as(
        Api::TgiGenerate {
            stream_endpoint: false,
        },
        StreamKind::Sse,
        &[b"data: {\"text\":\"Hi\",\"meta_info\":{\"id\":\"x\"},\"index\":0}\n\ndata: [DONE]\n\n"],
    );
    assert!(broken);
    assert!(events.iter().all(|e| !e.content));
}

#[test]
fn undecodable_error_events_are_errors_not_failures() {
    for api in [
        Api::Responses,
        Api::Messages,
        Api::TgiGenerate {
            stream_endpoint: true,
        },
    ] {
        let (events, broken) = decode_as(
            api,
            StreamKind::Sse,
            &[b"event: error\ndata: upstream overloaded\n\n"],
        );
        assert!(!broken, "{api:?}");
        assert_eq!(events.len(), 1);
        assert!(events[0].error && events[0].terminal, "{api:?}");
    }
}

#[test]
fn sse_comments_and_pings_are_not_events_or_content() {
    let (events, broken) = decode_as(
        Api::LlamaCppCompletion,
        StreamKind::Sse,
        &[b": ping\n\ndata: {\"content\":\"a\",\"stop\":false}\n\n: ping\n\n"],
    );
    assert!(!broken);
    assert_eq!(events.len(), 1);
    let (events, _) = decode_as(
        Api::Messages,
        StreamKind::Sse,
        &[b"event: ping\ndata: {\"type\": \"ping\"}\n\n"],
    );
    assert_eq!(events, vec![EventInfo::default()]);
}

#[test]
fn finish_reasons_serialize_as_their_labels() {
    for r in FinishReason::ALL {
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            format!("\"{}\"", r.as_str())
        );
    }
}

#[test]
fn cached_input_tokens_are_read_where_the_dialect_reports_them() {
    let streamed = |api: Api, text: &str| {
        let mut d = StreamDecoder::new(api, StreamKind::Sse).unwrap();
        let mut cached = None;
        d.feed(text.as_bytes(), |ev| {
            cached = cached.or(ev.cached_input_tokens);
        });
        cached
    };
    let openai = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":768}}}\n\ndata: [DONE]\n\n";
    assert_eq!(streamed(Api::ChatCompletions, openai), Some(768));
    let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":2048,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\n\n";
    assert_eq!(streamed(Api::Messages, anthropic), Some(2048));
    let responses = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":50,\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":32}}}}\n\n";
    assert_eq!(streamed(Api::Responses, responses), Some(32));
    let uncached =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n";
    assert_eq!(streamed(Api::ChatCompletions, uncached), None);
    let body = br#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":900,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":512}}}"#;
    assert_eq!(
        parse_response_body(Api::ChatCompletions, body)
            .unwrap()
            .cached_input_tokens,
        Some(512)
    );
    let body = br#"{"type":"message","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1,"cache_read_input_tokens":64}}"#;
    assert_eq!(
        parse_response_body(Api::Messages, body)
            .unwrap()
            .cached_input_tokens,
        Some(64)
    );
}
