//! The Anthropic Messages event classifier (block deltas and starts, usage split across
//! `message_start` / `message_delta`, errors) and message-body reader.

use super::*;

fn ev(event: &str, data: &str) -> EventInfo {
    classify_event(event, data.as_bytes()).unwrap()
}

fn delta(kind: &str, field: &str, value: &str) -> EventInfo {
    let data = format!(
        r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"{kind}","{field}":{value}}}}}"#
    );
    ev("content_block_delta", &data)
}

fn start(block: &str) -> EventInfo {
    let data = format!(r#"{{"type":"content_block_start","index":0,"content_block":{block}}}"#);
    ev("content_block_start", &data)
}

fn answer() -> EventInfo {
    EventInfo {
        content: true,
        answer: true,
        ..EventInfo::default()
    }
}

fn reasoning() -> EventInfo {
    EventInfo {
        content: true,
        ..EventInfo::default()
    }
}

fn usage(input: Option<u64>, output: Option<u64>) -> Option<Usage> {
    Some(Usage {
        input_tokens: input,
        output_tokens: output,
    })
}

#[test]
fn message_start_gives_input_only() {
    let data = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",
        "content":[],"model":"m","stop_reason":null,"stop_sequence":null,
        "usage":{"input_tokens":25,"output_tokens":1}}}"#;
    assert_eq!(
        ev("message_start", data),
        EventInfo {
            usage: usage(Some(25), None),
            ..EventInfo::default()
        }
    );
}

#[test]
fn cached_prompt_tokens_count_as_input() {
    let data = r#"{"type":"message_start","message":{"usage":{"input_tokens":3,
        "cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}"#;
    assert_eq!(ev("message_start", data).usage, usage(Some(2103), None));
    let nulls = r#"{"type":"message_start","message":{"usage":{"input_tokens":3,
        "cache_creation_input_tokens":null,"cache_read_input_tokens":null}}}"#;
    assert_eq!(ev("message_start", nulls).usage, usage(Some(3), None));
}

