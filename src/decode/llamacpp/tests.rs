//! The llama.cpp `/completion` event classifier (pieces, the final counts and stop type,
//! errors) and body reader, including multi-prompt bodies.

use super::*;

fn ev(data: &str) -> EventInfo {
    classify_event("message", data.as_bytes()).unwrap()
}

fn answer() -> EventInfo {
    EventInfo {
        content: true,
        answer: true,
        ..EventInfo::default()
    }
}

fn last(fields: &str) -> EventInfo {
    ev(&format!(r#"{{"content":"","stop":true,{fields}}}"#))
}

#[test]
fn partial_events() {
    let partial = r#"{"index":0,"content":" Paris","tokens":[3681],"stop":false,"id_slot":0,"tokens_predicted":3,"tokens_evaluated":8}"#;
    // Running counts on partial events are progress, not the usage report.
    assert_eq!(ev(partial), answer());
    assert_eq!(ev(r#"{"content":"\u00e9","stop":false}"#), answer());
    let progress = r#"{"content":"","stop":false,"prompt_progress":{"total":40,"cache":0,"processed":20,"time_ms":5}}"#;
    assert_eq!(ev(progress), EventInfo::default());
    assert_eq!(ev(r#"{"content":"x"}"#), answer());
}

#[test]
fn last_event_counts_and_stop_type() {
    let got = last(r#""tokens_predicted":16,"tokens_evaluated":9,"stop_type":"eos""#);
    let want = EventInfo {
        usage: Some(Usage {
            input_tokens: Some(9),
            output_tokens: Some(16),
        }),
        finish_reason: Some(FinishReason::Stop),
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(got, want);
    let reason = |fields: &str| last(fields).finish_reason;
    assert_eq!(
        reason(r#""stop_type":"word","stopping_word":"\n""#),
        Some(FinishReason::Stop)
    );
    assert_eq!(reason(r#""stop_type":"limit""#), Some(FinishReason::Length));
    assert_eq!(reason(r#""stop_type":"none""#), None);
    assert_eq!(reason(r#""stop_type":"abort""#), Some(FinishReason::Other));
    assert_eq!(
        reason(r#""stopped_eos":false,"stopped_word":false,"stopped_limit":true"#),
        Some(FinishReason::Length)
    );
    assert_eq!(
        reason(r#""stopped_eos":true,"stopped_word":false,"stopped_limit":false"#),
        Some(FinishReason::Stop)
    );
    assert_eq!(reason(r#""stopped_word":true"#), Some(FinishReason::Stop));
    assert_eq!(reason(r#""truncated":false"#), None);
}

#[test]
fn timings_are_the_fallback_counts() {
    let usage = |fields: &str| last(fields).usage;
    let timings =
        r#""timings":{"prompt_n":4,"prompt_ms":1.5,"predicted_n":7,"predicted_ms":20.25}"#;
    assert_eq!(
        usage(timings),
        Some(Usage {
            input_tokens: Some(4),
            output_tokens: Some(7)
        })
    );
    let both = format!(r#""tokens_predicted":8,"tokens_evaluated":30,{timings}"#);
    assert_eq!(
        usage(&both),
        Some(Usage {
            input_tokens: Some(30),
            output_tokens: Some(8)
        })
    );
    assert_eq!(usage(r#""model":"m""#), None);
}

#[test]
fn errors_done_and_foreign() {
    let failed = EventInfo {
        error: true,
        terminal: true,
        ..EventInfo::default()
    };
    let error =
        r#"{"error":{"code":500,"message":"context shift is disabled","type":"server_error"}}"#;
    assert_eq!(ev(error), failed);
    assert_eq!(classify_event("error", b"oops").unwrap(), failed);
    assert!(ev("[DONE]").terminal);
    assert!(classify_event("message", br#"{"choices":[]}"#).is_err());
    assert!(classify_event("message", b"nope").is_err());
}

#[test]
fn body_is_read() {
    let body = br#"{"content":" Paris.","stop":true,"tokens_predicted":3,"tokens_evaluated":9,
        "stop_type":"eos","timings":{"prompt_n":1,"predicted_n":3}}"#;
    let want = BodyInfo {
        usage: Some(Usage {
            input_tokens: Some(9),
            output_tokens: Some(3),
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
fn multi_prompt_body_is_summed() {
    let body = br#"[{"index":0,"content":"a","stop":true,"tokens_predicted":3,"tokens_evaluated":9,"stop_type":"limit"},
        {"index":1,"content":"","stop":true,"tokens_predicted":2,"tokens_evaluated":5,"stop_type":"eos"}]"#;
    let want = BodyInfo {
        usage: Some(Usage {
            input_tokens: Some(14),
            output_tokens: Some(5),
        }),
        finish_reason: Some(FinishReason::Length),
        content: true,
        error: false,
        cached_input_tokens: None,
        engine: None,
    };
    assert_eq!(parse_body(body), Some(want));
    assert_eq!(parse_body(b"[]"), None);
}

#[test]
fn error_and_foreign_bodies() {
    let error = br#"{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}"#;
    assert_eq!(
        parse_body(error),
        Some(BodyInfo {
            error: true,
            ..BodyInfo::default()
        })
    );
    assert_eq!(parse_body(br#"{"status":"ok"}"#), None);
    assert_eq!(parse_body(b"Not Found"), None);
}
