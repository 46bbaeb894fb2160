//! Token counting when the upstream reports no usage, through the real proxy: a small BPE
//! `tokenizer.json` built by the test with the `tokenizers` API (no downloads) and
//! configured for a model glob; the embedded o200k_base estimate when none is configured;
//! and the fallback when the worker pool is saturated.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::fake::{FakeUpstream, Script, WritePlan};
use crate::common::harness::*;
use crate::common::temp::TempDir;
use goodput::config::{Config, tokenizer::ModelTokenizer};
use goodput::run::Running;
use serde_json::{Value, json};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::whitespace::Whitespace;

const T: Duration = Duration::from_secs(10);
const PROMPT: &str = "SECRET-PROMPT-TEXT say hello";

/// Merges of the test BPE: common English pieces, so a word's count depends on whether
/// it is seen whole (a delta boundary inside a word must not change the count).
const MERGES: [(&str, &str); 12] = [
    ("t", "h"),
    ("th", "e"),
    ("i", "n"),
    ("in", "g"),
    ("e", "r"),
    ("a", "n"),
    ("an", "d"),
    ("o", "n"),
    ("r", "e"),
    ("e", "s"),
    ("o", "u"),
    ("th", "ing"),
];

const WORDS: [&str; 16] = [
    "the", "thing", "and", "reason", "in", "her", "tone", "answers", "ongoing", "rest", "sound",
    "there", "is", "a", "model", "string",
];

