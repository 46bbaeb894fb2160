//! An HTTP/2 upstream with a low stream limit (SETTINGS_MAX_CONCURRENT_STREAMS 2): goodput
//! opens another connection once one carries `upstream.http2_max_streams_per_connection`
//! streams, so six held streams all get their first event at once; with a single
//! connection allowed, the third waits for a stream and is counted as saturated.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use super::*;
use bytes::Bytes;
use hyper::{body::Frame, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::{
    net::TcpListener,
    sync::{mpsc, watch},
};

const FIRST: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
const REST: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n";

/// The first event at once, the rest once `held` completes.
struct HeldBody {
    first: Option<Bytes>,
    rest: Option<Bytes>,
    held: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl hyper::body::Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if self.rest.is_none() {
            return Poll::Ready(None);
        }
        match self.held.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(self.rest.take().map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// An h2c upstream announcing a limit of two streams per connection: each response sends
/// its head and first event, then holds until `release` turns true. Counts connections.
struct HeldH2 {
    url: String,
    connections: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

#[expect(
    clippy::unwrap_used,
    reason = "test upstream: a failed bind must stop the test"
)]
async fn held_h2() -> HeldH2 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let (release, held) = watch::channel(false);
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let held = held.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_req: Request<Incoming>| {
                    let mut held = held.clone();
                    async move {
                        let body = HeldBody {
                            first: Some(Bytes::from(FIRST)),
                            rest: Some(Bytes::from(REST)),
                            held: Box::pin(async move {
                                let _ = held.wait_for(|r| *r).await;
                            }),
                        };
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(2)
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    HeldH2 {
        url,
        connections,
        release,
    }
}

fn lanes_config(upstream: &str, connections: usize) -> goodput::config::Config {
    let mut cfg = test_config(upstream);
    cfg.upstream.http2 = true;
    cfg.upstream.http2_max_connections = connections;
    cfg.upstream.http2_max_streams_per_connection = 2;
    cfg
}

/// Starts `n` streamed chats; each task reports when its first event arrived, then hands
/// back the whole body.
#[expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helper: a failed request must stop the test"
)]
fn start_streams(
    proxy: &Running,
    n: usize,
) -> (
    mpsc::UnboundedReceiver<usize>,
    Vec<tokio::task::JoinHandle<Bytes>>,
) {
    let (first_tx, first_rx) = mpsc::unbounded_channel();
    let tasks = (0..n)
        .map(|i| {
            let url = url(proxy, "/v1/chat/completions");
            let first_tx = first_tx.clone();
            tokio::spawn(async move {
                let client = client();
                let resp = post(&client, &url, chat_body(true, 2, false)).await;
                let status = resp.status();
                let mut body = resp.into_body();
                if status != 200 {
                    let text = body.collect().await.unwrap().to_bytes();
                    panic!("{status}: {}", String::from_utf8_lossy(&text));
                }
                let mut got = Vec::new();
                let mut told = false;
                while let Some(frame) = body.frame().await {
                    if let Ok(data) = frame.unwrap().into_data() {
                        got.extend_from_slice(&data);
                    }
                    if !told && got.ends_with(b"\n\n") {
                        told = true;
                        first_tx.send(i).unwrap();
                    }
                }
                Bytes::from(got)
            })
        })
        .collect();
    (first_rx, tasks)
}

/// Starts `n` streams one at a time, each once the one before has its first event.
#[expect(
    clippy::unwrap_used,
    reason = "test helper: a stream without its first event must stop the test"
)]
async fn one_by_one(proxy: &Running, n: usize) -> Vec<tokio::task::JoinHandle<Bytes>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (mut first, task) = start_streams(proxy, 1);
        tasks.extend(task);
        tokio::time::timeout(T, first.recv())
            .await
            .unwrap()
            .unwrap();
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_held_streams_over_a_two_stream_upstream_open_three_connections() {
    let up = held_h2().await;
    let proxy = start_proxy_with(lanes_config(&up.url, 16)).await;
    // One at a time, each once the one before has its first event: every stream after
    // the second would have waited for an earlier one to end on a single connection.
    // (Started all at once, hyper's pool may race a second connection for a lane still
    // connecting, or open more streams than the upstream's limit before its SETTINGS.)
    let tasks = one_by_one(&proxy, 6).await;
    assert_eq!(up.connections.load(Ordering::SeqCst), 3);
    up.release.send(true).unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Bytes::from(format!("{FIRST}{REST}")));
    }
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_value(&text, "goodput_upstream_http2_saturated_total"),
        Some(0.0)
    );
    // Each record agrees with what its client received.
    let records = wait_records(proxy.admin_addr, 6, T).await;
    for r in &records {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["bytes_out"], FIRST.len() + REST.len(), "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_connection_allowed_the_third_stream_waits_and_is_counted() {
    let up = held_h2().await;
    let proxy = start_proxy_with(lanes_config(&up.url, 1)).await;
    let mut tasks = one_by_one(&proxy, 2).await;
    // Only now, with the upstream's SETTINGS (its limit of two) known to the connection,
    // the third: sent before them, h2 may open the stream and the upstream refuse it.
    let (mut firsts, third) = start_streams(&proxy, 1);
    tasks.extend(third);
    // The upstream allows no third stream on its one connection: that request waits
    // inside it, and goodput counts it when it sends it.
    poll_until!("a saturated HTTP/2 send counted", T, {
        let text = metrics(proxy.admin_addr).await;
        (metric_value(&text, "goodput_upstream_http2_saturated_total") == Some(1.0)).then_some(())
    });
    assert!(
        firsts.try_recv().is_err(),
        "the third stream got an event while held"
    );
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);
    up.release.send(true).unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Bytes::from(format!("{FIRST}{REST}")));
    }
    assert_eq!(firsts.recv().await, Some(0));
    let records = wait_records(proxy.admin_addr, 3, T).await;
    for r in &records {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["bytes_out"], FIRST.len() + REST.len(), "{r}");
    }
}
