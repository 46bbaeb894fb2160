//! A stream that delivered its terminal event is complete: clients stop reading at
//! `[DONE]`, `message_stop`, `response.completed`, Ollama's `"done": true`, TGI's final
//! event or llama.cpp's `"stop": true`, and may close before the upstream ends its body.
//! For every dialect, over real loopback sockets: a client that closes right after the
//! terminal event (the upstream pausing before it ends the body) is `ok` with
//! `terminal_event: true`; one that closes before it is `client_abort`. Either way the
//! upstream connection is closed at once, not returned to the pool.

use std::time::Duration;

use crate::common::{fake::*, harness::*};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// How long the fake upstream waits before the rest of its body: far longer than any test
/// waits for a record, so a record that arrives proves the proxy did not wait for it.
const PAUSE: Duration = Duration::from_secs(30);

/// A dialect's stream as a fixture of the decoders, with the path and content type it is
/// served under.
struct Dialect {
    path: &'static str,
    content_type: &'static str,
    stream: &'static [u8],
}

const DIALECTS: [Dialect; 7] = [
    Dialect {
        path: "/v1/chat/completions",
        content_type: "text/event-stream",
        stream: include_bytes!("../../src/decode/fixtures/openai_chat_stream.sse"),
    },
    Dialect {
        path: "/v1/responses",
        content_type: "text/event-stream",
        stream: include_bytes!("../../src/decode/fixtures/openai_responses_stream.sse"),
    },
    Dialect {
        path: "/v1/messages",
        content_type: "text/event-stream",
        stream: include_bytes!("../../src/decode/fixtures/anthropic_messages_stream.sse"),
    },
    Dialect {
        path: "/generate_stream",
        content_type: "text/event-stream",
        stream: include_bytes!("../../src/decode/fixtures/tgi_generate_stream.sse"),
    },
    Dialect {
        path: "/completion",
        content_type: "text/event-stream",
        stream: include_bytes!("../../src/decode/fixtures/llamacpp_completion_stream.sse"),
    },
    Dialect {
        path: "/api/chat",
        content_type: "application/x-ndjson",
        stream: include_bytes!("../../src/decode/fixtures/ollama_chat_stream.ndjson"),
    },
    Dialect {
        path: "/api/generate",
        content_type: "application/x-ndjson",
        stream: include_bytes!("../../src/decode/fixtures/ollama_generate_stream.ndjson"),
    },
];

impl Dialect {
    /// The stream up to its terminal event, and the terminal event (its last event).
    fn split(&self) -> (&'static [u8], &'static [u8]) {
        let sep: &[u8] = if self.content_type.contains("ndjson") {
            b"\n"
        } else {
            b"\n\n"
        };
        let body = self.stream;
        let trimmed = body.len() - trailing(body, b'\n');
        let last = body[..trimmed]
            .windows(sep.len())
            .rposition(|w| w == sep)
            .map_or(0, |i| i + sep.len());
        body.split_at(last)
    }

    fn head(&self) -> Bytes {
        Bytes::from(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n",
            self.content_type
        ))
    }

    /// The upstream: the events before the terminal one, then (`terminal_first`) the
    /// terminal event and a pause before the body ends, or the pause first.
    fn script(&self, terminal_first: bool) -> Script {
        let (before, terminal) = self.split();
        let mut steps = vec![Step::Write(self.head()), Step::Write(http_chunk(before))];
        let rest = [
            Step::Write(http_chunk(terminal)),
            Step::Write(Bytes::from_static(LAST_CHUNK)),
        ];
        if terminal_first {
            steps.push(rest[0].clone());
            steps.push(Step::Pause(PAUSE));
            steps.push(rest[1].clone());
        } else {
            steps.push(Step::Pause(PAUSE));
            steps.extend(rest);
        }
        Script::new(steps)
    }

    fn request(&self) -> Vec<u8> {
        let body = r#"{"model":"m","stream":true,"prompt":"hi","messages":[{"role":"user","content":"hi"}]}"#;
        raw_post(self.path, body)
    }
}

fn trailing(bytes: &[u8], b: u8) -> usize {
    bytes.iter().rev().take_while(|&&x| x == b).count()
}

/// Decoded data of a (possibly cut) chunked body.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        body = &body[eol + 2..];
        if size == 0 || body.len() < size {
            data.extend_from_slice(&body[..size.min(body.len())]);
            break;
        }
        data.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or_default();
    }
    data
}

