//! The OpenAI chunk classifier (content vs answer, finish reasons, usage, errors) and body
//! reader.

use super::*;
use crate::decode::Api;

fn info(data: &str) -> EventInfo {
    classify_chunk(data.as_bytes()).unwrap()
}

fn chat(delta: &str, finish: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}],"usage":null}}"#
    )
}

/// A content-bearing answer event (text, tool call, refusal).
fn answer() -> EventInfo {
    EventInfo {
        content: true,
        answer: true,
        ..EventInfo::default()
    }
}

/// A content-bearing reasoning-only event: TTFT but not TTFO.
fn reasoning() -> EventInfo {
    EventInfo {
        content: true,
        ..EventInfo::default()
    }
}

#[test]
fn done_is_terminal() {
    let done = EventInfo {
        terminal: true,
        ..EventInfo::default()
    };
    assert_eq!(info("[DONE]"), done);
    assert_eq!(info(" [DONE] \n"), done);
    assert!(classify_chunk(b"[DONE!]").is_err());
}

#[test]
fn role_chunk_is_not_content() {
    let role = chat(
        r#"{"role":"assistant","content":"","refusal":null}"#,
        "null",
    );
    assert_eq!(info(&role), EventInfo::default());
    // vLLM variants: null content, no content at all, empty delta.
    assert_eq!(
        info(&chat(r#"{"role":"assistant","content":null}"#, "null")),
        EventInfo::default()
    );
    assert_eq!(
        info(&chat(r#"{"role":"assistant"}"#, "null")),
        EventInfo::default()
    );
    assert_eq!(info(&chat("{}", "null")), EventInfo::default());
    assert_eq!(info(&chat("null", "null")), EventInfo::default());
}

#[test]
fn text_delta_is_content() {
    assert_eq!(info(&chat(r#"{"content":"Hello"}"#, "null")), answer());
    assert_eq!(info(&chat(r#"{"content":" "}"#, "null")), answer());
}

#[test]
fn escaped_text_is_still_content() {
    assert_eq!(info(&chat(r#"{"content":"\n"}"#, "null")), answer());
    assert_eq!(info(&chat(r#"{"content":"\u00e9"}"#, "null")), answer());
    assert_eq!(info(&chat(r#"{"content":"\"\""}"#, "null")), answer());
}

#[test]
fn refusal_and_tool_calls_are_answer() {
    for delta in [
        r#"{"refusal":"I can't help with that."}"#,
        r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
        r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}"#,
        r#"{"function_call":{"name":"get_weather","arguments":""}}"#,
        r#"{"content":[{"type":"text","text":"hi"}]}"#,
        r#"{"content":"x","reasoning_content":"and some thought"}"#,
    ] {
        assert_eq!(info(&chat(delta, "null")), answer(), "{delta}");
    }
}

#[test]
fn reasoning_only_is_content_but_not_answer() {
    for delta in [
        r#"{"content":null,"reasoning_content":"Let me think"}"#,
        r#"{"content":"","reasoning":"hmm"}"#,
        r#"{"reasoning_content":"\n","tool_calls":[]}"#,
    ] {
        assert_eq!(info(&chat(delta, "null")), reasoning(), "{delta}");
    }
}

#[test]
fn answer_and_content_fold_over_choices() {
    let data = r#"{"choices":[
        {"index":0,"delta":{"reasoning_content":"r"}},
        {"index":1,"delta":{"content":"a"}}]}"#;
    assert_eq!(info(data), answer());
    let data = r#"{"choices":[{"index":0,"delta":{"reasoning":"r"}},{"index":1,"delta":{}}]}"#;
    assert_eq!(info(data), reasoning());
}

#[test]
fn empty_values_are_not_content() {
    for delta in [
        r#"{"tool_calls":[]}"#,
        r#"{"tool_calls":[ ]}"#,
        r#"{"tool_calls":null,"refusal":null,"reasoning_content":null}"#,
        r#"{"reasoning":{}}"#,
        r#"{"refusal":""}"#,
        r#"{"function_call":null}"#,
    ] {
        assert_eq!(info(&chat(delta, "null")), EventInfo::default(), "{delta}");
    }
}

#[test]
fn finish_reason_is_normalized() {
    let finish = |wire: &str| info(&chat("{}", &format!("\"{wire}\""))).finish_reason;
    assert_eq!(finish("stop"), Some(FinishReason::Stop));
    assert_eq!(finish("length"), Some(FinishReason::Length));
    assert_eq!(finish("tool_calls"), Some(FinishReason::ToolCalls));
    assert_eq!(finish("function_call"), Some(FinishReason::ToolCalls));
    assert_eq!(finish("content_filter"), Some(FinishReason::ContentFilter));
    assert_eq!(finish("abort"), Some(FinishReason::Other));
    assert_eq!(finish("\\u0073top"), Some(FinishReason::Stop));
}

#[test]
fn finish_reason_and_content_come_from_any_choice() {
    let data = r#"{"choices":[
        {"index":0,"delta":{"content":""},"finish_reason":null},
        {"index":1,"delta":{"content":"x"},"finish_reason":"length"}]}"#;
    let got = info(data);
    assert!(got.content && got.answer);
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
}

#[test]
fn usage_chunk_is_read() {
    let data = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}"#;
    let want = EventInfo {
        usage: Some(Usage {
            input_tokens: Some(9),
            output_tokens: Some(12),
        }),
        // Reported, and zero: a prefix-cache miss.
        cached_input_tokens: Some(0),
        ..EventInfo::default()
    };
    assert_eq!(info(data), want);
}

#[test]
fn usage_on_every_chunk_is_read_with_the_content() {
    // vLLM with `continuous_usage_stats`.
    let data = r#"{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}"#;
    let got = info(data);
    assert!(got.content);
    assert_eq!(
        got.usage,
        Some(Usage {
            input_tokens: Some(5),
            output_tokens: Some(1)
        })
    );
}

#[test]
fn odd_usage_is_ignored_not_fatal() {
    for usage in ["null", "5", r#""x""#, "{}", r#"{"prompt_tokens":-1}"#] {
        let data = format!(r#"{{"choices":[{{"delta":{{"content":"a"}}}}],"usage":{usage}}}"#);
        assert_eq!(info(&data), answer(), "{usage}");
    }
}

#[test]
fn completions_text_chunk() {
    let text = |t: &str, finish: &str| {
        format!(
            r#"{{"id":"cmpl-1","object":"text_completion","created":1,"choices":[{{"text":{t},"index":0,"logprobs":null,"finish_reason":{finish}}}],"model":"m"}}"#
        )
    };
    assert_eq!(info(&text(r#"" world""#, "null")), answer());
    let last = info(&text(r#""""#, r#""length""#));
    assert!(!last.content && !last.answer);
    assert_eq!(last.finish_reason, Some(FinishReason::Length));
}

#[test]
fn error_object_is_flagged() {
    let data = r#"{"error":{"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}}"#;
    let got = info(data);
    assert!(got.error);
    assert!(!got.content && !got.terminal);
    assert!(info(r#"{"object":"error","message":"boom","code":500}"#).error);
    assert!(!info(r#"{"choices":[],"error":null}"#).error);
    assert!(!info(&chat(r#"{"content":"a"}"#, "null")).error);
}

#[test]
fn non_json_is_an_error_but_blank_is_not() {
    assert!(classify_chunk(b"hello").is_err());
    assert!(classify_chunk(br#"{"choices":"#).is_err());
    assert!(classify_chunk(b"[1,2]").is_err());
    assert!(classify_chunk(b"42").is_err());
    assert_eq!(classify_chunk(b" \n").unwrap(), EventInfo::default());
}

#[test]
fn chat_body_is_read() {
    let body = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
        "choices":[{"index":0,"message":{"role":"assistant","content":"Hi there","refusal":null},
        "logprobs":null,"finish_reason":"stop"}],
        "usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}"#;
    let want = BodyInfo {
        usage: Some(Usage {
            input_tokens: Some(10),
            output_tokens: Some(3),
        }),
        finish_reason: Some(FinishReason::Stop),
        content: true,
        error: false,
        cached_input_tokens: None,
        engine: None,
    };
    assert_eq!(parse_response_body(Api::ChatCompletions, body), Some(want));
}

#[test]
fn tool_call_body_without_text_has_content() {
    let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,
        "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
        "finish_reason":"tool_calls"}]}"#;
    let got = parse_response_body(Api::ChatCompletions, body).unwrap();
    assert!(got.content);
    assert_eq!(got.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(got.usage, None);
}

#[test]
fn empty_body_message_is_not_content() {
    let body =
        br#"{"choices":[{"message":{"role":"assistant","content":""},"finish_reason":"length"}]}"#;
    let got = parse_response_body(Api::ChatCompletions, body).unwrap();
    assert!(!got.content);
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
}

#[test]
fn completions_body_is_read() {
    let body = br#"{"object":"text_completion","choices":[{"text":"42","index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#;
    let got = parse_response_body(Api::Completions, body).unwrap();
    assert!(got.content);
    assert_eq!(got.usage.and_then(|u| u.output_tokens), Some(1));
}

#[test]
fn error_bodies_are_flagged() {
    let old =
        br#"{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}"#;
    let new =
        br#"{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}"#;
    for body in [&old[..], &new[..]] {
        let got = parse_response_body(Api::ChatCompletions, body).unwrap();
        assert!(got.error);
        assert!(!got.content);
    }
}

#[test]
fn body_that_is_not_json_or_not_openai_is_none() {
    assert_eq!(
        parse_response_body(Api::ChatCompletions, b"<html>502</html>"),
        None
    );
    assert_eq!(parse_response_body(Api::ChatCompletions, b"[]"), None);
    assert_eq!(
        parse_response_body(Api::Unknown, br#"{"choices":[]}"#),
        None
    );
}

#[test]
fn reasoning_only_body_has_content() {
    let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,
        "reasoning_content":"thinking..."},"finish_reason":"length"}]}"#;
    let got = parse_response_body(Api::ChatCompletions, body).unwrap();
    assert!(got.content);
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
}

/// The text classification hands over must be exactly what the full walk collects.
#[test]
fn event_text_agrees_with_the_full_walk() {
    use crate::decode::text::{self, TextBuf, paths};
    let events = [
        chat(r#"{"content":"Hello"}"#, "null"),
        chat(r#"{"role":"assistant","content":""}"#, "null"),
        chat(r#"{"content":"line\nbreak"}"#, "null"),
        chat(r#"{"reasoning_content":"think"}"#, "null"),
        chat(r#"{"reasoning":"hmm","content":"a"}"#, "null"),
        chat(r#"{"content":null,"refusal":"no"}"#, "null"),
        chat(
            r#"{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]}"#,
            "null",
        ),
        chat(
            r#"{"function_call":{"name":"f","arguments":"{\"a\":1}"}}"#,
            "null",
        ),
        chat(r#"{"content":["odd"]}"#, "null"),
        r#"{"choices":[{"index":0,"text":"completion "}]}"#.to_owned(),
        r#"{"choices":[{"index":0,"delta":{"content":"x"}},{"index":1,"delta":{"content":"y"}}]}"#
            .to_owned(),
        r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#.to_owned(),
        "[DONE]".to_owned(),
    ];
    for e in &events {
        let (_, known) = classify_chunk_text(e.as_bytes()).unwrap();
        let mut walked = TextBuf::new(1 << 20);
        text::collect(e.as_bytes(), paths::OPENAI_EVENT, &mut walked);
        match known {
            EventText::One(s) => assert_eq!(s, walked.text(), "{e}"),
            EventText::None => assert_eq!(walked.text(), "", "{e}"),
            EventText::Other => {}
        }
    }
    let hi = chat(r#"{"content":"Hi"}"#, "null");
    let (_, known) = classify_chunk_text(hi.as_bytes()).unwrap();
    assert_eq!(
        known,
        EventText::One("Hi"),
        "the usual chunk takes the fast path"
    );
}

mod fast_paths;
