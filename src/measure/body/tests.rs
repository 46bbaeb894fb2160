//! Tests of `body.rs`.

use std::collections::VecDeque;

use http_body_util::BodyExt;

use super::*;

/// A body that yields these chunks, one per poll.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// The capture of a body sent as `chunks` through a [`RequestTap`].
async fn capture_of(chunks: Vec<Bytes>) -> RequestCapture {
    let (tap, rx) = RequestTap::new(Chunks(chunks.into()), 1 << 20, None);
    let forwarded = tap.collect().await.unwrap().to_bytes();
    let capture = rx.await.unwrap();
    let captured: Vec<u8> = capture.chunks.iter().flat_map(|c| c.to_vec()).collect();
    assert_eq!(captured, forwarded.to_vec(), "the capture is the body");
    capture
}

#[tokio::test]
async fn a_small_body_is_captured_in_a_buffer_of_its_own() {
    let socket_buffer = Bytes::from(vec![b'x'; 8192]);
    let body = vec![
        socket_buffer.slice(0..300),
        Bytes::from_static(b"{\"a\":1}"),
    ];
    let capture = capture_of(body).await;
    assert_eq!(capture.chunks.len(), 1);
    assert!(capture.complete);
    assert_eq!(capture.bytes, 307);
    // The capture does not hold the socket buffer: it can be reclaimed.
    assert!(socket_buffer.is_unique());
}

#[tokio::test]
async fn a_large_body_keeps_its_chunks() {
    let body: Vec<Bytes> = (0..5).map(|_| Bytes::from(vec![b'y'; 8192])).collect();
    let capture = capture_of(body).await;
    assert_eq!(capture.chunks.len(), 5);
    assert_eq!(capture.bytes, 5 * 8192);
    let empty = capture_of(Vec::new()).await;
    assert!(empty.chunks.is_empty() && empty.complete);
}

/// A response body that gives these steps, one per poll: a chunk, or `None` for a
/// poll with nothing ready; then nothing ever again.
struct Steps(VecDeque<Option<Bytes>>);

impl Body for Steps {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.0.pop_front() {
            Some(Some(chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            _ => Poll::Pending,
        }
    }
}

#[test]
fn a_client_gone_before_a_flush_is_not_counted_as_delivered() {
    let (recorder, mut rx) = crate::measure::Recorder::new(
        4,
        prometheus_client::metrics::counter::Counter::default(),
        prometheus_client::metrics::gauge::Gauge::default(),
    );
    let (_, request) = tokio::sync::oneshot::channel();
    let mut tap = Tap::new(
        recorder,
        "r".into(),
        Instant::now(),
        crate::decode::Api::ChatCompletions,
        request,
        0,
        crate::measure::HeadInfo::default(),
    );
    tap.on_head(200, Some("text/event-stream"), None);
    let event = |text: &str| {
        Bytes::from(format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        ))
    };
    let (a, b) = (event("one"), event("two"));
    let delivery = Arc::new(Delivery::new());
    let steps = Steps(VecDeque::from([Some(a.clone()), None, Some(b), None]));
    let mut body =
        Box::pin(MeasuredBody::new(steps, tap).with_delivery(Some(delivery.clone()), false));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    // As hyper does: a frame, polled again (nothing ready), a flush of what it holds.
    assert!(body.as_mut().poll_frame(&mut cx).is_ready());
    assert!(body.as_mut().poll_frame(&mut cx).is_pending());
    delivery.flushed();
    // The second event is handed over, but the client is gone before the next flush.
    assert!(body.as_mut().poll_frame(&mut cx).is_ready());
    assert!(body.as_mut().poll_frame(&mut cx).is_pending());
    drop(body);
    let p = rx.try_recv().unwrap();
    assert_eq!(p.ending, Ending::ClientGone);
    assert_eq!(p.bytes_out, a.len() as u64, "only the flushed event");
    assert_eq!(p.timeline.events, 1);
    assert!(!p.terminal_delivered);
}

/// A request body that breaks on the client's side (bad framing, a length that does
/// not match).
struct Broken;

impl Body for Broken {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::other("content-length mismatch"))))
    }
}

/// The outcome of a request whose body is read to its end (or failure), and whose
/// response future is then dropped before any answer.
async fn outcome_unanswered<B>(request_body: B) -> crate::measure::Outcome
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (recorder, mut rx) = crate::measure::Recorder::new(
        4,
        prometheus_client::metrics::counter::Counter::default(),
        prometheus_client::metrics::gauge::Gauge::default(),
    );
    let (body, request) = RequestTap::new(request_body, 1024, None);
    let tap = Tap::new(
        recorder,
        "r".into(),
        Instant::now(),
        crate::decode::Api::ChatCompletions,
        request,
        0,
        crate::measure::HeadInfo::default(),
    );
    let mut body = Box::pin(body);
    while let Some(Ok(_)) = body.frame().await {}
    // The body goes with the forwarder, then the tap with the response future.
    drop(body);
    drop(tap);
    rx.try_recv().unwrap().finish().0.outcome
}

#[tokio::test]
async fn a_request_whose_body_broke_and_got_no_answer_is_a_client_error() {
    use crate::measure::Outcome;
    // An HTTP/2 stream reset for a length that does not match its body, say.
    assert_eq!(outcome_unanswered(Broken).await, Outcome::ClientError);
    // A whole body, then the client gone while waiting: an abort, as before.
    let whole = Chunks(VecDeque::from([Bytes::from_static(b"{}")]));
    assert_eq!(outcome_unanswered(whole).await, Outcome::ClientAbort);
}

#[test]
fn a_kept_answer_is_copied_and_holds_no_read_buffer() {
    let (recorder, mut rx) = crate::measure::Recorder::new(
        4,
        prometheus_client::metrics::counter::Counter::default(),
        prometheus_client::metrics::gauge::Gauge::default(),
    );
    let mut answer = |limit: u64, frames: &[Bytes]| {
        let (_, request) = tokio::sync::oneshot::channel();
        let mut tap = Tap::new(
            recorder.clone(),
            "r".into(),
            Instant::now(),
            crate::decode::Api::ChatCompletions,
            request,
            0,
            crate::measure::HeadInfo::default(),
        );
        tap.keep_answer(limit);
        tap.on_head(200, Some("text/event-stream"), None);
        for f in frames {
            tap.on_data(Instant::now(), f);
        }
        tap.finish(Instant::now(), Ending::Complete);
        rx.try_recv().unwrap().answer
    };
    // Two events read into one buffer of the reader's, as a client's reads slice it.
    let event = |text: &str| {
        format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
    };
    let (one, two) = (event("one"), event("two"));
    let mut read = vec![0u8; 8192];
    read[..one.len()].copy_from_slice(one.as_bytes());
    read[one.len()..one.len() + two.len()].copy_from_slice(two.as_bytes());
    let read = Bytes::from(read);
    let frames = [
        read.slice(..one.len()),
        read.slice(one.len()..one.len() + two.len()),
    ];
    let kept = answer(1 << 20, &frames);
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0], format!("{one}{two}"));
    drop(frames);
    // The reader's buffer is free to be reused: the answer is a copy.
    assert!(read.is_unique());
    // Past the limit nothing is kept.
    let frames = [Bytes::from(one.clone()), Bytes::from(two.clone())];
    assert!(answer((one.len() + 1) as u64, &frames).is_empty());
    assert_eq!(
        answer(one.len() as u64, &frames[..1]),
        vec![Bytes::from(one)]
    );
}
