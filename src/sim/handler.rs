//! Routing, request parsing and response building.
//!
//! Everything random about a request is decided here, up front, from one generator seeded
//! by the simulator's seed and the request's sequence number: whether it fails, whether and
//! where its stream is cut, how long it is and when its first token is due. The draws
//! happen in a fixed order whatever the configuration, so turning on `error_rate` does not
//! change the lengths of the requests that still succeed. Streaming responses return their
//! headers at once and leave the timing to [`SimBody`]; non-streaming ones wait out the
//! whole generation here and then send one JSON body, as a real server does.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use super::Shared;
use super::stream::{SimBody, StreamPlan};
use super::truth::{InFlight, Truth};
use super::wire::{self, Api, Encoder, Usage};

/// Largest request body accepted; larger ones get 413, as from a real gateway.
pub(crate) const MAX_BODY_BYTES: usize = 16 << 20;

/// Output length when neither the config nor the request gives one.
const DEFAULT_MAX_TOKENS: u32 = 128;

/// Spreads consecutive request numbers over the seed space (the 64-bit golden ratio, as
/// in splitmix64) so neighbouring requests get unrelated generators.
const SEED_SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

const X_REQUEST_ID: &str = "x-request-id";

pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<SimBody>, Infallible> {
    let api = match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => {
            // Untracked: probes would otherwise crowd real requests out of the truth ring.
            return Ok(respond(
                StatusCode::OK,
                "text/plain",
                Bytes::from_static(b"ok\n"),
                None,
            ));
        }
        (&Method::GET, "/metrics") => {
            // Untracked, like `/health`: scrapes are not traffic.
            let running = shared.in_flight.load(Ordering::Relaxed);
            let mut text = shared.metrics.render(running);
            text.push_str(&super::metrics::load_lines(
                running,
                shared.cfg.concurrency_knee,
            ));
            return Ok(respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(text),
                None,
            ));
        }
        (&Method::GET, "/version") if shared.cfg.engine_version.is_some() => {
            // Untracked: what the engine says about itself is not traffic.
            let version = serde_json::json!({ "version": shared.cfg.engine_version });
            return Ok(respond(
                StatusCode::OK,
                "application/json",
                Bytes::from(version.to_string()),
                None,
            ));
        }
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/completions") => Api::Completions,
        (&Method::GET, "/v1/models") => {
            let flight = InFlight::start(shared.clone(), truth_for(&req, 200));
            let body = wire::models_body(&shared.cfg.model, unix_now());
            return Ok(respond(
                StatusCode::OK,
                "application/json",
                body,
                Some(flight),
            ));
        }
        _ => {
            let flight = InFlight::start(shared, truth_for(&req, 404));
            return Ok(error(
                StatusCode::NOT_FOUND,
                "no such route",
                "invalid_request_error",
                flight,
            ));
        }
    };
    Ok(generate(shared, api, req).await)
}

async fn generate(shared: Arc<Shared>, api: Api, req: Request<Incoming>) -> Response<SimBody> {
    // Truth's `received_at` first, the timetable's origin second: a deadline can then
    // never fall before `received_at + ttft`.
    let mut truth = truth_for(&req, 200);
    let start = Instant::now();
    let seq = shared.requests.fetch_add(1, Ordering::Relaxed);
    let request_id = req.headers().get(X_REQUEST_ID).cloned();

    let parsed = match read_body(req).await {
        Ok(bytes) => GenRequest::parse(api, &bytes),
        Err(status) => Err((status, "request body too large or unreadable")),
    };
    let params = match parsed {
        Ok(p) => p,
        Err((status, msg)) => {
            truth.status = status.as_u16();
            let flight = InFlight::start(shared, truth);
            let resp = error(status, msg, "invalid_request_error", flight);
            return with_request_id(resp, request_id);
        }
    };
    if let Some(max) = shared
        .cfg
        .max_input_tokens
        .filter(|m| params.prompt_tokens > *m)
    {
        truth.status = StatusCode::BAD_REQUEST.as_u16();
        let msg = format!(
            "This model's maximum context length is {max} tokens. However, you requested {} tokens in the messages. Please reduce the length of the messages.",
            params.prompt_tokens
        );
        let flight = InFlight::start(shared, truth);
        let resp = error(
            StatusCode::BAD_REQUEST,
            &msg,
            "invalid_request_error",
            flight,
        );
        return with_request_id(resp, request_id);
    }
    truth.stream = params.stream;
    truth.prompt_tokens = params.prompt_tokens;
    // Counted in flight from here, so this request's own TTFT already sees its load.
    let mut flight = InFlight::start(shared.clone(), truth);
    let draw = Draw::new(&shared, draw_key(&shared, seq, &params), params.max_tokens);

    if draw.fail {
        if let Some(t) = flight.truth_mut() {
            t.status = 500;
        }
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        let resp = error(status, "simulated failure", "server_error", flight);
        return with_request_id(resp, request_id);
    }
    if let Some(t) = flight.truth_mut() {
        t.finish_reason = Some(draw.finish);
    }
    let reply = Reply {
        api,
        id: match api {
            Api::Chat => format!("chatcmpl-sim-{seq}"),
            Api::Completions => format!("cmpl-sim-{seq}"),
        },
        created: unix_now(),
        model: params
            .model
            .clone()
            .unwrap_or_else(|| shared.cfg.model.clone()),
    };
    flight.generation(&reply.model);
    let resp = if params.stream {
        stream_response(&shared, start, draw, &params, reply, flight)
    } else {
        full_response(&shared, start, draw, &params, reply, flight).await
    };
    with_request_id(resp, request_id)
}

