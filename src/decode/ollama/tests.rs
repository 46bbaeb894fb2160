//! The Ollama line classifier (chat and generate lines, thinking, the `done` line, errors)
//! and non-streaming body reader.

use super::*;

fn ev(line: &str) -> EventInfo {
    classify_line(line.as_bytes()).unwrap()
}

fn chat(message: &str) -> EventInfo {
    ev(&format!(
        r#"{{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{message},"done":false}}"#
    ))
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
fn chat_lines() {
    assert_eq!(chat(r#"{"role":"assistant","content":"The"}"#), answer());
    assert_eq!(
        chat(r#"{"role":"assistant","content":"","thinking":"hmm"}"#),
        reasoning()
    );
    assert_eq!(
        chat(r#"{"role":"assistant","content":"x","thinking":"hmm"}"#),
        answer()
    );
    let tool = r#"{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]}"#;
    assert_eq!(chat(tool), answer());
    assert_eq!(
        chat(r#"{"role":"assistant","content":"","tool_calls":[]}"#),
        EventInfo::default()
    );
    assert_eq!(
        chat(r#"{"role":"assistant","content":"","images":null}"#),
        EventInfo::default()
    );
}

#[test]
fn generate_lines() {
    assert_eq!(
        ev(r#"{"model":"m","response":"The","done":false}"#),
        answer()
    );
    assert_eq!(
        ev(r#"{"model":"m","response":"","thinking":"so","done":false}"#),
        reasoning()
    );
    assert_eq!(
        ev(r#"{"model":"m","response":"","done":false}"#),
        EventInfo::default()
    );
}

#[test]
fn last_line() {
    let line = r#"{"model":"m","response":"","done":true,"done_reason":"stop","context":[1,2,3],
        "total_duration":10706818083,"prompt_eval_count":26,"eval_count":259}"#;
    let want = EventInfo {
        usage: Some(Usage {
            input_tokens: Some(26),
            output_tokens: Some(259),
        }),
        finish_reason: Some(FinishReason::Stop),
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(ev(line), want);
    let reason = |r: &str| ev(&format!(r#"{{"done":true,"done_reason":"{r}"}}"#)).finish_reason;
    assert_eq!(reason("length"), Some(FinishReason::Length));
    assert_eq!(reason("load"), Some(FinishReason::Other));
    // No counts (a model load): terminal, no usage.
    let load = ev(r#"{"model":"m","response":"","done":true,"done_reason":"load"}"#);
    assert!(load.terminal && load.usage.is_none());
}

#[test]
fn counts_before_done_are_not_usage() {
    let line = r#"{"response":"a","done":false,"eval_count":1,"done_reason":"stop"}"#;
    assert_eq!(ev(line), answer());
}

#[test]
fn error_line_ends_the_stream() {
    let want = EventInfo {
        error: true,
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(ev(r#"{"error":"model 'nope' not found"}"#), want);
}

#[test]
fn foreign_and_garbage_lines() {
    assert!(classify_line(br#"{"status":"pulling manifest"}"#).is_err());
    assert!(classify_line(b"not json").is_err());
    assert!(classify_line(b"[1,2]").is_err());
    assert_eq!(ev("  "), EventInfo::default());
}

#[test]
fn bodies() {
    let chat = br#"{"model":"m","message":{"role":"assistant","content":"Hi"},"done":true,
        "done_reason":"length","prompt_eval_count":3,"eval_count":8}"#;
    let want = BodyInfo {
        usage: Some(Usage {
            input_tokens: Some(3),
            output_tokens: Some(8),
        }),
        finish_reason: Some(FinishReason::Length),
        content: true,
        error: false,
        cached_input_tokens: None,
        engine: None,
    };
    assert_eq!(parse_body(chat), Some(want));
    let thinking_only = br#"{"model":"m","response":"","thinking":"t","done":true}"#;
    assert!(parse_body(thinking_only).unwrap().content);
    let error = br#"{"error":"model requires more system memory"}"#;
    assert_eq!(
        parse_body(error),
        Some(BodyInfo {
            error: true,
            ..BodyInfo::default()
        })
    );
    assert_eq!(parse_body(br#"{"models":[]}"#), None);
}
