//! One mirrored exchange, on a task of its own: the copy is filtered by model and class,
//! its model rewritten if asked, sent with the shadow's own client, and the answer read
//! to its end through the same decoders as the primary's ([`Tap`]) within
//! `shadow.timeout`. The answer's bytes are dropped as they are read.

use std::{sync::Arc, time::Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, header::CONTENT_LENGTH, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::{Active, DropReason, Inner};
use crate::{
    config::slo::{MatchInput, Targets, glob},
    decode::{Api, inspect_request},
    measure::{Delivered, Ending, HeadInfo, Outcome, ProxyFailure, RequestCapture, Tap},
};

pub(super) type Client =
    hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What a copy needs from the primary request.
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

/// Runs one copy to its end; the permit is its place in `max_in_flight`.
pub(super) async fn run(
    shadow: Arc<Inner>,
    active: Arc<Active>,
    permit: OwnedSemaphorePermit,
    job: Job,
) {
    let _permit = permit;
    let body = joined(&job.body);
    let model = inspect_request(job.api, &body).and_then(|r| r.model);
    if !selected(&shadow, &active, &job, model.as_deref()) {
        return;
    }
    let sent_body = match &active.cfg.model {
        Some(name) => rewrite_model(&body, name).unwrap_or_else(|| body.clone()),
        None => body.clone(),
    };
    let Some(request) = request(&active, &job, sent_body) else {
        shadow.metrics.dropped(DropReason::Unreachable);
        return;
    };
    let mut stop = shadow.stop.subscribe();
    let recorder = match shadow.recorder.load_full() {
        Some(r) if !*stop.borrow() => (*r).clone(),
        _ => {
            shadow.metrics.dropped(DropReason::Shutdown);
            return;
        }
    };
    let config = shadow.config.load();
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
        format!("{}:shadow", job.pair_id),
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
    tap.user_clock();
    tap.shadow_of(job.pair_id);
    if config.tokenizer.enabled() {
        tap.count_text(config.tokenizer.text_limit);
    }
    drop(config);
    let ended = {
        let exchange =
            tokio::time::timeout_at(deadline, exchange(&active.client, request, &mut tap));
        tokio::select! {
            ended = exchange => Some(ended),
            _ = stop.wait_for(|s| *s) => None,
        }
    };
    match ended {
        Some(Ok(Ok(ending))) => tap.finish(Instant::now(), ending),
        Some(Ok(Err(Unsent))) => {
            tap.discard();
            shadow.metrics.dropped(DropReason::Unreachable);
        }
        Some(Err(_elapsed)) => {
            if !tap.has_head() {
                tap.on_head(504, None, Some(ProxyFailure(Outcome::Timeout)));
            }
            tap.finish(Instant::now(), Ending::IdleTimeout);
            shadow.metrics.dropped(DropReason::Timeout);
        }
        None => {
            tap.discard();
            shadow.metrics.dropped(DropReason::Shutdown);
        }
    }
}

/// The candidate could not be sent the request (nothing was answered).
struct Unsent;

/// Sends the copy and reads the answer to its end, measuring every frame.
async fn exchange(
    client: &Client,
    request: Request<Full<Bytes>>,
    tap: &mut Tap,
) -> Result<Ending, Unsent> {
    let response = client.request(request).await.map_err(|_| Unsent)?;
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    tap.on_head(response.status().as_u16(), content_type, None);
    let mut body = response.into_body();
    let mut bytes = 0u64;
    let ending = loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    bytes += data.len() as u64;
                    tap.on_data(Instant::now(), data);
                }
            }
            Some(Err(_)) => break Ending::UpstreamFailed,
            None => break Ending::Complete,
        }
    };
    // Nobody receives the answer: all that was read counts as delivered.
    tap.delivered(Delivered {
        bytes,
        events: tap.events(),
        terminal: tap.terminal_seen(),
    });
    Ok(ending)
}

/// `shadow.models` and `shadow.classes`, as the primary's request is matched.
fn selected(shadow: &Inner, active: &Active, job: &Job, model: Option<&str>) -> bool {
    let cfg = &active.cfg;
    if !cfg.models.is_empty() && !model.is_some_and(|m| cfg.models.iter().any(|g| glob(g, m))) {
        return false;
    }
    if cfg.classes.is_empty() {
        return true;
    }
    let config = shadow.config.load();
    let class = config.slo.class_for(&MatchInput {
        model,
        api: Some(job.api),
        tenant: job.tenant,
        input_tokens: None,
    });
    class.is_some_and(|c| cfg.classes.iter().any(|g| glob(g, &c.name)))
}

/// The copy as the candidate receives it: its URL, the filtered headers, its credential.
fn request(active: &Active, job: &Job, body: Bytes) -> Option<Request<Full<Bytes>>> {
    let target = &active.cfg.target;
    let uri = format!(
        "{}://{}{}{}",
        target.scheme, target.authority, target.base_path, job.path
    );
    let mut request = Request::post(uri).body(Full::new(body.clone())).ok()?;
    *request.headers_mut() = job.headers.clone();
    let headers = request.headers_mut();
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Some((name, value)) = &active.cfg.auth_header {
        headers.insert(name.clone(), value.clone());
    }
    Some(request)
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
    fn chunks_join_without_a_copy_when_there_is_one() {
        let one = Bytes::from_static(b"abc");
        assert_eq!(joined(std::slice::from_ref(&one)).as_ptr(), one.as_ptr());
        assert_eq!(joined(&[one.clone(), Bytes::from_static(b"de")]), "abcde");
        assert!(joined(&[]).is_empty());
    }
}
