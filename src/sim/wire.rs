//! The OpenAI wire format the simulator speaks: SSE chunks of `chat.completion.chunk` and
//! `text_completion`, the non-streaming bodies, and error bodies.
//!
//! Streamed events are built by hand from a per-stream prefix rather than through
//! `serde_json`: an event is then one allocation (its `Bytes`) and a few `memcpy`s, which
//! is what lets a 2-core machine drive thousands of streams. Everything interpolated into
//! those events is either JSON-escaped once per request (the model name) or known to be
//! plain ASCII (ids, numbers, the word list).

use bytes::{BufMut, Bytes, BytesMut};
use rand::Rng;
use serde_json::json;

/// Which OpenAI API a request used; decides object names and where the text goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions` (legacy text completions)
    Completions,
}

/// Token counts as reported in `usage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// One "token" each: short English words so a dashboard or a client shows readable text,
/// all ASCII without JSON escapes so they can be copied into events verbatim.
const WORDS: &[&str] = &[
    "the ", "model ", "is ", "a ", "token ", "stream ", "of ", "words ", "and ", "it ", "keeps ",
    "going ", "until ", "done ", "with ", "latency ", "in ", "every ", "step ", "so ", "we ",
    "can ", "measure ", "time ", "to ", "first ", "output ", "per ", "request ", "at ", "scale ",
    "now ",
];

/// The terminating event of an OpenAI stream.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

/// Appends `tokens` words to `buf`.
pub(crate) fn push_words<R: Rng + ?Sized>(buf: &mut impl BufMut, rng: &mut R, tokens: u32) {
    for _ in 0..tokens {
        buf.put_slice(WORDS[rng.random_range(0..WORDS.len())].as_bytes());
    }
}

/// Builds the SSE events of one stream.
#[derive(Debug)]
pub(crate) struct Encoder {
    api: Api,
    /// `data: {"id":…,"object":…,"created":…,"model":…` — shared by every event.
    head: Box<[u8]>,
}

impl Encoder {
    pub(crate) fn new(api: Api, id: &str, created: u64, model: &str) -> Self {
        let object = match api {
            Api::Chat => "chat.completion.chunk",
            Api::Completions => "text_completion",
        };
        let head = format!(
            r#"data: {{"id":"{id}","object":"{object}","created":{created},"model":{}"#,
            json_string(model)
        );
        Encoder {
            api,
            head: head.into_bytes().into_boxed_slice(),
        }
    }

    /// The chat role chunk that precedes the content; it carries no token.
    pub(crate) fn role(&self) -> Bytes {
        const TAIL: &[u8] = br#","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
        self.event(TAIL.len(), |b| b.put_slice(TAIL))
    }

    /// A content event of `tokens` words; `finish` is set on the last one. With `top`
    /// (a chat request that asked for `logprobs`), each word comes with its
    /// log-probability and the `top` likeliest words at its place: itself first, then
    /// the words after it in the list.
    pub(crate) fn content<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        tokens: u32,
        finish: Option<&str>,
        top: Option<u32>,
    ) -> Bytes {
        let (open, close): (&[u8], &[u8]) = match self.api {
            Api::Chat => (br#","choices":[{"index":0,"delta":{"content":""#, br#""},"#),
            Api::Completions => (br#","choices":[{"index":0,"text":""#, br#"","#),
        };
        let top = top.filter(|_| self.api == Api::Chat);
        // Words are at most 8 bytes; reserving for that avoids a regrow.
        let estimate = open.len() + close.len() + 8 * tokens as usize + 48;
        self.event(estimate, |b| {
            b.put_slice(open);
            match top {
                None => {
                    push_words(b, rng, tokens);
                    b.put_slice(close);
                    b.put_slice(br#""logprobs":null,"finish_reason":"#);
                }
                Some(k) => {
                    let drawn: Vec<usize> = (0..tokens)
                        .map(|_| rng.random_range(0..WORDS.len()))
                        .collect();
                    for i in &drawn {
                        b.put_slice(WORDS[*i].as_bytes());
                    }
                    b.put_slice(close);
                    b.put_slice(br#""logprobs":{"content":["#);
                    for (n, i) in drawn.iter().enumerate() {
                        if n > 0 {
                            b.put_u8(b',');
                        }
                        let alternatives: Vec<String> = (0..k as usize)
                            .map(|j| {
                                format!(
                                    r#"{{"token":"{}","logprob":{}}}"#,
                                    WORDS[(i + j) % WORDS.len()],
                                    -0.1 - j as f64
                                )
                            })
                            .collect();
                        b.put_slice(
                            format!(
                                r#"{{"token":"{}","logprob":-0.1,"top_logprobs":[{}]}}"#,
                                WORDS[*i],
                                alternatives.join(",")
                            )
                            .as_bytes(),
                        );
                    }
                    b.put_slice(br#"]},"finish_reason":"#);
                }
            }
            match finish {
                Some(reason) => {
                    b.put_u8(b'"');
                    b.put_slice(reason.as_bytes());
                    b.put_u8(b'"');
                }
                None => b.put_slice(b"null"),
            }
            b.put_slice(b"}]}");
        })
    }

    /// The usage-only chunk sent when the request asked for `include_usage`.
    pub(crate) fn usage(&self, u: Usage) -> Bytes {
        let tail = format!(
            r#","choices":[],"usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}}}"#,
            u.prompt_tokens,
            u.completion_tokens,
            u.prompt_tokens + u.completion_tokens
        );
        self.event(tail.len(), |b| b.put_slice(tail.as_bytes()))
    }

    fn event(&self, body_len: usize, fill: impl FnOnce(&mut BytesMut)) -> Bytes {
        let mut b = BytesMut::with_capacity(self.head.len() + body_len + 2);
        b.put_slice(&self.head);
        fill(&mut b);
        b.put_slice(b"\n\n");
        b.freeze()
    }
}

/// The non-streaming response body (`chat.completion` or `text_completion`), which always
/// carries `usage`, as OpenAI's does.
pub(crate) fn completion_body(
    api: Api,
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish: &str,
    u: Usage,
) -> Bytes {
    let usage = json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    });
    let v = match api {
        Api::Chat => json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }],
            "usage": usage,
        }),
        Api::Completions => json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}],
            "usage": usage,
        }),
    };
    Bytes::from(v.to_string())
}

