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
        ("/v1/embeddings", Api::Unknown),
        ("/v1/messages", Api::Unknown),
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
    assert_eq!(Api::Unknown.as_str(), "unknown");
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
fn decoder_only_for_openai_sse() {
    assert!(StreamDecoder::new(Api::ChatCompletions, StreamKind::Sse).is_some());
    assert!(StreamDecoder::new(Api::Completions, StreamKind::Sse).is_some());
    assert!(StreamDecoder::new(Api::Unknown, StreamKind::Sse).is_none());
    assert!(StreamDecoder::new(Api::ChatCompletions, StreamKind::Json).is_none());
    assert!(StreamDecoder::new(Api::ChatCompletions, StreamKind::Ndjson).is_none());
    assert!(StreamDecoder::new(Api::ChatCompletions, StreamKind::Other).is_none());
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

#[test]
fn request_fields_are_read() {
    let body = br#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],
        "stream":true,"stream_options":{"include_usage":true},"max_tokens":256}"#;
    let want = RequestInfo {
        model: Some("llama-3-8b".to_owned()),
        stream: true,
        include_usage: true,
        max_tokens: Some(256),
    };
    assert_eq!(inspect_request(body), Some(want));
}

#[test]
fn request_defaults_and_fallbacks() {
    let body =
        br#"{"prompt":"x","max_completion_tokens":64,"stream_options":{"include_usage":false}}"#;
    let want = RequestInfo {
        max_tokens: Some(64),
        ..RequestInfo::default()
    };
    assert_eq!(inspect_request(body), Some(want));
    let both = br#"{"max_tokens":10,"max_completion_tokens":64}"#;
    assert_eq!(inspect_request(both).unwrap().max_tokens, Some(10));
    let null_max = br#"{"max_tokens":null,"max_completion_tokens":64}"#;
    assert_eq!(inspect_request(null_max).unwrap().max_tokens, Some(64));
}

#[test]
fn odd_request_fields_lose_only_themselves() {
    let body = br#"{"model":"m\u00e9","stream":"yes","max_tokens":-1,"stream_options":null}"#;
    let want = RequestInfo {
        model: Some("mé".to_owned()),
        ..RequestInfo::default()
    };
    assert_eq!(inspect_request(body), Some(want));
    let body = br#"{"model":7,"stream":true,"stream_options":{"include_usage":"true"}}"#;
    let want = RequestInfo {
        stream: true,
        ..RequestInfo::default()
    };
    assert_eq!(inspect_request(body), Some(want));
}

#[test]
fn request_that_is_not_an_object_is_none() {
    assert_eq!(inspect_request(b""), None);
    assert_eq!(inspect_request(b"model=x"), None);
    assert_eq!(inspect_request(b"[1]"), None);
    assert_eq!(inspect_request(br#"{"model":"x""#), None);
}
