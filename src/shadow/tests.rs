//! The shadow's records on their own way: its queue drops (and counts) rather than waits,
//! a copy stays in flight until its record is written, and what still waits when the
//! shadow stops is counted, never lost. No candidate is needed: the measurements are
//! finished here as an exchange would finish them.

use std::time::Instant;

use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::{
    config::load_str,
    decode::Api,
    measure::{Ending, HeadInfo, Pending, Tap},
    tokenize::{Fallbacks, Tokenizers},
};

fn live(extra: &str) -> Arc<ArcSwap<Config>> {
    let text = format!(
        "[upstream]\nurl = \"http://127.0.0.1:9\"\n[shadow]\nurl = \"http://127.0.0.1:9\"\n{extra}\n"
    );
    let config = load_str(&text, "test", &Default::default()).unwrap();
    Arc::new(ArcSwap::from_pointee(config))
}

fn stage(queue: Queue, live: &Arc<ArcSwap<Config>>) -> (Stage, mpsc::Receiver<Pending>) {
    Stage::new(
        queue,
        live.clone(),
        Arc::new(ArcSwap::from_pointee(Tokenizers::default())),
        Fallbacks::new(Family::default()),
    )
}

/// A copy taken and its answer measured to its end, as `send::run` does it.
fn answered(recorder: &Recorder, metrics: &ShadowMetrics, pair_id: &str) {
    let (_capture, capture_rx) = oneshot::channel();
    let mut tap = Tap::new(
        recorder.clone(),
        format!("{pair_id}:shadow"),
        Instant::now(),
        Api::ChatCompletions,
        capture_rx,
        1024,
        HeadInfo::default(),
    );
    tap.hold(metrics.hold());
    tap.shadow_of(pair_id.to_owned());
    tap.on_head(200, Some("text/event-stream"), None);
    tap.finish(Instant::now(), Ending::Complete);
}

fn recorder(shadow: &Shadow) -> Recorder {
    (*shadow.inner.recorder.load_full().unwrap()).clone()
}

fn drops(metrics: &ShadowMetrics, reason: DropReason) -> u64 {
    metrics.counter(reason).get()
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_a_record_instead_of_waiting() {
    let live = live("record_queue = 1");
    let metrics = ShadowMetrics::default();
    let (shadow, queue) = Shadow::new(live.clone(), metrics.clone());
    let recorder = recorder(&shadow);
    // Nothing reads the queue yet: the first record waits, the next two are dropped.
    for id in ["a", "b", "c"] {
        answered(&recorder, &metrics, id);
    }
    assert_eq!(drops(&metrics, DropReason::Backlog), 2);
    assert_eq!(
        metrics.in_flight.get(),
        1,
        "the waiting record is still in flight"
    );
    let (stage, mut out) = stage(queue, &live);
    let running = tokio::spawn(stage.run());
    let mut first = out.recv().await.unwrap();
    assert_eq!(first.pairing.pair_id.as_deref(), Some("a"));
    // Through the stage and handed to the aggregator, but not written yet.
    assert_eq!(metrics.in_flight.get(), 1);
    first.held.take().unwrap().settle();
    assert_eq!(metrics.in_flight.get(), 0);
    shadow.stop().await;
    running.await.unwrap();
    assert!(
        out.recv().await.is_none(),
        "the aggregator's channel closes"
    );
    assert_eq!(drops(&metrics, DropReason::Shutdown), 0);
}

#[tokio::test]
async fn what_still_waits_when_the_shadow_stops_is_counted_not_written() {
    let live = live("record_queue = 8");
    let metrics = ShadowMetrics::default();
    let (shadow, queue) = Shadow::new(live.clone(), metrics.clone());
    // An exchange under way keeps its own handle on the recorder.
    let under_way = recorder(&shadow);
    for id in ["a", "b", "c"] {
        answered(&under_way, &metrics, id);
    }
    assert_eq!(metrics.in_flight.get(), 3);
    let (stage, mut out) = stage(queue, &live);
    shadow.stop().await;
    stage.run().await;
    assert!(
        out.recv().await.is_none(),
        "nothing is written after the stop"
    );
    assert_eq!(drops(&metrics, DropReason::Shutdown), 3);
    // A copy that finishes after the stage is gone is counted the same way.
    answered(&under_way, &metrics, "d");
    assert_eq!(drops(&metrics, DropReason::Shutdown), 4);
    assert_eq!(drops(&metrics, DropReason::Backlog), 0);
    assert_eq!(metrics.in_flight.get(), 0);
}

#[tokio::test]
async fn a_ticket_holds_its_copy_in_flight_until_it_is_given_up() {
    let live = live("share = 1.0");
    let metrics = ShadowMetrics::default();
    let (shadow, _queue) = Shadow::new(live, metrics.clone());
    let parts = http::Request::post("/v1/chat/completions")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let head = MirrorHead {
        parts: &parts,
        id: "req-1",
        api: Api::ChatCompletions,
        tenant: None,
        t_arrival: Instant::now(),
    };
    let ticket = shadow.ticket(&head).unwrap();
    assert_eq!(metrics.in_flight.get(), 1);
    ticket.abandon(Unmirrored::Incomplete);
    assert_eq!(metrics.in_flight.get(), 0);
    assert_eq!(drops(&metrics, DropReason::BodyIncomplete), 1);
    // A ticket dropped unused (its request task dropped at exit) is not lost silently.
    drop(shadow.ticket(&head).unwrap());
    assert_eq!(metrics.in_flight.get(), 0);
    assert_eq!(drops(&metrics, DropReason::Shutdown), 1);
    shadow.stop().await;
}
