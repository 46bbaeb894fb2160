//! One mirrored exchange, on a task of its own on the shadow's thread: the copy is
//! filtered by model and class, its model rewritten if asked, sent with the shadow's own
//! client, and the answer read to its end through the same decoders as the primary's
//! ([`Tap`]) within `shadow.timeout` and up to `shadow.max_answer_bytes` (past them the
//! answer is cut and its record says so). The answer's bytes are dropped as they are read.

use std::{sync::Arc, time::Instant};

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, header::CONTENT_LENGTH, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use tokio::sync::{OwnedSemaphorePermit, oneshot, watch};

use super::{Active, DropReason, ShadowMetrics};
use crate::{
    config::Config,
    decode::{Api, inspect_request},
    measure::{
        Delivered, Ending, HeadInfo, Held, Outcome, ProxyFailure, Recorder, RequestCapture,
        ShadowCut, Tap, Target,
    },
    slo::{MatchInput, Targets, glob},
};

pub(super) type Client =
    hyper_util::client::legacy::Client<crate::proxy::PooledConnector, Full<Bytes>>;

/// Which system a copy goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Copy {
    /// `shadow.url`: asked for `shadow.model`, with `shadow.auth_header`.
    Candidate,
    /// `shadow.secondary_url`: a replica of the primary, sent the client's body as it is.
    Secondary,
}

impl Copy {
    fn target(self) -> Target {
        match self {
            Copy::Candidate => Target::Shadow,
            Copy::Secondary => Target::Secondary,
        }
    }
}

/// What a copy needs from the primary request.
#[derive(Clone)]
pub(super) struct Job {
    /// Path and query as the client sent them.
    pub path: String,
    /// The client's headers minus hop-by-hop ones, `Host` and `shadow.drop_headers`.
    pub headers: HeaderMap,
    pub pair_id: String,
    pub api: Api,
    pub tenant: Option<u64>,
    pub slo_overrides: Targets,
    /// The complete body, as handles to the primary's captured chunks.
    pub body: Vec<Bytes>,
}

/// What a copy's task needs from the shadow, without a hold on the shadow itself.
pub(super) struct Context {
    pub config: Arc<ArcSwap<Config>>,
    pub metrics: ShadowMetrics,
    /// The shadow's recorder; `None` once the shadow stopped.
    pub recorder: Option<Arc<Recorder>>,
    /// Turns true when the shadow stops (or is gone).
    pub stop: watch::Receiver<bool>,
}

