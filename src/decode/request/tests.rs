//! Request inspection per dialect: model, stream flag and its defaults, usage opt-in and the
//! output cap, and leniency towards odd fields.

use super::*;

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
    assert_eq!(inspect_request(Api::ChatCompletions, body), Some(want));
}

#[test]
fn request_defaults_and_fallbacks() {
    let body =
        br#"{"prompt":"x","max_completion_tokens":64,"stream_options":{"include_usage":false}}"#;
    let want = RequestInfo {
        max_tokens: Some(64),
        ..RequestInfo::default()
    };
    assert_eq!(inspect_request(Api::ChatCompletions, body), Some(want));
    let both = br#"{"max_tokens":10,"max_completion_tokens":64}"#;
    assert_eq!(
        inspect_request(Api::ChatCompletions, both)
            .unwrap()
            .max_tokens,
        Some(10)
    );
    let null_max = br#"{"max_tokens":null,"max_completion_tokens":64}"#;
    assert_eq!(
        inspect_request(Api::ChatCompletions, null_max)
            .unwrap()
            .max_tokens,
        Some(64)
    );
}

#[test]
fn odd_request_fields_lose_only_themselves() {
    let body = br#"{"model":"m\u00e9","stream":"yes","max_tokens":-1,"stream_options":null}"#;
    let want = RequestInfo {
        model: Some("mé".to_owned()),
        ..RequestInfo::default()
    };
    assert_eq!(inspect_request(Api::ChatCompletions, body), Some(want));
    let body = br#"{"model":7,"stream":true,"stream_options":{"include_usage":"true"}}"#;
    let want = RequestInfo {
        stream: true,
        ..RequestInfo::default()
    };
    assert_eq!(inspect_request(Api::ChatCompletions, body), Some(want));
}

#[test]
fn request_that_is_not_an_object_is_none() {
    assert_eq!(inspect_request(Api::ChatCompletions, b""), None);
    assert_eq!(inspect_request(Api::ChatCompletions, b"model=x"), None);
    assert_eq!(inspect_request(Api::ChatCompletions, b"[1]"), None);
    assert_eq!(
        inspect_request(Api::ChatCompletions, br#"{"model":"x""#),
        None
    );
}

#[test]
fn unknown_api_reads_openai_fields() {
    let body = br#"{"model":"m","stream":true,"max_tokens":5,"n_predict":9}"#;
    let got = inspect_request(Api::Unknown, body).unwrap();
    assert_eq!((got.stream, got.max_tokens), (true, Some(5)));
}

#[test]
fn responses_request() {
    let body = br#"{"model":"gpt-4.1","input":[{"role":"user","content":"hi"}],
        "stream":true,"max_output_tokens":512,"max_tokens":7}"#;
    let want = RequestInfo {
        model: Some("gpt-4.1".to_owned()),
        stream: true,
        include_usage: true,
        max_tokens: Some(512),
    };
    assert_eq!(inspect_request(Api::Responses, body), Some(want));
    let bare = inspect_request(Api::Responses, br#"{"input":"hi"}"#).unwrap();
    assert_eq!((bare.stream, bare.max_tokens), (false, None));
}

#[test]
fn anthropic_request() {
    let body = br#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,
        "system":"be brief","messages":[{"role":"user","content":"hi"}],
        "thinking":{"type":"enabled","budget_tokens":512}}"#;
    let want = RequestInfo {
        model: Some("claude-sonnet-4-5".to_owned()),
        stream: true,
        include_usage: true,
        max_tokens: Some(1024),
    };
    assert_eq!(inspect_request(Api::Messages, body), Some(want));
    let silent = inspect_request(Api::Messages, br#"{"max_tokens":8}"#).unwrap();
    assert!(!silent.stream);
}

#[test]
fn tgi_request_streams_by_path() {
    let body = br#"{"inputs":"What is Deep Learning?","parameters":{"max_new_tokens":20,
        "temperature":0.5,"details":false},"stream":false}"#;
    let stream = inspect_request(
        Api::TgiGenerate {
            stream_endpoint: true,
        },
        body,
    )
    .unwrap();
    let want = RequestInfo {
        model: None,
        stream: true,
        include_usage: true,
        max_tokens: Some(20),
    };
    assert_eq!(stream, want);
    let plain = inspect_request(
        Api::TgiGenerate {
            stream_endpoint: false,
        },
        body,
    )
    .unwrap();
    assert_eq!((plain.stream, plain.include_usage), (false, false));
    let details = br#"{"inputs":"x","parameters":{"details":true},"stream":true}"#;
    let plain = inspect_request(
        Api::TgiGenerate {
            stream_endpoint: false,
        },
        details,
    )
    .unwrap();
    assert_eq!(
        (plain.stream, plain.include_usage, plain.max_tokens),
        (false, true, None)
    );
}

#[test]
fn llamacpp_request() {
    let body = br#"{"prompt":"Building a website can be done in 10 simple steps:",
        "n_predict":128,"stream":true,"cache_prompt":true}"#;
    let want = RequestInfo {
        model: None,
        stream: true,
        include_usage: true,
        max_tokens: Some(128),
    };
    assert_eq!(inspect_request(Api::LlamaCppCompletion, body), Some(want));
    let infinite = br#"{"prompt":"x","n_predict":-1,"max_tokens":64}"#;
    let got = inspect_request(Api::LlamaCppCompletion, infinite).unwrap();
    assert_eq!((got.stream, got.max_tokens), (false, Some(64)));
    let unlimited = inspect_request(Api::LlamaCppCompletion, br#"{"n_predict":-1}"#).unwrap();
    assert_eq!(unlimited.max_tokens, None);
}

#[test]
fn ollama_streams_unless_told_not_to() {
    let body = br#"{"model":"llama3.2","messages":[{"role":"user","content":"why?"}],
        "options":{"num_predict":100,"temperature":0}}"#;
    let want = RequestInfo {
        model: Some("llama3.2".to_owned()),
        stream: true,
        include_usage: true,
        max_tokens: Some(100),
    };
    assert_eq!(inspect_request(Api::OllamaChat, body), Some(want));
    let off =
        br#"{"model":"llama3.2","prompt":"why?","stream":false,"options":{"num_predict":-1}}"#;
    let got = inspect_request(Api::OllamaGenerate, off).unwrap();
    assert_eq!((got.stream, got.max_tokens), (false, None));
    let odd = br#"{"model":"m","prompt":"x","stream":null,"options":"fast"}"#;
    let got = inspect_request(Api::OllamaGenerate, odd).unwrap();
    assert_eq!((got.stream, got.max_tokens), (true, None));
}

#[test]
fn every_api_rejects_a_non_object() {
    for api in [
        Api::ChatCompletions,
        Api::Responses,
        Api::Messages,
        Api::TgiGenerate {
            stream_endpoint: true,
        },
        Api::LlamaCppCompletion,
        Api::OllamaChat,
        Api::Unknown,
    ] {
        assert_eq!(inspect_request(api, b"[]"), None, "{api:?}");
    }
}