/// Everything random about one generation, drawn in a fixed order.
struct Draw {
    fail: bool,
    /// Cut the stream after this many content events (streams only).
    reset_after: Option<u32>,
    tokens: u32,
    finish: &'static str,
    /// Already stretched by the current load.
    ttft: Duration,
    /// Continues into the body: ITL samples and the words.
    rng: SmallRng,
}

/// What seeds a request's generator beside the simulator's seed: its sequence number, or
/// for a deterministic request its prompt, so that the same prompt gets the same words
/// (greedy decoding) on every simulator of the same seed, in any order; except for
/// `vary_share` of them, spread evenly over the deterministic requests.
fn draw_key(shared: &Shared, seq: u64, params: &GenRequest) -> u64 {
    let Some(prompt) = params.prompt_key else {
        return seq.wrapping_mul(SEED_SPREAD);
    };
    let share = shared.cfg.vary_share;
    if share <= 0.0 {
        return prompt;
    }
    let n = shared.deterministic.fetch_add(1, Ordering::Relaxed) as f64;
    if ((n + 1.0) * share).floor() > (n * share).floor() {
        prompt ^ (n as u64 + 1).wrapping_mul(SEED_SPREAD)
    } else {
        prompt
    }
}

impl Draw {
    fn new(shared: &Shared, key: u64, max_tokens: Option<u32>) -> Self {
        let cfg = &shared.cfg;
        let mut rng = SmallRng::seed_from_u64(cfg.seed ^ key);
        let fail = rng.random::<f64>() < cfg.error_rate;
        let reset = rng.random::<f64>() < cfg.reset_rate;
        let wanted = match &cfg.output_tokens {
            Some(d) => d.sample_count(&mut rng).max(1),
            None => max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        };
        let tokens = wanted
            .min(max_tokens.unwrap_or(u32::MAX))
            .min(cfg.max_output_tokens)
            .max(1);
        // `length` when a cap cut the generation short or the request's own limit was met,
        // as vLLM reports it.
        let finish = if tokens < wanted || max_tokens == Some(tokens) {
            "length"
        } else {
            "stop"
        };
        let ttft = shared.scale(cfg.ttft.sample_ms(&mut rng));
        let reset_after = rng.random_range(1..=tokens.div_ceil(per_event(shared)));
        Draw {
            fail,
            reset_after: reset.then_some(reset_after),
            tokens,
            finish,
            ttft,
            rng,
        }
    }
}

fn per_event(shared: &Shared) -> u32 {
    shared.cfg.tokens_per_event.max(1)
}

/// The identity every part of one reply repeats.
struct Reply {
    api: Api,
    id: String,
    created: u64,
    model: String,
}

