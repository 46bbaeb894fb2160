//! The Responses API event classifier (answer vs reasoning deltas, terminal events, errors)
//! and response-object reader.

use super::*;

fn ev(event: &str, data: &str) -> EventInfo {
    classify_event(event, data.as_bytes()).unwrap()
}

/// A typed event with the same type in the SSE `event:` field, as OpenAI sends it.
fn typed(kind: &str, rest: &str) -> EventInfo {
    ev(
        kind,
        &format!(r#"{{"type":"{kind}","sequence_number":3{rest}}}"#),
    )
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

#[test]
fn answer_deltas() {
    for kind in [
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.mcp_call_arguments.delta",
        "response.code_interpreter_call_code.delta",
    ] {
        assert_eq!(
            typed(kind, r#","item_id":"i","delta":"x""#),
            answer(),
            "{kind}"
        );
        assert_eq!(typed(kind, r#","delta":"\n""#), answer(), "{kind}");
        assert_eq!(
            typed(kind, r#","delta":"""#),
            EventInfo::default(),
            "{kind}"
        );
        assert_eq!(typed(kind, ""), EventInfo::default(), "{kind}");
    }
}

#[test]
fn reasoning_deltas_are_content_not_answer() {
    for kind in [
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning.delta",
    ] {
        assert_eq!(typed(kind, r#","delta":"hmm""#), reasoning(), "{kind}");
        assert_eq!(
            typed(kind, r#","delta":"""#),
            EventInfo::default(),
            "{kind}"
        );
    }
    // `.done` events repeat the text and are not new output.
    assert_eq!(
        typed(
            "response.reasoning_summary_text.done",
            r#","text":"all of it""#
        ),
        EventInfo::default()
    );
}

#[test]
fn other_events_carry_nothing() {
    for kind in [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.audio.delta",
        "response.audio.transcript.delta",
        "response.queued",
    ] {
        assert_eq!(
            typed(kind, r#","delta":"x","response":{"status":"x"}"#),
            EventInfo::default()
        );
    }
}

#[test]
fn json_type_wins_over_the_sse_event_name() {
    let data = r#"{"type":"response.output_text.delta","delta":"x"}"#;
    assert_eq!(ev("response.created", data), answer());
    // Gateways that drop `event:` lines still decode.
    assert_eq!(ev("message", data), answer());
    // An escaped type string is matched without being allocated.
    let escaped = r#"{"type":"response\u002eoutput_text.delta","delta":"x"}"#;
    assert_eq!(ev("message", escaped), answer());
}

#[test]
fn sse_event_name_is_the_fallback_type() {
    assert_eq!(
        ev("response.output_text.delta", r#"{"delta":"x"}"#),
        answer()
    );
    assert!(classify_event("message", br#"{"delta":"x"}"#).is_err());
}

#[test]
fn completed_carries_usage_and_finish() {
    let data = r#"{"type":"response.completed","response":{"status":"completed","output":[
        {"type":"message","content":[{"type":"output_text","text":"hi","annotations":[]}]}],
        "usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":2},"output_tokens":3,
        "output_tokens_details":{"reasoning_tokens":0},"total_tokens":8}}}"#;
    let want = EventInfo {
        usage: Some(Usage {
            input_tokens: Some(5),
            output_tokens: Some(3),
        }),
        cached_input_tokens: Some(2),
        finish_reason: Some(FinishReason::Stop),
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(ev("response.completed", data), want);
}

#[test]
fn completed_with_a_function_call_stopped_for_tool_calls() {
    let data = r#"{"type":"response.completed","response":{"status":"completed","output":[
        {"type":"function_call","call_id":"c","name":"f","arguments":"{}"}],"usage":null}}"#;
    let got = ev("response.completed", data);
    assert_eq!(got.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(got.usage, None);
    assert!(got.terminal && !got.error);
}

#[test]
fn incomplete_says_why() {
    let incomplete = |details: &str| {
        let data = format!(
            r#"{{"type":"response.incomplete","response":{{"status":"incomplete",
            "incomplete_details":{details},"usage":{{"input_tokens":9,"output_tokens":64}}}}}}"#
        );
        ev("response.incomplete", &data)
    };
    let got = incomplete(r#"{"reason":"max_output_tokens"}"#);
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
    assert_eq!(got.usage.and_then(|u| u.output_tokens), Some(64));
    assert!(got.terminal && !got.error);
    assert_eq!(
        incomplete(r#"{"reason":"content_filter"}"#).finish_reason,
        Some(FinishReason::ContentFilter)
    );
    assert_eq!(incomplete("null").finish_reason, Some(FinishReason::Other));
}

#[test]
fn failed_and_error_end_the_stream_with_an_error() {
    let failed = r#"{"type":"response.failed","response":{"status":"failed",
        "error":{"code":"server_error","message":"boom"},"usage":null}}"#;
    let want = EventInfo {
        error: true,
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(ev("response.failed", failed), want);
    let error = r#"{"type":"error","code":"ERR_SOMETHING","message":"boom","param":null}"#;
    assert_eq!(ev("error", error), want);
    assert_eq!(ev("error", "upstream overloaded"), want);
}

#[test]
fn odd_terminal_response_is_still_terminal() {
    for response in [
        "null",
        "7",
        r#"{"status":5}"#,
        r#"{"usage":{"input_tokens":-1}}"#,
    ] {
        let data = format!(r#"{{"type":"response.completed","response":{response}}}"#);
        let got = ev("response.completed", &data);
        assert!(got.terminal && got.usage.is_none(), "{response}");
    }
}

#[test]
fn done_blank_and_garbage() {
    assert!(ev("message", "[DONE]").terminal);
    assert_eq!(ev("message", " "), EventInfo::default());
    assert!(classify_event("response.output_text.delta", b"not json").is_err());
    assert!(classify_event("message", b"[1]").is_err());
}

#[test]
fn body_with_text() {
    let body = br#"{"id":"resp_1","object":"response","status":"completed","error":null,
        "incomplete_details":null,"output":[{"type":"message","role":"assistant",
        "content":[{"type":"output_text","text":"Hello","annotations":[]}]}],
        "usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}"#;
    let want = BodyInfo {
        usage: Some(Usage {
            input_tokens: Some(3),
            output_tokens: Some(1),
        }),
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
    let content = |output: &str| {
        let body = format!(r#"{{"status":"completed","output":{output}}}"#);
        parse_body(body.as_bytes()).unwrap().content
    };
    assert!(content(
        r#"[{"type":"message","content":[{"type":"refusal","refusal":"no"}]}]"#
    ));
    assert!(content(
        r#"[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]}]"#
    ));
    assert!(content(
        r#"[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"t"}]}]"#
    ));
    assert!(content(r#"[{"type":"custom_tool_call","input":"x"}]"#));
    assert!(!content(r#"[{"type":"reasoning","summary":[]}]"#));
    assert!(!content(
        r#"[{"type":"message","content":[{"type":"output_text","text":""}]}]"#
    ));
    assert!(!content(
        r#"[{"type":"web_search_call","status":"completed"}]"#
    ));
    assert!(!content("[]"));
    // Another item type's odd `content` does not spoil the rest.
    assert!(content(
        r#"[{"type":"x","content":"str"},{"type":"function_call","arguments":""}]"#
    ));
}

#[test]
fn incomplete_failed_and_error_bodies() {
    let incomplete =
        br#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
        "output":[],"usage":{"input_tokens":3,"output_tokens":16}}"#;
    let got = parse_body(incomplete).unwrap();
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
    assert!(!got.error);
    let failed =
        br#"{"status":"failed","error":{"code":"server_error","message":"x"},"output":[]}"#;
    let got = parse_body(failed).unwrap();
    assert!(got.error);
    assert_eq!(got.finish_reason, None);
    let error =
        br#"{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}"#;
    assert!(parse_body(error).unwrap().error);
    assert_eq!(parse_body(b"<html>"), None);
}
