//! The TGI `generate_stream` event classifier (tokens, final details, errors, foreign
//! streams on its path) and `/generate` body reader.

use super::*;

fn ev(data: &str) -> EventInfo {
    classify_event("message", data.as_bytes()).unwrap()
}

fn token(text: &str, special: bool) -> String {
    format!(
        r#"{{"index":1,"token":{{"id":7,"text":{text},"logprob":-0.1,"special":{special}}},"generated_text":null,"details":null}}"#
    )
}

fn answer() -> EventInfo {
    EventInfo {
        content: true,
        answer: true,
        ..EventInfo::default()
    }
}

#[test]
fn tokens() {
    assert_eq!(ev(&token(r#"" Deep""#, false)), answer());
    assert_eq!(ev(&token(r#""\n""#, false)), answer());
    assert_eq!(ev(&token(r#""""#, false)), EventInfo::default());
    assert_eq!(ev(&token(r#""</s>""#, true)), EventInfo::default());
    // `special` missing: an ordinary token.
    assert_eq!(ev(r#"{"token":{"id":1,"text":"x"}}"#), answer());
    // `top_tokens` are alternatives, not output.
    let top = r#"{"token":{"id":1,"text":"","special":false},"top_tokens":[{"id":2,"text":"y"}]}"#;
    assert_eq!(ev(top), EventInfo::default());
}

#[test]
fn last_event_has_details() {
    let data = r#"{"index":20,"token":{"id":13,"text":".","logprob":-0.3,"special":false},
        "generated_text":"Deep learning is ...","details":{"finish_reason":"length",
        "generated_tokens":20,"seed":null,"input_length":5}}"#;
    let want = EventInfo {
        content: true,
        answer: true,
        usage: Some(Usage {
            input_tokens: Some(5),
            output_tokens: Some(20),
        }),
        finish_reason: Some(FinishReason::Length),
        terminal: true,
        error: false,
        cached_input_tokens: None,
        engine: None,
    };
    assert_eq!(ev(data), want);
}

#[test]
fn input_count_aliases() {
    let details = |d: &str| {
        let data = format!(
            r#"{{"token":{{"id":2,"text":"</s>","special":true}},"generated_text":"x","details":{d}}}"#
        );
        ev(&data).usage
    };
    let usage = |i, o| {
        Some(Usage {
            input_tokens: i,
            output_tokens: o,
        })
    };
    assert_eq!(
        details(r#"{"generated_tokens":3,"prompt_tokens":4}"#),
        usage(Some(4), Some(3))
    );
    let prefill = r#"{"generated_tokens":3,"prefill":[{"id":1,"text":"<s>","logprob":null},{"id":9,"text":"Hi","logprob":-2.1}]}"#;
    assert_eq!(details(prefill), usage(Some(2), Some(3)));
    assert_eq!(
        details(r#"{"generated_tokens":3,"prefill":[]}"#),
        usage(None, Some(3))
    );
    assert_eq!(details(r#"{"finish_reason":"stop_sequence"}"#), None);
}

#[test]
fn errors() {
    let failed = EventInfo {
        error: true,
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(
        ev(r#"{"error":"Request failed during generation","error_type":"generation"}"#),
        failed
    );
    assert_eq!(classify_event("error", b"overloaded").unwrap(), failed);
}

#[test]
fn foreign_and_garbage_are_errors() {
    // SGLang's native `/generate` stream shares TGI's path.
    assert!(
        classify_event(
            "message",
            br#"{"text":"Hi","meta_info":{"id":"1"},"index":0}"#
        )
        .is_err()
    );
    assert!(classify_event("message", b"{}").is_err());
    assert!(classify_event("message", b"data").is_err());
    assert_eq!(ev(""), EventInfo::default());
}

#[test]
fn body_with_and_without_details() {
    let plain = br#"{"generated_text":" is a subset"}"#;
    let want = BodyInfo {
        content: true,
        ..BodyInfo::default()
    };
    assert_eq!(parse_body(plain), Some(want));
    let empty =
        br#"{"generated_text":"","details":{"finish_reason":"eos_token","generated_tokens":1}}"#;
    let got = parse_body(empty).unwrap();
    assert!(!got.content);
    assert_eq!(got.finish_reason, Some(FinishReason::Stop));
    assert_eq!(got.usage.and_then(|u| u.output_tokens), Some(1));
}

#[test]
fn error_and_foreign_bodies() {
    let error = br#"{"error":"Input validation error: `inputs` must not be empty","error_type":"validation"}"#;
    assert_eq!(
        parse_body(error),
        Some(BodyInfo {
            error: true,
            ..BodyInfo::default()
        })
    );
    assert_eq!(parse_body(br#"{"text":"sglang"}"#), None);
    assert_eq!(parse_body(br#"{"meta_info":{}}"#), None);
    assert_eq!(parse_body(br#"[{"generated_text":"compat route"}]"#), None);
}

#[test]
fn sglang_generate_bodies_carry_counts_and_the_engine_timings() {
    let body = br#"{"text":" there","output_ids":[1,2],"meta_info":{"id":"a","finish_reason":{"type":"length","length":2},"prompt_tokens":9,"completion_tokens":2,"cached_tokens":4,"queue_time":0.04,"forward_entry_time":1700000000.5,"prefill_finished_time":1700000000.575,"inference_time":0.1,"e2e_latency":0.2}}"#;
    let got = parse_body(body).unwrap();
    assert!(got.content && !got.error);
    assert_eq!(
        got.usage,
        Some(Usage {
            input_tokens: Some(9),
            output_tokens: Some(2)
        })
    );
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
    assert_eq!(got.cached_input_tokens, Some(4));
    let t = got.engine.unwrap();
    assert_eq!((t.queue_us, t.inference_us), (Some(40_000), Some(100_000)));
    assert!(t.prefill_us.unwrap().abs_diff(75_000) <= 1);
    // Without timings it is still a body, with nothing of the engine's.
    let plain = parse_body(br#"{"text":"x","meta_info":{"prompt_tokens":1}}"#).unwrap();
    assert_eq!(plain.engine, None);
}