/// Headers now; the body plays the events back on their timetable.
fn stream_response(
    shared: &Shared,
    start: Instant,
    draw: Draw,
    params: &GenRequest,
    reply: Reply,
    flight: InFlight,
) -> Response<SimBody> {
    let plan = StreamPlan {
        enc: Encoder::new(reply.api, &reply.id, reply.created, &reply.model),
        rng: draw.rng,
        role: reply.api == Api::Chat,
        first_at: start + draw.ttft,
        tokens: draw.tokens,
        per_event: per_event(shared),
        finish: draw.finish,
        reset_after: draw.reset_after,
        include_usage: params.include_usage,
        prompt_tokens: params.prompt_tokens,
        top_logprobs: params.top_logprobs,
    };
    let mut resp = Response::new(SimBody::stream(plan, flight));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Waits out the timetable a stream would have had, then answers in one body.
async fn full_response(
    shared: &Shared,
    start: Instant,
    mut draw: Draw,
    params: &GenRequest,
    reply: Reply,
    mut flight: InFlight,
) -> Response<SimBody> {
    let mut total = draw.ttft;
    for _ in 1..draw.tokens.div_ceil(per_event(shared)) {
        total += shared.scale(shared.cfg.itl.sample_ms(&mut draw.rng));
    }
    tokio::time::sleep_until(start + total).await;

    let mut text = Vec::with_capacity(draw.tokens as usize * 8);
    wire::push_words(&mut text, &mut draw.rng, draw.tokens);
    let text = String::from_utf8_lossy(&text);
    let completion_tokens = u64::from(draw.tokens);
    if let Some(t) = flight.truth_mut() {
        t.completion_tokens = completion_tokens;
    }
    let usage = Usage {
        prompt_tokens: params.prompt_tokens,
        completion_tokens,
    };
    let Reply {
        api,
        id,
        created,
        model,
    } = reply;
    let body = wire::completion_body(api, &id, created, &model, &text, draw.finish, usage);
    respond(StatusCode::OK, "application/json", body, Some(flight))
}

/// Reads the whole request body, refusing more than [`MAX_BODY_BYTES`].
async fn read_body(req: Request<Incoming>) -> Result<Bytes, StatusCode> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(StatusCode::PAYLOAD_TOO_LARGE),
        Err(_) => Err(StatusCode::BAD_REQUEST),
    }
}

/// The parts of an OpenAI request body the simulator uses; everything else is ignored.
#[derive(Deserialize)]
struct RawRequest {
    model: Option<String>,
    messages: Option<Vec<RawMessage>>,
    prompt: Option<Value>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<RawStreamOptions>,
    temperature: Option<f64>,
    seed: Option<Value>,
    logprobs: Option<Value>,
    top_logprobs: Option<u32>,
}

#[derive(Deserialize)]
struct RawMessage {
    content: Option<Value>,
}

#[derive(Deserialize)]
struct RawStreamOptions {
    include_usage: Option<bool>,
}

/// A validated generation request.
#[derive(Debug, PartialEq)]
struct GenRequest {
    /// A deterministic request's (`temperature` 0 or a `seed`) key: a hash of its body.
    prompt_key: Option<u64>,
    model: Option<String>,
    max_tokens: Option<u32>,
    stream: bool,
    include_usage: bool,
    prompt_tokens: u64,
    /// Top alternatives per token: a chat request with `logprobs: true`.
    top_logprobs: Option<u32>,
}

impl GenRequest {
    fn parse(api: Api, body: &[u8]) -> Result<Self, (StatusCode, &'static str)> {
        let bad = |msg| (StatusCode::BAD_REQUEST, msg);
        let raw: RawRequest = serde_json::from_slice(body).map_err(|_| bad("invalid JSON body"))?;
        let prompt_bytes = match api {
            Api::Chat => raw
                .messages
                .as_ref()
                .ok_or(bad("'messages' is required"))?
                .iter()
                .map(|m| m.content.as_ref().map_or(0, text_bytes))
                .sum(),
            Api::Completions => raw
                .prompt
                .as_ref()
                .map(prompt_units)
                .ok_or(bad("'prompt' is required"))?,
        };
        // The newer name wins, as in OpenAI's API where `max_tokens` is deprecated for chat.
        let max_tokens = raw.max_completion_tokens.or(raw.max_tokens);
        if max_tokens == Some(0) {
            return Err(bad("'max_tokens' must be at least 1"));
        }
        let deterministic =
            raw.temperature == Some(0.0) || raw.seed.as_ref().is_some_and(|s| !s.is_null());
        let prompt_key = deterministic.then(|| {
            // The prompt and the seed, not the rest of the body (a copy may ask for
            // log-probabilities besides): std's hasher is keyed the same in every process
            // of one build, which is all a test's simulators need.
            let mut h = std::hash::DefaultHasher::new();
            for m in raw.messages.iter().flatten() {
                std::hash::Hash::hash(&m.content.as_ref().map(Value::to_string), &mut h);
            }
            std::hash::Hash::hash(&raw.prompt.as_ref().map(Value::to_string), &mut h);
            std::hash::Hash::hash(&raw.seed.as_ref().map(Value::to_string), &mut h);
            std::hash::Hasher::finish(&h)
        });
        Ok(GenRequest {
            prompt_key,
            model: raw.model.filter(|m| !m.is_empty()),
            max_tokens: max_tokens.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            stream: raw.stream.unwrap_or(false),
            include_usage: raw
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            // A tokenizer-free estimate: about 4 bytes of English per token.
            prompt_tokens: (prompt_bytes / 4).max(1),
            top_logprobs: (raw.logprobs == Some(Value::Bool(true)))
                .then(|| raw.top_logprobs.unwrap_or(0)),
        })
    }
}