/// Runs one copy to its end; the permit is its place in `max_in_flight`, `held` its place
/// in flight, given up when its record is written or it is counted as dropped.
pub(super) async fn run(
    cx: Context,
    active: Arc<Active>,
    copy: Copy,
    permit: OwnedSemaphorePermit,
    held: Held,
    job: Job,
) {
    let _permit = permit;
    let Context {
        config: live,
        metrics,
        recorder,
        mut stop,
    } = cx;
    let body = joined(&job.body);
    let model = inspect_request(job.api, &body).and_then(|r| r.model);
    if !selected(&live.load(), &active, &job, model.as_deref()) {
        // Not a copy after all: neither written nor dropped.
        held.settle();
        return;
    }
    let sent_body = match (&active.cfg.model, copy) {
        (Some(name), Copy::Candidate) => rewrite_model(&body, name).unwrap_or_else(|| body.clone()),
        _ => body.clone(),
    };
    // The copies (never the client's request) ask for each token's top alternatives.
    let sent_body = if active.cfg.logprobs {
        super::logprobs::ask(job.api, &sent_body).unwrap_or(sent_body)
    } else {
        sent_body
    };
    let deterministic = is_deterministic(&body);
    let Some(request) = request(&active, copy, &job, sent_body) else {
        metrics.give_up(held, DropReason::Unreachable);
        return;
    };
    let recorder = match recorder {
        Some(r) if !*stop.borrow() => (*r).clone(),
        _ => {
            metrics.give_up(held, DropReason::Shutdown);
            return;
        }
    };
    let config = live.load();
    let t_sent = Instant::now();
    let deadline = tokio::time::Instant::now() + active.cfg.timeout;
    // The record is built from the client's body, so it names the client's model and is
    // held to the primary's class even when the candidate is asked for another name.
    let (capture_tx, capture_rx) = oneshot::channel();
    let _ = capture_tx.send(RequestCapture {
        bytes: body.len() as u64,
        chunks: vec![body],
        complete: true,
        ..RequestCapture::default()
    });
    let mut tap = Tap::new(
        recorder,
        format!("{}:{}", job.pair_id, copy.target().as_str()),
        t_sent,
        job.api,
        capture_rx,
        config.measure.response_inspect_limit,
        HeadInfo {
            long_input: false,
            tenant: job.tenant,
            slo_overrides: job.slo_overrides,
            slo_header_invalid: 0,
            traced: false,
            trace_parent: None,
        },
    );
    // From here the place travels with the measurement, to the aggregator or to a drop.
    tap.hold(held);
    tap.user_clock();
    tap.copy_of(copy.target(), job.pair_id);
    if deterministic {
        tap.deterministic();
    }
    // The answer's bytes (already bounded by `max_answer_bytes` below), for
    // its comparison with the primary's at record time.
    tap.keep_answer(active.cfg.max_answer_bytes);
    if config.tokenizer.enabled() {
        tap.count_text(config.tokenizer.text_limit);
    }
    drop(config);
    let limit = active.cfg.max_answer_bytes;
    let client = match (copy, &active.secondary) {
        (Copy::Secondary, Some(leg)) => &leg.client,
        _ => &active.client,
    };
    let ended = {
        let exchange =
            tokio::time::timeout_at(deadline, exchange(client, request, &mut tap, limit));
        tokio::select! {
            ended = exchange => Some(ended),
            _ = stop.wait_for(|s| *s) => None,
        }
    };
    match ended {
        Some(Ok(Ok(Read::Ended(ending)))) => tap.finish(Instant::now(), ending),
        Some(Ok(Ok(Read::TooLarge))) => {
            // The shadow, as the client, stopped reading: not judged, and no fault of the
            // candidate's; the record says why it is short.
            tap.shadow_cut(ShadowCut::TooLarge);
            tap.finish(Instant::now(), Ending::ClientGone);
            metrics.dropped(DropReason::TooLarge);
        }
        Some(Ok(Err(Unsent))) => {
            if let Some(held) = tap.discard() {
                metrics.give_up(held, DropReason::Unreachable);
            }
        }
        Some(Err(_elapsed)) => {
            if !tap.has_head() {
                tap.on_head(504, None, Some(ProxyFailure(Outcome::Timeout)));
            }
            tap.finish(Instant::now(), Ending::IdleTimeout);
            metrics.dropped(DropReason::Timeout);
        }
        None => {
            if let Some(held) = tap.discard() {
                metrics.give_up(held, DropReason::Shutdown);
            }
        }
    }
}

/// The candidate could not be sent the request (nothing was answered).
struct Unsent;

/// How reading the answer ended.
enum Read {
    /// The body ended (or failed) by itself.
    Ended(Ending),
    /// The body outgrew `shadow.max_answer_bytes`: reading stopped there.
    TooLarge,
}

/// Sends the copy and reads the answer to its end, or to `limit` body bytes, measuring
/// every frame (only the part within the limit).
async fn exchange(
    client: &Client,
    request: Request<Full<Bytes>>,
    tap: &mut Tap,
    limit: u64,
) -> Result<Read, Unsent> {
    let response = client.request(request).await.map_err(|_| Unsent)?;
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    tap.on_head(response.status().as_u16(), content_type, None);
    let mut body = response.into_body();
    let mut bytes = 0u64;
    let read = loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let room = limit - bytes;
                if data.len() as u64 > room {
                    // The rest is not read: dropping the body closes the connection
                    // rather than draining it for reuse.
                    let kept = data.slice(..usize::try_from(room).unwrap_or(data.len()));
                    if !kept.is_empty() {
                        bytes += kept.len() as u64;
                        tap.on_data(Instant::now(), &kept);
                    }
                    break Read::TooLarge;
                }
                bytes += data.len() as u64;
                tap.on_data(Instant::now(), data);
            }
            Some(Err(_)) => break Read::Ended(Ending::UpstreamFailed),
            None => break Read::Ended(Ending::Complete),
        }
    };
    drop(body);
    // Nobody receives the answer: all that was read counts as delivered. A cut answer's
    // terminal event, if one came before the cut, does not make it complete.
    tap.delivered(Delivered {
        bytes,
        events: tap.events(),
        terminal: tap.terminal_seen() && !matches!(read, Read::TooLarge),
    });
    Ok(read)
}