/// An OpenAI-style error body.
pub(crate) fn error_body(message: &str, kind: &str, code: u16) -> Bytes {
    Bytes::from(json!({"error": {"message": message, "type": kind, "code": code}}).to_string())
}

/// The `GET /v1/models` body.
pub(crate) fn models_body(model: &str, created: u64) -> Bytes {
    let v = json!({
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "goodput-sim"}],
    });
    Bytes::from(v.to_string())
}

fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use serde_json::Value;

    use super::*;

    fn parse(event: &Bytes) -> Value {
        let s = std::str::from_utf8(event).unwrap();
        let json = s
            .strip_prefix("data: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn chat_events_are_valid_json() {
        let enc = Encoder::new(Api::Chat, "chatcmpl-1", 7, "m\"odel");
        let mut rng = SmallRng::seed_from_u64(1);
        let role = parse(&enc.role());
        assert_eq!(role["model"], "m\"odel");
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(role["choices"][0]["delta"]["content"], "");

        let c = parse(&enc.content(&mut rng, 3, None, None));
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            4
        );
        assert!(c["choices"][0]["finish_reason"].is_null());
        let last = parse(&enc.content(&mut rng, 1, Some("length"), None));
        assert_eq!(last["choices"][0]["finish_reason"], "length");

        let u = parse(&enc.usage(Usage {
            prompt_tokens: 2,
            completion_tokens: 4,
        }));
        assert_eq!(u["choices"].as_array().unwrap().len(), 0);
        assert_eq!(u["usage"]["total_tokens"], 6);
    }

    #[test]
    fn completion_events_carry_text() {
        let enc = Encoder::new(Api::Completions, "cmpl-1", 7, "m");
        let mut rng = SmallRng::seed_from_u64(1);
        let c = parse(&enc.content(&mut rng, 2, Some("stop"), None));
        assert_eq!(c["object"], "text_completion");
        assert!(!c["choices"][0]["text"].as_str().unwrap().is_empty());
        assert_eq!(c["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn chat_events_carry_the_top_alternatives_when_asked() {
        let enc = Encoder::new(Api::Chat, "c", 7, "m");
        let (mut a, mut b) = (SmallRng::seed_from_u64(3), SmallRng::seed_from_u64(3));
        let plain = parse(&enc.content(&mut a, 2, None, None));
        let with = parse(&enc.content(&mut b, 2, None, Some(5)));
        // The same words either way; each with itself first among 5 alternatives.
        assert_eq!(
            plain["choices"][0]["delta"]["content"],
            with["choices"][0]["delta"]["content"]
        );
        let tokens = with["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap();
        assert_eq!(tokens.len(), 2);
        let words: String = tokens
            .iter()
            .map(|t| t["token"].as_str().unwrap())
            .collect();
        assert_eq!(with["choices"][0]["delta"]["content"], words.as_str());
        assert_eq!(tokens[0]["top_logprobs"].as_array().unwrap().len(), 5);
        assert_eq!(tokens[0]["top_logprobs"][0]["token"], tokens[0]["token"]);
        assert!(plain["choices"][0]["logprobs"].is_null());
    }
}
