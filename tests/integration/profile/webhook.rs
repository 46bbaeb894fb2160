//! The drift webhook against a local HTTP server that fails first: the notification is
//! retried with backoff and arrives once, as JSON; notifying never blocks.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use goodput::profile::drift::{DriftStatus, Transition, TransitionKind, Webhook};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;

/// Serves on 127.0.0.1:0: answers 503 to the first `failures` requests, then 204; keeps
/// every body received.
async fn server(failures: usize) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook/SECRET-PATH", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let n = {
                            let mut b = seen.lock().unwrap();
                            b.push(String::from_utf8_lossy(&body).into_owned());
                            b.len()
                        };
                        let status = if n <= failures { 503 } else { 204 };
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (url, bodies)
}

fn status() -> DriftStatus {
    DriftStatus {
        baseline: "base.jsonl".into(),
        drifted: true,
        active: vec!["output_length"],
        transitions: vec![Transition {
            dimension: "output_length",
            reason: "traffic",
            kind: TransitionKind::Fired,
            explanation: "output length P50 180 → 410 tokens (PSI 0.630 > 0.200)".into(),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn notifications_are_retried_until_delivered() {
    let (url, bodies) = server(2).await;
    let hook = Webhook::start_with(url.parse().unwrap(), Duration::from_millis(20));
    assert!(hook.notify(&status()));
    poll_until!("three deliveries", Duration::from_secs(2), {
        (bodies.lock().unwrap().len() >= 3).then_some(())
    });
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3, "two failures, then delivered once");
    let v: serde_json::Value = serde_json::from_str(&bodies[2]).unwrap();
    assert_eq!(v["event"], "goodput.drift");
    assert_eq!(v["drifted"], true);
    assert_eq!(v["transitions"][0]["dimension"], "output_length");
    assert_eq!(v["transitions"][0]["kind"], "fired");
    assert_eq!(v["status"]["active"][0], "output_length");
}

#[tokio::test]
async fn a_hanging_endpoint_never_blocks_the_caller() {
    // The endpoint takes the connection (the listen backlog) and never answers: a notify
    // that waited for it would never return. The queue bounds what waits.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let hook = Webhook::start_with(url.parse().unwrap(), Duration::from_secs(30));
    let notifying = tokio::task::spawn_blocking(move || {
        let queued = (0..100).filter(|_| hook.notify(&status())).count();
        (queued, hook)
    });
    let (queued, _hook) = tokio::time::timeout(Duration::from_secs(20), notifying)
        .await
        .expect("notify waited for the endpoint")
        .unwrap();
    assert!((16..100).contains(&queued), "{queued}");
    drop(listener);
}