/// `shadow.models` and `shadow.classes`, as the primary's request is matched.
fn selected(config: &Config, active: &Active, job: &Job, model: Option<&str>) -> bool {
    let cfg = &active.cfg;
    if !cfg.models.is_empty() && !model.is_some_and(|m| cfg.models.iter().any(|g| glob(g, m))) {
        return false;
    }
    if cfg.classes.is_empty() {
        return true;
    }
    let class = config.slo.class_for(&MatchInput {
        model,
        api: Some(job.api),
        tenant: job.tenant,
        input_tokens: None,
    });
    class.is_some_and(|c| cfg.classes.iter().any(|g| glob(g, &c.name)))
}

/// The copy as the candidate (or the secondary) receives it: its URL, the filtered
/// headers, the candidate's credential.
fn request(active: &Active, copy: Copy, job: &Job, body: Bytes) -> Option<Request<Full<Bytes>>> {
    let target = match copy {
        Copy::Candidate => &active.cfg.target,
        Copy::Secondary => active.cfg.secondary.as_ref()?,
    };
    let uri = format!(
        "{}://{}{}{}",
        target.scheme, target.authority, target.base_path, job.path
    );
    let mut request = Request::post(uri).body(Full::new(body.clone())).ok()?;
    *request.headers_mut() = job.headers.clone();
    let headers = request.headers_mut();
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if copy == Copy::Candidate
        && let Some((name, value)) = &active.cfg.auth_header
    {
        headers.insert(name.clone(), value.clone());
    }
    Some(request)
}

/// Whether the request asks for a reproducible answer: `temperature` 0 or a `seed`, at
/// the top level (OpenAI, Anthropic, llama.cpp), in `options` (Ollama) or `parameters`
/// (TGI).
fn is_deterministic(body: &[u8]) -> bool {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice(body) else {
        return false;
    };
    let says = |o: &serde_json::Map<String, serde_json::Value>| {
        o.get("temperature").and_then(serde_json::Value::as_f64) == Some(0.0)
            || o.get("seed").is_some_and(|s| !s.is_null())
    };
    says(&top)
        || ["options", "parameters"]
            .iter()
            .any(|k| top.get(*k).and_then(|v| v.as_object()).is_some_and(says))
}

fn joined(chunks: &[Bytes]) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        many => {
            let mut all = BytesMut::with_capacity(many.iter().map(Bytes::len).sum());
            for c in many {
                all.extend_from_slice(c);
            }
            all.freeze()
        }
    }
}

/// The body with its top-level `model` replaced; `None` when it has none (left as it is).
fn rewrite_model(body: &[u8], model: &str) -> Option<Bytes> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let slot = value.as_object_mut()?.get_mut("model")?;
    *slot = serde_json::Value::String(model.to_owned());
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_present_model_is_rewritten() {
        let out = rewrite_model(br#"{"model":"a","stream":true}"#, "b");
        let v: serde_json::Value =
            serde_json::from_slice(&out.unwrap_or_default()).unwrap_or_default();
        assert_eq!(v["model"], "b");
        assert_eq!(v["stream"], true);
        assert!(rewrite_model(br#"{"inputs":"x"}"#, "b").is_none());
        assert!(rewrite_model(b"not json", "b").is_none());
    }

    #[test]
    fn deterministic_requests_are_recognised() {
        assert!(is_deterministic(br#"{"temperature":0}"#));
        assert!(is_deterministic(br#"{"temperature":0.7,"seed":3}"#));
        assert!(is_deterministic(br#"{"options":{"temperature":0.0}}"#));
        assert!(is_deterministic(br#"{"parameters":{"seed":1}}"#));
        assert!(!is_deterministic(br#"{"temperature":0.7,"seed":null}"#));
        assert!(!is_deterministic(br#"{}"#));
        assert!(!is_deterministic(b"not json"));
    }

    #[test]
    fn chunks_join_without_a_copy_when_there_is_one() {
        let one = Bytes::from_static(b"abc");
        assert_eq!(joined(std::slice::from_ref(&one)).as_ptr(), one.as_ptr());
        assert_eq!(joined(&[one.clone(), Bytes::from_static(b"de")]), "abcde");
        assert!(joined(&[]).is_empty());
    }
}
