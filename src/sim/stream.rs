//! The response body: a hand-written `http_body::Body` that plays a generation back on a
//! timetable.
//!
//! A stream is a small state machine polled by hyper's connection task: no task per
//! stream, no channel per token, one timer that is re-armed in place. Each event is
//! scheduled against an absolute deadline (the previous deadline plus an ITL sample) so
//! sleeping late never accumulates into drift, and an event already due is produced
//! without touching the timer. Each event is one frame, handed to hyper as soon as due.
//!
//! The body owns the request's [`InFlight`] guard, so its ground truth is recorded when
//! the last frame leaves, when it resets on purpose, or — if hyper drops it early because
//! the client went away — on drop.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use rand::rngs::SmallRng;
use tokio::time::{Instant, Sleep};

use super::truth::{End, InFlight};
use super::wire::{self, Encoder, Usage};

/// The error a simulated reset yields; hyper then aborts the response (HTTP/1.1: closes
/// the connection without the last chunk; HTTP/2: resets the stream).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulated upstream reset after {0} content events")]
    Reset(u32),
}

/// What one stream will do, decided up front by the handler.
#[derive(Debug)]
pub(crate) struct StreamPlan {
    pub enc: Encoder,
    pub rng: SmallRng,
    /// Role chunk first (chat only).
    pub role: bool,
    /// When the first token is due.
    pub first_at: Instant,
    pub tokens: u32,
    pub per_event: u32,
    pub finish: &'static str,
    /// Cut the stream after this many content events.
    pub reset_after: Option<u32>,
    pub include_usage: bool,
    pub prompt_tokens: u64,
    /// Top alternatives per token, when a chat request asked for `logprobs`.
    pub top_logprobs: Option<u32>,
}

/// Body of every simulator response.
#[derive(Debug)]
pub(crate) struct SimBody {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// A whole body in one frame; `flight` is `None` for untracked responses.
    Full {
        data: Option<Bytes>,
        flight: Option<InFlight>,
    },
    Stream(Pin<Box<Stream>>),
}

impl SimBody {
    pub(crate) fn full(data: Bytes, flight: Option<InFlight>) -> Self {
        SimBody {
            inner: Inner::Full {
                data: Some(data),
                flight,
            },
        }
    }