#[test]
fn odd_message_start_loses_only_its_usage() {
    for message in [
        "null",
        "[]",
        r#"{"usage":"x"}"#,
        r#"{"usage":{"input_tokens":-1}}"#,
        "{}",
    ] {
        let data = format!(r#"{{"type":"message_start","message":{message}}}"#);
        assert_eq!(
            ev("message_start", &data),
            EventInfo::default(),
            "{message}"
        );
    }
}

#[test]
fn content_block_deltas() {
    assert_eq!(delta("text_delta", "text", r#""Hi""#), answer());
    assert_eq!(delta("text_delta", "text", r#""\n""#), answer());
    assert_eq!(delta("text_delta", "text", r#""""#), EventInfo::default());
    assert_eq!(delta("thinking_delta", "thinking", r#""hmm""#), reasoning());
    assert_eq!(
        delta("thinking_delta", "thinking", r#""""#),
        EventInfo::default()
    );
    assert_eq!(
        delta("input_json_delta", "partial_json", r#""{\"a\":""#),
        answer()
    );
    assert_eq!(
        delta("input_json_delta", "partial_json", r#""""#),
        EventInfo::default()
    );
    assert_eq!(
        delta("signature_delta", "signature", r#""EqQBCg==""#),
        EventInfo::default()
    );
    assert_eq!(
        delta("citations_delta", "citation", r#"{"type":"x"}"#),
        EventInfo::default()
    );
    // The field of another delta type is not read.
    assert_eq!(
        delta("signature_delta", "text", r#""x""#),
        EventInfo::default()
    );
}

#[test]
fn content_block_starts() {
    assert_eq!(start(r#"{"type":"text","text":""}"#), EventInfo::default());
    assert_eq!(start(r#"{"type":"text","text":"Hi"}"#), answer());
    assert_eq!(
        start(r#"{"type":"thinking","thinking":"","signature":""}"#),
        EventInfo::default()
    );
    assert_eq!(
        start(r#"{"type":"redacted_thinking","data":"EmwKAhgBEgy="}"#),
        reasoning()
    );
    for tool in ["tool_use", "server_tool_use", "mcp_tool_use"] {
        let block = format!(r#"{{"type":"{tool}","id":"toolu_1","name":"f","input":{{}}}}"#);
        assert_eq!(start(&block), answer(), "{tool}");
    }
    let result = r#"{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[]}"#;
    assert_eq!(start(result), EventInfo::default());
}

#[test]
fn message_delta_gives_output_and_stop_reason() {
    let md = |delta: &str, usage: &str| {
        let data = format!(r#"{{"type":"message_delta","delta":{delta},"usage":{usage}}}"#);
        ev("message_delta", &data)
    };
    let got = md(
        r#"{"stop_reason":"end_turn","stop_sequence":null}"#,
        r#"{"output_tokens":15}"#,
    );
    let want = EventInfo {
        usage: usage(None, Some(15)),
        finish_reason: Some(FinishReason::Stop),
        ..EventInfo::default()
    };
    assert_eq!(got, want);
    let reasons = [
        ("max_tokens", FinishReason::Length),
        ("stop_sequence", FinishReason::Stop),
        ("tool_use", FinishReason::ToolCalls),
        ("refusal", FinishReason::ContentFilter),
        ("model_context_window_exceeded", FinishReason::Length),
        ("pause_turn", FinishReason::Other),
    ];
    for (wire, reason) in reasons {
        let got = md(&format!(r#"{{"stop_reason":"{wire}"}}"#), "null");
        assert_eq!(got.finish_reason, Some(reason), "{wire}");
        assert_eq!(got.usage, None);
    }
    // Newer servers repeat the cumulative input counts here too.
    let full = r#"{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":20}"#;
    assert_eq!(
        md(r#"{"stop_reason":null}"#, full).usage,
        usage(Some(15), Some(20))
    );
}

#[test]
fn stop_ping_and_errors() {
    let terminal = EventInfo {
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(ev("message_stop", r#"{"type":"message_stop"}"#), terminal);
    assert_eq!(ev("ping", r#"{"type": "ping"}"#), EventInfo::default());
    assert_eq!(
        ev(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#
        ),
        EventInfo::default()
    );
    let failed = EventInfo {
        error: true,
        terminal: true,
        ..EventInfo::default()
    };
    let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(ev("error", error), failed);
    assert_eq!(ev("message", error), failed);
    assert_eq!(ev("error", "Internal server error"), failed);
}

#[test]
fn type_comes_from_json_else_from_the_event_name() {
    assert!(ev("message", r#"{"type":"message_stop"}"#).terminal);
    assert!(ev("message_stop", "{}").terminal);
    assert!(ev("ping", r#"{"type":"message_stop"}"#).terminal);
    assert!(classify_event("message", b"{}").is_err());
    assert!(classify_event("message_stop", b"not json").is_err());
    assert_eq!(
        ev("some_future_event", r#"{"type":"some_future_event"}"#),
        EventInfo::default()
    );
}

#[test]
fn body_is_read() {
    let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"m",
        "content":[{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","stop_sequence":null,
        "usage":{"input_tokens":10,"output_tokens":4}}"#;
    let want = BodyInfo {
        usage: usage(Some(10), Some(4)),
        finish_reason: Some(FinishReason::Stop),
        content: true,
        error: false,
        cached_input_tokens: None,
        engine: None,
    };
    assert_eq!(parse_body(body), Some(want));
}

#[test]
fn body_content_kinds() {
    let content = |blocks: &str| {
        let body = format!(r#"{{"type":"message","content":{blocks},"stop_reason":"tool_use"}}"#);
        parse_body(body.as_bytes()).unwrap().content
    };
    assert!(content(
        r#"[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]"#
    ));
    assert!(content(
        r#"[{"type":"thinking","thinking":"x","signature":"s"}]"#
    ));
    assert!(!content(r#"[{"type":"text","text":""}]"#));
    assert!(!content("[]"));
}

#[test]
fn error_body_and_garbage() {
    let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#;
    let got = parse_body(body).unwrap();
    assert!(got.error && !got.content && got.usage.is_none());
    assert_eq!(parse_body(b"<html>502</html>"), None);
    assert_eq!(parse_body(b"[]"), None);
}