/// Sends the dialect's request over a raw HTTP/1.1 connection, reads until the body holds
/// `expected`, then closes the connection.
#[expect(clippy::unwrap_used, reason = "test helper")]
async fn read_then_close(proxy: std::net::SocketAddr, dialect: &Dialect, expected: &[u8]) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(&dialect.request()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n")
            && dechunk(&raw[end + 4..]).ends_with(expected)
        {
            break;
        }
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "{}: closed early", dialect.path);
        raw.extend_from_slice(&buf[..n]);
    }
    drop(s);
}

/// Runs `rounds` exchanges of `dialect` whose client closes after `terminal_first`'s
/// bytes; returns the records, and checks that the upstream saw each connection closed.
#[expect(clippy::unwrap_used, reason = "test helper")]
async fn exchanges(dialect: &Dialect, terminal_first: bool, rounds: usize) -> Vec<Value> {
    let up = FakeUpstream::start(dialect.script(terminal_first)).await;
    let proxy = start_proxy(&up.url()).await;
    let (before, terminal) = dialect.split();
    let expected = if terminal_first {
        [before, terminal].concat()
    } else {
        before.to_vec()
    };
    for round in 0..rounds {
        read_then_close(proxy.proxy_addr, dialect, &expected).await;
        assert!(
            up.wait_client_close(Duration::from_secs(5)).await.is_some(),
            "{}: round {round}: the upstream connection must be closed when the client leaves",
            dialect.path
        );
    }
    let recs = wait_records(proxy.admin_addr, rounds, Duration::from_secs(5)).await;
    assert_eq!(
        up.connections(),
        rounds,
        "{}: no connection reused",
        dialect.path
    );
    proxy.shutdown().await;
    assert_eq!(recs.len(), rounds, "{}", dialect.path);
    for r in &recs {
        assert_eq!(r["bytes_out"], expected.len(), "{}: {r}", dialect.path);
        assert!(
            r["e2e_ms"].as_f64().unwrap() < PAUSE.as_secs_f64() * 1000.0,
            "{}: {r}",
            dialect.path
        );
    }
    recs
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_leaving_right_after_the_terminal_event_is_ok_in_every_dialect() {
    for dialect in &DIALECTS {
        for r in exchanges(dialect, true, 3).await {
            assert_eq!(r["outcome"], "ok", "{}: {r}", dialect.path);
            assert_eq!(r["terminal_event"], true, "{}: {r}", dialect.path);
            assert_eq!(r["slo_met"], true, "{}: {r}", dialect.path);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_leaving_before_the_terminal_event_is_an_abort_in_every_dialect() {
    for dialect in &DIALECTS {
        for r in exchanges(dialect, false, 3).await {
            assert_eq!(r["outcome"], "client_abort", "{}: {r}", dialect.path);
            assert_eq!(r["terminal_event"], false, "{}: {r}", dialect.path);
            assert_eq!(r["slo_met"], Value::Null, "{}: {r}", dialect.path);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_client_dropping_the_stream_after_done_is_ok() {
    let dialect = &DIALECTS[0];
    let up = FakeUpstream::start(dialect.script(true)).await;
    let proxy = start_proxy(&up.url()).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let rounds = 3;
    for _ in 0..rounds {
        let resp = post(
            &client,
            &format!("http://{}{}", proxy.proxy_addr, dialect.path),
            chat_body(true, 8, false),
        )
        .await;
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let mut body = resp.into_body();
        let mut data = Vec::new();
        while !data.ends_with(b"data: [DONE]\n\n") {
            let frame = body.frame().await.expect("a frame").expect("no error");
            if let Some(d) = frame.data_ref() {
                data.extend_from_slice(d);
            }
        }
        assert_eq!(data, dialect.stream);
        // Dropping the body resets the stream (RST_STREAM CANCEL).
        drop(body);
        assert!(up.wait_client_close(Duration::from_secs(5)).await.is_some());
    }
    let recs = wait_records(proxy.admin_addr, rounds, Duration::from_secs(5)).await;
    assert_eq!(recs.len(), rounds);
    for r in &recs {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["terminal_event"], true, "{r}");
        assert_eq!(r["bytes_out"], dialect.stream.len(), "{r}");
    }
    proxy.shutdown().await;
}