    pub(crate) fn stream(plan: StreamPlan, flight: InFlight) -> Self {
        let phase = if plan.role {
            Phase::Role
        } else {
            Phase::Content
        };
        let stream = Stream {
            sleep: tokio::time::sleep_until(plan.first_at),
            next_at: plan.first_at,
            phase,
            sent_events: 0,
            sent_tokens: 0,
            plan,
            flight,
        };
        SimBody {
            inner: Inner::Stream(Box::pin(stream)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Role,
    Content,
    Reset,
    Usage,
    Done,
    /// After `[DONE]`, before the body ends (`SimConfig::pause_after_done`).
    Pause,
    Ended,
}

pin_project! {
    #[derive(Debug)]
    struct Stream {
        #[pin]
        sleep: Sleep,
        // The deadline of the next event; `sleep` is only re-armed when that is ahead.
        next_at: Instant,
        phase: Phase,
        sent_events: u32,
        sent_tokens: u32,
        plan: StreamPlan,
        flight: InFlight,
    }
}

impl Stream {
    fn poll_event(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, SimError>>> {
        let mut this = self.project();
        match *this.phase {
            Phase::Ended => return Poll::Ready(None),
            Phase::Usage | Phase::Done => {}
            Phase::Role | Phase::Content | Phase::Reset | Phase::Pause => {
                let due = *this.next_at;
                if Instant::now() < due {
                    if this.sleep.deadline() != due {
                        this.sleep.as_mut().reset(due);
                    }
                    ready!(this.sleep.as_mut().poll(cx));
                }
            }
        }
        let plan = &mut *this.plan;
        let out = match *this.phase {
            Phase::Role => {
                // Same deadline as the first content event, which follows at once.
                *this.phase = Phase::Content;
                plan.enc.role()
            }
            Phase::Content => {
                let tokens = plan.per_event.min(plan.tokens - *this.sent_tokens);
                *this.sent_events += 1;
                *this.sent_tokens += tokens;
                let last = *this.sent_tokens >= plan.tokens;
                let event = plan.enc.content(
                    &mut plan.rng,
                    tokens,
                    last.then_some(plan.finish),
                    plan.top_logprobs,
                );
                if !last {
                    let gap = this
                        .flight
                        .shared()
                        .scale(this.flight.shared().cfg.itl.sample_ms(&mut plan.rng));
                    *this.next_at = this.next_at.checked_add(gap).unwrap_or(*this.next_at);
                }
                *this.phase = if plan.reset_after == Some(*this.sent_events) {
                    Phase::Reset
                } else if !last {
                    Phase::Content
                } else if plan.include_usage {
                    Phase::Usage
                } else {
                    Phase::Done
                };
                this.flight.token_event(tokens);
                event
            }
            Phase::Reset => {
                *this.phase = Phase::Ended;
                this.flight.finish(End::Reset);
                return Poll::Ready(Some(Err(SimError::Reset(*this.sent_events))));
            }
            Phase::Usage => {
                *this.phase = Phase::Done;
                plan.enc.usage(Usage {
                    prompt_tokens: plan.prompt_tokens,
                    completion_tokens: u64::from(*this.sent_tokens),
                })
            }
            Phase::Done => {
                let pause = this.flight.shared().cfg.pause_after_done;
                *this.phase = if pause.is_zero() {
                    Phase::Ended
                } else {
                    *this.next_at = Instant::now() + pause;
                    Phase::Pause
                };
                this.flight.finish(End::Completed);
                Bytes::from_static(wire::DONE)
            }
            Phase::Pause | Phase::Ended => {
                *this.phase = Phase::Ended;
                return Poll::Ready(None);
            }
        };
        Poll::Ready(Some(Ok(out)))
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = SimError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SimError>>> {
        match &mut self.get_mut().inner {
            Inner::Full { data, flight } => {
                let data = data.take();
                if let Some(f) = flight {
                    f.finish(End::Completed);
                }
                Poll::Ready(data.map(|d| Ok(Frame::data(d))))
            }
            Inner::Stream(s) => s
                .as_mut()
                .poll_event(cx)
                .map(|e| e.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full { data, .. } => data.is_none(),
            Inner::Stream(s) => s.phase == Phase::Ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Inner::Stream(_) => SizeHint::default(),
        }
    }
}

/// Caps a scaled delay at a day so a huge slowdown cannot overflow deadline arithmetic.
pub(crate) fn scale_duration(d: Duration, factor: f64) -> Duration {
    const MAX: Duration = Duration::from_secs(86_400);
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).map_or(MAX, |d| d.min(MAX))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use rand::SeedableRng;

    use super::*;
    use crate::sim::wire::Api;
    use crate::sim::{Dist, Shared, SimConfig};

    fn body(shared: &Arc<Shared>, tokens: u32, reset_after: Option<u32>) -> SimBody {
        let truth = crate::sim::Truth {
            request_id: None,
            path: "/v1/chat/completions".into(),
            stream: true,
            status: 200,
            prompt_tokens: 1,
            completion_tokens: 0,
            events: 0,
            received_at: std::time::Instant::now(),
            first_token_at: None,
            last_token_at: None,
            event_times: Vec::new(),
            finish_reason: Some("stop"),
            completed: false,
            client_gone: false,
        };
        let plan = StreamPlan {
            enc: Encoder::new(Api::Chat, "id", 0, "m"),
            rng: SmallRng::seed_from_u64(1),
            role: true,
            first_at: Instant::now() + Duration::from_millis(100),
            tokens,
            per_event: 1,
            finish: "stop",
            reset_after,
            include_usage: true,
            prompt_tokens: 1,
            top_logprobs: None,
        };
        SimBody::stream(plan, InFlight::start(shared.clone(), truth))
    }

    fn shared() -> Arc<Shared> {
        let cfg = SimConfig {
            itl: Dist::Fixed(10.0),
            ..SimConfig::default()
        };
        Arc::new(Shared::new(cfg))
    }

    #[tokio::test(start_paused = true)]
    async fn events_follow_an_absolute_timetable() {
        let shared = shared();
        let t0 = Instant::now();
        let mut b = body(&shared, 4, None);
        let mut at = Vec::new();
        while let Some(frame) = b.frame().await {
            frame.unwrap();
            at.push((Instant::now() - t0).as_millis());
            // A slow consumer: with relative sleeps this lag would add up event by event.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        // role, 4 tokens, usage, [DONE]
        assert_eq!(at, [100, 103, 110, 120, 130, 133, 136]);
        assert!(b.is_end_stream());
        let t = shared.truth.snapshot().pop().unwrap();
        assert!(t.completed && !t.client_gone);
        assert_eq!((t.events, t.completion_tokens), (4, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn the_body_ends_a_pause_after_done() {
        let shared = Arc::new(Shared::new(SimConfig {
            itl: Dist::Fixed(10.0),
            pause_after_done: Duration::from_millis(400),
            ..SimConfig::default()
        }));
        let t0 = Instant::now();
        let mut b = body(&shared, 2, None);
        let mut last = Bytes::new();
        while let Some(frame) = b.frame().await {
            last = frame.unwrap().into_data().unwrap();
        }
        assert_eq!(last, wire::DONE, "nothing follows [DONE]");
        // [DONE] at 110 ms (first token at 100, the second 10 later), then the pause.
        assert_eq!((Instant::now() - t0).as_millis(), 510);
        assert!(b.is_end_stream());
        assert!(shared.truth.snapshot().pop().unwrap().completed);
    }

    #[tokio::test(start_paused = true)]
    async fn every_event_time_is_kept_only_when_asked() {
        for record in [false, true] {
            let shared = Arc::new(Shared::new(SimConfig {
                itl: Dist::Fixed(10.0),
                record_event_times: record,
                ..SimConfig::default()
            }));
            let mut b = body(&shared, 4, None);
            while let Some(frame) = b.frame().await {
                frame.unwrap();
            }
            let t = shared.truth.snapshot().pop().unwrap();
            if !record {
                assert!(t.event_times.is_empty());
                continue;
            }
            // The 4 content events (not the role or usage chunks), in order.
            assert_eq!(t.event_times.len(), 4);
            assert!(t.event_times.is_sorted());
            assert_eq!(t.event_times.first().copied(), t.first_token_at);
            assert_eq!(t.event_times.last().copied(), t.last_token_at);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_ends_with_an_error_after_the_chosen_event() {
        let shared = shared();
        let mut b = body(&shared, 4, Some(2));
        let mut data = 0;
        let err = loop {
            match b.frame().await {
                Some(Ok(_)) => data += 1,
                Some(Err(e)) => break e,
                None => panic!("no reset"),
            }
        };
        assert!(matches!(err, SimError::Reset(2)));
        assert_eq!(data, 3, "role + 2 content events");
        assert!(b.frame().await.is_none());
        let t = shared.truth.snapshot().pop().unwrap();
        assert!(!t.completed && !t.client_gone && t.events == 2);
        assert_eq!(
            shared.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    #[test]
    fn scaling_saturates() {
        assert_eq!(
            scale_duration(Duration::from_millis(10), 2.5),
            Duration::from_millis(25)
        );
        assert_eq!(
            scale_duration(Duration::from_secs(1), f64::MAX),
            Duration::from_secs(86_400)
        );
    }
}
