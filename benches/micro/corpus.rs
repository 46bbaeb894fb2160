//! The bytes the benchmarks feed: an OpenAI chat stream shaped like vLLM's (and the
//! simulator's) chunks, and the dialect fixtures of `src/decode/fixtures/` cut into events.

use bytes::Bytes;

/// Content events in the synthetic OpenAI stream: a 100-token reply, one token per event.
pub const OPENAI_TOKENS: usize = 100;

const WORDS: &[&str] = &[
    "the ", "model ", "is ", "a ", "token ", "stream ", "of ", "words ", "and ", "it ", "keeps ",
    "going ", "until ", "done ",
];

fn chunk(tail: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-3f9c2a7e41b84d0c9a5e\",\"object\":\"chat.completion.chunk\",\
         \"created\":1735689600,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",{tail}}}\n\n"
    )
}

/// One OpenAI chat stream as the upstream writes it, one event per element: the role chunk,
/// `OPENAI_TOKENS` content chunks, the usage chunk (`include_usage`) and `[DONE]`.
pub fn openai_events() -> Vec<Bytes> {
    let mut events = Vec::with_capacity(OPENAI_TOKENS + 3);
    events.push(chunk(
        r#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
    ));
    for i in 0..OPENAI_TOKENS {
        let word = WORDS.get(i % WORDS.len()).copied().unwrap_or("x ");
        let finish = if i + 1 == OPENAI_TOKENS {
            r#""length""#
        } else {
            "null"
        };
        events.push(chunk(&format!(
            r#""choices":[{{"index":0,"delta":{{"content":"{word}"}},"logprobs":null,"finish_reason":{finish}}}]"#
        )));
    }
    events.push(chunk(
        r#""choices":[],"usage":{"prompt_tokens":27,"completion_tokens":100,"total_tokens":127}"#,
    ));
    events.push("data: [DONE]\n\n".to_owned());
    events.into_iter().map(Bytes::from).collect()
}

/// The concatenation of `events`, cut into reads of `read` bytes (events split anywhere).
pub fn reads(events: &[Bytes], read: usize) -> Vec<Bytes> {
    let all: Vec<u8> = events.iter().flat_map(|e| e.iter().copied()).collect();
    all.chunks(read.max(1))
        .map(Bytes::copy_from_slice)
        .collect()
}

pub fn total_bytes(chunks: &[Bytes]) -> u64 {
    chunks.iter().map(|c| c.len() as u64).sum()
}

/// A fixture stream cut after every record terminator (`\n\n` for SSE, `\n` for NDJSON),
/// i.e. one event per read, as an upstream that flushes every event is read.
pub fn split_events(stream: &[u8], terminator: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + terminator.len() <= stream.len() {
        if stream.get(i..i + terminator.len()) == Some(terminator) {
            let end = i + terminator.len();
            if let Some(event) = stream.get(start..end) {
                out.push(Bytes::copy_from_slice(event));
            }
            start = end;
            i = end;
        } else {
            i += 1;
        }
    }
    if let Some(rest) = stream.get(start..).filter(|r| !r.is_empty()) {
        out.push(Bytes::copy_from_slice(rest));
    }
    out
}

/// The fixtures each streaming dialect decoder is benchmarked on.
pub struct Fixture {
    pub name: &'static str,
    pub path: &'static str,
    pub ndjson: bool,
    pub bytes: &'static [u8],
}

pub const FIXTURES: &[Fixture] = &[
    Fixture {
        name: "openai_chat",
        path: "/v1/chat/completions",
        ndjson: false,
        bytes: include_bytes!("../../src/decode/fixtures/openai_chat_stream.sse"),
    },
    Fixture {
        name: "openai_responses",
        path: "/v1/responses",
        ndjson: false,
        bytes: include_bytes!("../../src/decode/fixtures/openai_responses_stream.sse"),
    },
    Fixture {
        name: "anthropic_messages",
        path: "/v1/messages",
        ndjson: false,
        bytes: include_bytes!("../../src/decode/fixtures/anthropic_messages_stream.sse"),
    },
    Fixture {
        name: "tgi_generate_stream",
        path: "/generate_stream",
        ndjson: false,
        bytes: include_bytes!("../../src/decode/fixtures/tgi_generate_stream.sse"),
    },
    Fixture {
        name: "llamacpp_completion",
        path: "/completion",
        ndjson: false,
        bytes: include_bytes!("../../src/decode/fixtures/llamacpp_completion_stream.sse"),
    },
    Fixture {
        name: "ollama_chat",
        path: "/api/chat",
        ndjson: true,
        bytes: include_bytes!("../../src/decode/fixtures/ollama_chat_stream.ndjson"),
    },
    Fixture {
        name: "ollama_generate",
        path: "/api/generate",
        ndjson: true,
        bytes: include_bytes!("../../src/decode/fixtures/ollama_generate_stream.ndjson"),
    },
];