/// Builds the test BPE (letters, the merges above, `[UNK]` for anything else, whitespace
/// pre-tokenizer) and saves it as `tokenizer.json` in a directory of its own, returned with
/// the file's path: the directory goes when the test drops it.
fn write_tokenizer() -> (TempDir, PathBuf) {
    let mut vocab: Vec<String> = vec!["[UNK]".into()];
    vocab.extend(('a'..='z').map(String::from));
    vocab.extend(MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    const N: usize = 1 + 26 + MERGES.len();
    let pairs: [(String, u32); N] = std::array::from_fn(|i| (vocab[i].clone(), i as u32));
    let merges = MERGES
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(pairs, merges)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    let dir = TempDir::new("tokenizer");
    let path = dir.path().join("tokenizer.json");
    tokenizer.save(&path, false).unwrap();
    (dir, path)
}

/// The truth: the saved tokenizer's count, loaded back as any user of the file would.
fn truth(path: &Path, text: &str) -> u64 {
    let t = tokenizers::Tokenizer::from_file(path).unwrap();
    t.encode(text, false).unwrap().len() as u64
}

fn o200k(text: &str) -> u64 {
    tiktoken_rs::o200k_base()
        .unwrap()
        .encode_ordinary(text)
        .len() as u64
}

/// Deterministic English-like text of `n` words.
fn text(n: usize, seed: u64) -> String {
    let mut x = seed | 1;
    let mut out = String::new();
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if i > 0 {
            out.push(if x.is_multiple_of(11) { '\n' } else { ' ' });
        }
        out.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    out
}

/// OpenAI chat chunks carrying `text` cut into deltas of `step` bytes (cutting through
/// words), without usage, then `[DONE]`.
fn chat_events(text: &str, step: usize) -> Vec<Vec<u8>> {
    let event = |v: Value| format!("data: {v}\n\n").into_bytes();
    let mut events = vec![event(json!({
        "id": "c", "object": "chat.completion.chunk", "model": "test-model",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]
    }))];
    let bytes = text.as_bytes();
    for piece in bytes.chunks(step) {
        events.push(event(json!({
            "id": "c", "object": "chat.completion.chunk", "model": "test-model",
            "choices": [{"index": 0, "delta": {"content": std::str::from_utf8(piece).unwrap()}}]
        })));
    }
    events.push(event(json!({
        "id": "c", "object": "chat.completion.chunk", "model": "test-model",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    })));
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

fn with_tokenizer(upstream: &str, path: &Path) -> Config {
    let mut cfg = test_config(upstream);
    let file = format!(
        "[upstream]\nurl = \"{upstream}\"\n[tokenizer]\nmodels = [{{ model = \"test-*\", path = \"{}\" }}]\n",
        path.display()
    );
    let parsed = goodput::config::load_str(&file, "test", &Default::default()).unwrap();
    cfg.tokenizer = parsed.tokenizer;
    cfg
}

async fn one_stream(proxy: &Running, id: &str) -> Value {
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let (status, _) = post_collect_id(&url, id, chat_body(true, 100, false)).await;
    assert_eq!(status, 200);
    record(proxy, id).await
}

async fn post_collect_id(url: &str, id: &str, body: String) -> (u16, bytes::Bytes) {
    use http_body_util::{BodyExt, Full};
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

async fn record(proxy: &Running, id: &str) -> Value {
    record_of(proxy.admin_addr, id, T).await
}

#[tokio::test]
async fn configured_tokenizer_counts_output_and_prompt_exactly() {
    let (_dir, path) = write_tokenizer();
    let generated = text(60, 7);
    let events = chat_events(&generated, 5);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy_with(with_tokenizer(&fake.url(), &path)).await;

    let r = one_stream(&proxy, "tok").await;
    assert_eq!(r["output_tokens_source"], "tokenizer", "{r}");
    assert_eq!(
        r["output_tokens"].as_u64(),
        Some(truth(&path, &generated)),
        "{r}"
    );
    assert_eq!(r["input_tokens_source"], "tokenizer", "{r}");
    assert_eq!(
        r["input_tokens"].as_u64(),
        Some(truth(&path, PROMPT)),
        "{r}"
    );
    // The deltas cut through words: counting each on its own would say more.
    let per_delta: u64 = generated
        .as_bytes()
        .chunks(5)
        .map(|c| truth(&path, std::str::from_utf8(c).unwrap()))
        .sum();
    assert!(
        per_delta > r["output_tokens"].as_u64().unwrap(),
        "{per_delta} {r}"
    );
    // TPOT is over the counted tokens, not the events.
    assert_ne!(r["events"], r["output_tokens"], "{r}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_model_no_glob_matches_gets_the_estimate() {
    let (_dir, path) = write_tokenizer();
    let generated = text(40, 3);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &chat_events(&generated, 9),
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let mut cfg = with_tokenizer(&fake.url(), &path);
    cfg.tokenizer
        .models
        .iter_mut()
        .for_each(|m: &mut ModelTokenizer| m.pattern = "llama-*".into());
    let proxy = start_proxy_with(cfg).await;
    let r = one_stream(&proxy, "other-model").await;
    assert_eq!(r["output_tokens_source"], "estimate", "{r}");
    assert_eq!(r["output_tokens"].as_u64(), Some(o200k(&generated)), "{r}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_a_configured_tokenizer_the_estimate_is_o200k() {
    let generated = text(200, 11);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &chat_events(&generated, 7),
        WritePlan::Bytes1,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let r = one_stream(&proxy, "est").await;
    assert_eq!(r["output_tokens_source"], "estimate", "{r}");
    let n = r["output_tokens"].as_u64().unwrap();
    assert_eq!(n, o200k(&generated), "{r}");
    // And a sane one: about a token per word of this text.
    assert!((150..=400).contains(&n), "{n}");
    assert_eq!(r["input_tokens_source"], "estimate", "{r}");
    assert_eq!(r["input_tokens"].as_u64(), Some(o200k(PROMPT)), "{r}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn one_token_per_event_without_a_tokenizer_counts_the_events() {
    // As vLLM and llama.cpp stream: one word-sized token per event. The estimate is near
    // the event count, which is exact here.
    let generated = text(60, 5);
    let words: Vec<String> = generated
        .split_inclusive([' ', '\n'])
        .map(str::to_owned)
        .collect();
    // The role chunk, a chunk per word, then the finish chunk and [DONE].
    let mut events = chat_events("", 1);
    let done = events.split_off(1);
    for w in &words {
        events.push(
            format!(
                "data: {}\n\n",
                json!({"id": "c", "object": "chat.completion.chunk", "model": "test-model",
                       "choices": [{"index": 0, "delta": {"content": w}}]})
            )
            .into_bytes(),
        );
    }
    events.extend(done);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy(&fake.url()).await;
    let r = one_stream(&proxy, "words").await;
    assert_eq!(r["events"].as_u64(), Some(words.len() as u64), "{r}");
    let estimate = o200k(&generated);
    assert!(
        estimate * 4 <= words.len() as u64 * 5,
        "{estimate} for {} words",
        words.len()
    );
    assert_eq!(r["output_tokens_source"], "events", "{r}");
    assert_eq!(r["output_tokens"].as_u64(), Some(words.len() as u64), "{r}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn longer_texts_are_counted_within_one_percent_of_the_truth() {
    let (_dir, path) = write_tokenizer();
    let generated = text(6000, 42);
    // Deltas of 1 to 13 bytes, as engines that stream sub-word pieces send them.
    let mut events = Vec::new();
    let mut at = 0;
    let mut step = 1;
    let bytes = generated.as_bytes();
    let mut deltas = Vec::new();
    while at < bytes.len() {
        let end = (at + step).min(bytes.len());
        deltas.push(std::str::from_utf8(&bytes[at..end]).unwrap().to_owned());
        at = end;
        step = step % 13 + 1;
    }
    events.extend(chat_events("", 1).into_iter().take(1));
    for d in &deltas {
        events.push(
            format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": d}}]})
            )
            .into_bytes(),
        );
    }
    events.push(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
            .to_vec(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Coalesced(37),
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy_with(with_tokenizer(&fake.url(), &path)).await;
    let r = one_stream(&proxy, "long").await;
    let want = truth(&path, &generated) as f64;
    let got = r["output_tokens"].as_f64().unwrap();
    assert!((got - want).abs() <= want * 0.01, "{got} vs {want}: {r}");
    assert_eq!(r["output_tokens_source"], "tokenizer");
    proxy.shutdown().await;
}

#[tokio::test]
async fn non_streaming_bodies_without_usage_are_counted_from_their_text() {
    let (_dir, path) = write_tokenizer();
    let generated = text(30, 5);
    let body = json!({
        "id": "c", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": generated}, "finish_reason": "stop"}]
    })
    .to_string();
    let fake = FakeUpstream::start(Script::response(
        200,
        &[("content-type", "application/json")],
        body.as_bytes(),
    ))
    .await;
    let proxy = start_proxy_with(with_tokenizer(&fake.url(), &path)).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let (status, got) = post_collect_id(&url, "json", chat_body(false, 100, false)).await;
    assert_eq!((status, got.as_ref()), (200, body.as_bytes()));
    let r = record(&proxy, "json").await;
    assert_eq!(r["output_tokens_source"], "tokenizer", "{r}");
    assert_eq!(
        r["output_tokens"].as_u64(),
        Some(truth(&path, &generated)),
        "{r}"
    );
    assert_eq!(
        r["input_tokens"].as_u64(),
        Some(truth(&path, PROMPT)),
        "{r}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn usage_from_the_upstream_wins_and_nothing_is_counted() {
    let (_dir, path) = write_tokenizer();
    let events = crate::common::fake::openai_chat_events(6, true);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let proxy = start_proxy_with(with_tokenizer(&fake.url(), &path)).await;
    let r = one_stream(&proxy, "usage").await;
    assert_eq!(
        (
            r["output_tokens"].as_u64(),
            r["output_tokens_source"].as_str()
        ),
        (Some(6), Some("usage"))
    );
    assert_eq!(
        (
            r["input_tokens"].as_u64(),
            r["input_tokens_source"].as_str()
        ),
        (Some(7), Some("usage"))
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_pool_falls_back_and_says_so() {
    let (_dir, path) = write_tokenizer();
    // Long texts keep the single worker busy while the other requests finish.
    let generated = text(150_000, 9);
    let events = chat_events(&generated, 4096);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Coalesced(64),
        Duration::ZERO,
    ))
    .await;
    let mut cfg = with_tokenizer(&fake.url(), &path);
    cfg.tokenizer.workers = 1;
    cfg.tokenizer.queue = 1;
    let proxy = start_proxy_with(cfg).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    const N: usize = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let url = url.clone();
        tasks.spawn(async move {
            post_collect_id(&url, &format!("sat-{i}"), chat_body(true, 100, false))
                .await
                .0
        });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    let recs = wait_records(proxy.admin_addr, N, Duration::from_secs(60)).await;
    assert_eq!(recs.len(), N, "every request is recorded, counted or not");
    let mut by_source: HashMap<String, usize> = HashMap::new();
    for r in &recs {
        *by_source
            .entry(r["output_tokens_source"].as_str().unwrap().to_owned())
            .or_default() += 1;
        if r["output_tokens_source"] == "events" {
            assert!(
                r["input_tokens"].is_null(),
                "input stays absent on fallback: {r}"
            );
        }
    }
    let fell_back = by_source.get("events").copied().unwrap_or(0);
    assert!(fell_back >= 1, "{by_source:?}");
    assert!(
        by_source.get("tokenizer").copied().unwrap_or(0) >= 1,
        "{by_source:?}"
    );
    let text = metrics(proxy.admin_addr).await;
    let counted = metric_value(
        &text,
        "goodput_tokenizer_fallback_total{reason=\"queue_full\"}",
    );
    assert_eq!(counted, Some(fell_back as f64), "{text}");
    proxy.shutdown().await;
}

#[test]
fn a_bad_tokenizer_file_is_a_config_problem_naming_its_path() {
    let dir = TempDir::new("broken");
    let broken = dir.write("broken.json", "{ not a tokenizer").unwrap();
    let models = format!(
        "[upstream]\nurl = \"http://127.0.0.1:1\"\n[tokenizer]\nmodels = [\n  {{ model = \"a-*\", path = \"{}\" }},\n  {{ model = \"b-*\", path = \"/nonexistent/tokenizer.json\" }},\n]\n",
        broken.display()
    );
    // The section itself is valid; its files are loaded as the server starts, by
    // `check-config` and on a reload, each problem under its key.
    let cfg = goodput::config::load_str(&models, "test", &Default::default()).unwrap();
    let err = goodput::run::Resources::load(&cfg).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.models[0].path") && err.contains(&broken.display().to_string()),
        "{err}"
    );
    assert!(
        err.contains("tokenizer.models[1].path") && err.contains("/nonexistent/tokenizer.json"),
        "{err}"
    );
    let file = dir.write("goodput.toml", &models).unwrap();
    let checked = goodput::run::check(&file).unwrap_err().to_string();
    assert!(checked.contains("tokenizer.models[1].path"), "{checked}");
    let start = start_error(cfg);
    assert!(start.contains("tokenizer.models[0].path"), "{start}");
    let err = goodput::config::load_str(
        &format!("{models}workers = 0\n"),
        "test",
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("tokenizer.workers"), "{err}");
}

/// `run::start` on a configuration whose files cannot be loaded: the error it gives.
fn start_error(cfg: Config) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        proxy.set_nonblocking(true).unwrap();
        admin.set_nonblocking(true).unwrap();
        let started = goodput::run::start_on(
            cfg,
            tokio::net::TcpListener::from_std(proxy).unwrap(),
            tokio::net::TcpListener::from_std(admin).unwrap(),
        );
        assert!(started.is_err(), "started with an unloadable tokenizer");
        started.err().unwrap().to_string()
    })
}

#[tokio::test]
async fn text_past_the_limit_is_extrapolated_and_said_so() {
    let (_dir, path) = write_tokenizer();
    let generated = text(2000, 13);
    let fake = FakeUpstream::start(Script::sse_chunked(
        &chat_events(&generated, 11),
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let mut cfg = with_tokenizer(&fake.url(), &path);
    cfg.tokenizer.text_limit = 2000;
    let proxy = start_proxy_with(cfg).await;
    let r = one_stream(&proxy, "cut").await;
    assert_eq!(r["output_tokens_source"], "estimate", "{r}");
    let want = truth(&path, &generated) as f64;
    let got = r["output_tokens"].as_f64().unwrap();
    assert!((got - want).abs() <= want * 0.1, "{got} vs {want}");
    let text = metrics(proxy.admin_addr).await;
    let n = metric_value(
        &text,
        "goodput_tokenizer_fallback_total{reason=\"text_limit\"}",
    );
    assert_eq!(n, Some(1.0), "{text}");
    proxy.shutdown().await;
}