/// Bytes of text in a chat message's `content`: a string or an array of parts.
fn text_bytes(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Array(parts) => parts
            .iter()
            .map(|p| {
                p.get("text")
                    .and_then(Value::as_str)
                    .map_or(0, |s| s.len() as u64)
            })
            .sum(),
        _ => 0,
    }
}

/// A completions `prompt` in byte-equivalents: strings count their bytes, token-id arrays
/// count 4 per id so that the `/ 4` estimate gives back the exact token count.
fn prompt_units(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Number(_) => 4,
        Value::Array(items) => items.iter().map(prompt_units).sum(),
        _ => 0,
    }
}

fn truth_for<B>(req: &Request<B>, status: u16) -> Truth {
    Truth {
        request_id: req
            .headers()
            .get(X_REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        path: req.uri().path().to_owned(),
        stream: false,
        status,
        prompt_tokens: 0,
        completion_tokens: 0,
        events: 0,
        received_at: std::time::Instant::now(),
        first_token_at: None,
        last_token_at: None,
        event_times: Vec::new(),
        finish_reason: None,
        completed: false,
        client_gone: false,
    }
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
    flight: Option<InFlight>,
) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::full(body, flight));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// The one place error responses are made.
fn error(status: StatusCode, message: &str, kind: &str, flight: InFlight) -> Response<SimBody> {
    let body = wire::error_body(message, kind, status.as_u16());
    respond(status, "application/json", body, Some(flight))
}

/// Echoes `x-request-id`, as gateways commonly do, so a client can correlate.
fn with_request_id(mut resp: Response<SimBody>, id: Option<HeaderValue>) -> Response<SimBody> {
    if let Some(id) = id {
        resp.headers_mut().insert(X_REQUEST_ID, id);
    }
    resp
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_requests_draw_from_their_prompt_and_vary_by_share() {
        let greedy = |text: &str| {
            let body =
                format!(r#"{{"messages":[{{"role":"user","content":"{text}"}}],"temperature":0}}"#);
            GenRequest::parse(Api::Chat, body.as_bytes()).unwrap()
        };
        use crate::sim::SimConfig;
        let shared = Shared::new(SimConfig::default());
        let (a, b) = (greedy("a"), greedy("b"));
        assert_eq!(draw_key(&shared, 1, &a), draw_key(&shared, 7, &a));
        assert_ne!(draw_key(&shared, 1, &a), draw_key(&shared, 1, &b));
        let sampled = GenRequest::parse(Api::Chat, br#"{"messages":[]}"#).unwrap();
        assert_ne!(
            draw_key(&shared, 1, &sampled),
            draw_key(&shared, 2, &sampled)
        );
        let varying = Shared::new(SimConfig {
            vary_share: 0.3,
            ..SimConfig::default()
        });
        let usual = draw_key(&shared, 0, &a);
        let varied = (0..100)
            .filter(|i| draw_key(&varying, *i, &a) != usual)
            .count();
        assert_eq!(varied, 30);
    }

    #[test]
    fn parses_chat_request() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"},
            {"role":"user","content":[{"type":"text","text":"abcd"}]}],
            "max_tokens":10,"max_completion_tokens":20,"stream":true,
            "stream_options":{"include_usage":true},"temperature":0.5}"#;
        let r = GenRequest::parse(Api::Chat, body).unwrap();
        assert_eq!(
            r,
            GenRequest {
                top_logprobs: None,
                prompt_key: None,
                model: Some("m".into()),
                max_tokens: Some(20),
                stream: true,
                include_usage: true,
                prompt_tokens: 3,
            }
        );
    }

    #[test]
    fn parses_completion_prompts() {
        let r = GenRequest::parse(Api::Completions, br#"{"prompt":[1,2,3,4,5]}"#).unwrap();
        assert_eq!((r.prompt_tokens, r.stream, r.max_tokens), (5, false, None));
        let r = GenRequest::parse(Api::Completions, br#"{"prompt":"","stream":null}"#).unwrap();
        assert_eq!(r.prompt_tokens, 1);
    }

    #[test]
    fn rejects_bad_requests() {
        for (api, body) in [
            (Api::Chat, &b"{not json"[..]),
            (Api::Chat, br#"{"prompt":"x"}"#),
            (Api::Completions, br#"{"messages":[]}"#),
            (Api::Chat, br#"{"messages":[],"max_tokens":0}"#),
            (Api::Chat, br#"{"messages":[],"max_tokens":-1}"#),
        ] {
            let e = GenRequest::parse(api, body).unwrap_err();
            assert_eq!(e.0, StatusCode::BAD_REQUEST);
        }
    }
}
