//! End-to-end tests of the simulator over real loopback sockets with a real hyper client.
//! Distributions are fixed and small so the suite is fast and its timings assertable.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::*;

struct Running {
    sim: Sim,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let res = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        res.expect("serve returns after shutdown").unwrap().unwrap();
    }
}

fn fast() -> SimConfig {
    SimConfig {
        ttft: Dist::Fixed(5.0),
        itl: Dist::Fixed(1.0),
        ..SimConfig::default()
    }
}

async fn start(cfg: SimConfig) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sim = Sim::new(cfg);
    let (tx, rx) = oneshot::channel::<()>();
    let handle = sim.clone();
    let task = tokio::spawn(async move {
        handle
            .serve(listener, async {
                let _ = rx.await;
            })
            .await
    });
    Running {
        sim,
        addr,
        stop: Some(tx),
        task,
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> Response<Incoming> {
    let req = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("x-request-id", "req-1")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    client().request(req).await.unwrap()
}

async fn get(addr: SocketAddr, path: &str) -> (StatusCode, Value) {
    let req = Request::get(format!("http://{addr}{path}"))
        .body(Full::default())
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn json_body(resp: Response<Incoming>) -> Value {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Splits an SSE body into its `data:` payloads (the simulator writes one line each).
fn sse_data(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(text.ends_with("\n\n"), "events end with a blank line");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data line").to_owned())
        .collect()
}

async fn stream_events(resp: Response<Incoming>) -> Vec<String> {
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    sse_data(&resp.into_body().collect().await.unwrap().to_bytes())
}

fn content_of(api: &str, event: &Value) -> String {
    let c = &event["choices"][0];
    let v = if api == "chat" {
        &c["delta"]["content"]
    } else {
        &c["text"]
    };
    v.as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn streams_chat_with_usage() {
    let srv = start(SimConfig {
        tokens_per_event: 2,
        ..fast()
    })
    .await;
    let resp = post(
        srv.addr,
        "/v1/chat/completions",
        json!({"model": "my-model", "messages": [{"role": "user", "content": "hello world!"}],
               "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-request-id"], "req-1");
    let events = stream_events(resp).await;
    assert_eq!(events.len(), 1 + 4 + 1 + 1, "{events:#?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let parsed: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();

    let role = &parsed[0];
    assert_eq!(
        role["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    for e in &parsed {
        assert_eq!(e["id"], role["id"]);
        assert_eq!(e["created"], role["created"]);
        assert_eq!(e["model"], "my-model");
        assert_eq!(e["object"], "chat.completion.chunk");
    }
    for (i, e) in parsed[1..5].iter().enumerate() {
        assert_eq!(e["choices"][0]["index"], 0);
        assert_eq!(content_of("chat", e).split_whitespace().count(), 2);
        let want = if i == 3 { json!("length") } else { Value::Null };
        assert_eq!(e["choices"][0]["finish_reason"], want);
    }
    let usage = &parsed[5];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11})
    );

    let truth = srv.sim.truth();
    let t = &truth[0];
    assert_eq!(truth.len(), 1);
    assert_eq!(
        (t.request_id.as_deref(), t.path.as_str()),
        (Some("req-1"), "/v1/chat/completions")
    );
    assert!(t.stream && t.completed && !t.client_gone);
    assert_eq!(
        (t.status, t.prompt_tokens, t.completion_tokens, t.events),
        (200, 3, 8, 4)
    );
    assert_eq!(t.finish_reason, Some("length"));
    assert!(t.first_token_at.unwrap() <= t.last_token_at.unwrap());
    assert_eq!(srv.sim.in_flight(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn streams_completions_without_usage() {
    let cfg = SimConfig {
        output_tokens: Some(Dist::Fixed(5.0)),
        tokens_per_event: 2,
        ..fast()
    };
    let srv = start(cfg).await;
    let resp = post(
        srv.addr,
        "/v1/completions",
        json!({"prompt": "abc", "stream": true}),
    )
    .await;
    let events = stream_events(resp).await;
    // 5 tokens at 2 per event: 2 + 2 + 1, no role chunk, no usage chunk.
    assert_eq!(events.len(), 4);
    assert_eq!(events[3], "[DONE]");
    let parsed: Vec<Value> = events[..3]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let words: Vec<usize> = parsed
        .iter()
        .map(|e| content_of("cmpl", e).split_whitespace().count())
        .collect();
    assert_eq!(words, [2, 2, 1]);
    assert_eq!(parsed[0]["object"], "text_completion");
    assert_eq!(parsed[0]["model"], "sim-model");
    assert!(parsed[0]["choices"][0]["finish_reason"].is_null());
    assert_eq!(parsed[2]["choices"][0]["finish_reason"], "stop");
    assert!(parsed.iter().all(|e| e.get("usage").is_none()));
    srv.stop().await;
}

#[tokio::test]
async fn answers_without_streaming() {
    let srv = start(fast()).await;
    let chat = json_body(
        post(
            srv.addr,
            "/v1/chat/completions",
            json!({"messages": [{"content": "12345678"}], "max_tokens": 6}),
        )
        .await,
    )
    .await;
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    let text = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.split_whitespace().count(), 6);
    assert_eq!(chat["choices"][0]["finish_reason"], "length");
    assert_eq!(
        chat["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8})
    );

    let cmpl = json_body(post(srv.addr, "/v1/completions", json!({"prompt": "hi"})).await).await;
    assert_eq!(cmpl["object"], "text_completion");
    assert_eq!(
        cmpl["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        128
    );
    assert_eq!(cmpl["choices"][0]["finish_reason"], "stop");
    assert_eq!(cmpl["usage"]["completion_tokens"], 128);

    let truth = srv.sim.truth();
    assert_eq!(truth.len(), 2);
    assert!(
        truth
            .iter()
            .all(|t| !t.stream && t.completed && t.first_token_at.is_none())
    );
    assert_eq!(truth[1].completion_tokens, 128);
    srv.stop().await;
}

#[tokio::test]
async fn serves_models_health_and_404() {
    let srv = start(SimConfig {
        model: "m1".into(),
        ..fast()
    })
    .await;
    let (status, models) = get(srv.addr, "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m1");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(get(srv.addr, "/health").await.0, StatusCode::OK);
    let (status, err) = get(srv.addr, "/v2/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(err["error"]["code"], 404);
    let bad = post(
        srv.addr,
        "/v1/chat/completions",
        json!({"prompt": "no messages"}),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let statuses: Vec<u16> = srv.sim.truth().iter().map(|t| t.status).collect();
    assert_eq!(statuses, [200, 404, 400], "health is not recorded");
    srv.stop().await;
}

#[tokio::test]
async fn rejects_oversized_bodies() {
    let srv = start(fast()).await;
    let big = "x".repeat(handler::MAX_BODY_BYTES + 1);
    let resp = post(srv.addr, "/v1/completions", json!({ "prompt": big })).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    srv.stop().await;
}

#[tokio::test]
async fn error_rate_one_fails_every_request() {
    let srv = start(SimConfig {
        error_rate: 1.0,
        ..fast()
    })
    .await;
    let body = json!({"messages": [{"content": "x"}], "stream": true});
    let resp = post(srv.addr, "/v1/chat/completions", body).await;
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(
        json_body(resp).await,
        json!({"error": {"message": "simulated failure", "type": "server_error", "code": 500}})
    );
    let t = &srv.sim.truth()[0];
    assert_eq!((t.status, t.events, t.completed), (500, 0, true));
    srv.stop().await;
}

#[tokio::test]
async fn reset_rate_one_cuts_every_stream() {
    let srv = start(SimConfig {
        reset_rate: 1.0,
        ..fast()
    })
    .await;
    for _ in 0..3 {
        let body = json!({"messages": [{"content": "x"}], "stream": true, "max_tokens": 20});
        let resp = post(srv.addr, "/v1/chat/completions", body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        let err = loop {
            match body.frame().await {
                Some(Ok(f)) => seen.extend_from_slice(f.data_ref().unwrap()),
                Some(Err(e)) => break e,
                None => panic!("stream ended cleanly: {}", String::from_utf8_lossy(&seen)),
            }
        };
        assert!(!String::from_utf8_lossy(&seen).contains("[DONE]"), "{err}");
    }
    let truth = srv.sim.truth();
    assert_eq!(truth.len(), 3);
    for t in &truth {
        assert!(!t.completed && !t.client_gone, "{t:?}");
        assert!((1..=20).contains(&t.events), "{t:?}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn truth_times_the_first_token() {
    let srv = start(SimConfig {
        ttft: Dist::Fixed(40.0),
        itl: Dist::Fixed(3.0),
        ..fast()
    })
    .await;
    let sent = Instant::now();
    let body = json!({"messages": [{"content": "x"}], "stream": true, "max_tokens": 5});
    let events = stream_events(post(srv.addr, "/v1/chat/completions", body).await).await;
    assert_eq!(events.len(), 1 + 5 + 1);
    let t = &srv.sim.truth()[0];
    let (first, last) = (t.first_token_at.unwrap(), t.last_token_at.unwrap());
    let ttft = first - t.received_at;
    assert!(t.received_at >= sent);
    assert!(
        ttft >= Duration::from_millis(40) && ttft < Duration::from_millis(70),
        "{ttft:?}"
    );
    // Four gaps of 3 ms on an absolute timetable counted from the first token's deadline
    // (a late first token shortens the decode rather than shifting every later one).
    let end = last - t.received_at;
    assert!(
        end >= Duration::from_millis(52) && end < Duration::from_millis(90),
        "{end:?}"
    );
    srv.stop().await;
}

#[tokio::test]
async fn dropped_client_is_recorded_as_gone() {
    let srv = start(SimConfig {
        ttft: Dist::Fixed(1.0),
        itl: Dist::Fixed(5.0),
        ..fast()
    })
    .await;
    let body = json!({"messages": [{"content": "x"}], "stream": true, "max_tokens": 2000});
    let resp = post(srv.addr, "/v1/chat/completions", body).await;
    let mut body = resp.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(srv.sim.in_flight(), 1);
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(5);
    let t = loop {
        if let Some(t) = srv.sim.truth().pop() {
            break t;
        }
        assert!(Instant::now() < deadline, "the stream was never dropped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(t.client_gone && !t.completed, "{t:?}");
    assert!(t.events >= 2 && t.events < 2000, "{t:?}");
    assert_eq!(srv.sim.in_flight(), 0);
    srv.stop().await;
}

async fn run_sequence(seed: u64) -> Vec<(u64, String)> {
    let cfg = SimConfig {
        seed,
        output_tokens: Some(Dist::LogNormal {
            median: 12.0,
            sigma: 0.8,
        }),
        ttft: Dist::Normal { mean: 2.0, sd: 1.0 },
        itl: Dist::Normal { mean: 0.5, sd: 0.2 },
        ..fast()
    };
    let srv = start(cfg).await;
    let mut out = Vec::new();
    for i in 0..6 {
        let stream = i % 2 == 0;
        let body = json!({"messages": [{"content": "x"}], "stream": stream, "max_tokens": 64});
        let resp = post(srv.addr, "/v1/chat/completions", body).await;
        let text = if stream {
            let events = stream_events(resp).await;
            let parsed = events
                .iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok());
            parsed.map(|e| content_of("chat", &e)).collect()
        } else {
            let v = json_body(resp).await;
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        out.push((srv.sim.truth()[i].completion_tokens, text));
    }
    srv.stop().await;
    out
}

#[tokio::test]
async fn a_seed_fixes_the_run() {
    let a = run_sequence(42).await;
    assert_eq!(a, run_sequence(42).await);
    assert_ne!(a, run_sequence(43).await);
    let lengths: Vec<u64> = a.iter().map(|(n, _)| *n).collect();
    assert!(
        lengths.windows(2).any(|w| w[0] != w[1]),
        "lengths vary: {lengths:?}"
    );
}

#[tokio::test]
async fn latency_grows_past_the_knee() {
    let cfg = SimConfig {
        ttft: Dist::Fixed(20.0),
        concurrency_knee: Some(0),
        slowdown_per_request: 1.0,
        ..fast()
    };
    let srv = start(cfg).await;
    let body = json!({"messages": [{"content": "x"}], "stream": true, "max_tokens": 1});
    stream_events(post(srv.addr, "/v1/chat/completions", body).await).await;
    let t = &srv.sim.truth()[0];
    // One request in flight, knee 0: factor 2.
    let ttft = t.first_token_at.unwrap() - t.received_at;
    assert!(ttft >= Duration::from_millis(40), "{ttft:?}");
    srv.stop().await;
}

#[tokio::test]
async fn speaks_h2c_with_prior_knowledge() {
    let srv = start(fast()).await;
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let body = json!({"messages": [{"content": "x"}], "stream": true, "max_tokens": 3});
    let req = Request::post(format!("http://{}/v1/chat/completions", srv.addr))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let events = stream_events(resp).await;
    assert_eq!(events.len(), 1 + 3 + 1);
    srv.stop().await;
}

#[tokio::test]
async fn shutdown_lets_open_streams_finish() {
    let srv = start(SimConfig {
        itl: Dist::Fixed(5.0),
        ..fast()
    })
    .await;
    let body = json!({"messages": [{"content": "x"}], "stream": true, "max_tokens": 20});
    let resp = post(srv.addr, "/v1/chat/completions", body).await;
    let Running {
        sim,
        addr,
        mut stop,
        task,
    } = srv;
    stop.take().unwrap().send(()).unwrap();
    let events = stream_events(resp).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(sim.truth()[0].completed);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn prompts_past_the_context_limit_get_400() {
    let srv = start(SimConfig {
        max_input_tokens: Some(100),
        ..fast()
    })
    .await;
    // 400 bytes ≈ 100 tokens: accepted; 404 bytes ≈ 101: refused.
    for (bytes, status) in [(400, StatusCode::OK), (404, StatusCode::BAD_REQUEST)] {
        let resp = post(
            srv.addr,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a".repeat(bytes)}], "max_tokens": 2}),
        )
        .await;
        assert_eq!(resp.status(), status, "{bytes} bytes");
        let body = json_body(resp).await;
        if status == StatusCode::BAD_REQUEST {
            let msg = body["error"]["message"].as_str().unwrap();
            assert!(
                msg.starts_with("This model's maximum context length is 100 tokens"),
                "{msg}"
            );
            assert_eq!(body["error"]["type"], "invalid_request_error");
        }
    }
    let truth = srv.sim.truth();
    assert_eq!(
        truth.iter().map(|t| t.status).collect::<Vec<_>>(),
        [200, 400]
    );
    srv.stop().await;
}
