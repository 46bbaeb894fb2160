//! The waker an inline upstream connection and the response body it feeds are polled
//! under ([`Nudge`]), so that one waking the other costs a round of the same poll rather
//! than a task wake-up.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU8, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
};

/// The waker a connection and its response body are polled under.
///
/// A wake while they are being polled (one waking the other) is only noted, and the poller
/// polls both once more: the task is not rescheduled, and tokio wakes no other worker for
/// it. A wake at any other time (the socket became readable, the connection closed) goes
/// to the task that last polled them.
pub(super) struct Nudge {
    shared: Arc<NudgeState>,
    /// `shared` as a waker, made once.
    pub(super) waker: Waker,
    /// The task's waker as last handed to `shared`, to skip handing it over again (and
    /// the lock) when the same task polls.
    task: Option<Waker>,
}

struct NudgeState {
    /// [`OUTSIDE`], [`POLLING`] or [`WOKEN_WHILE_POLLING`].
    state: AtomicU8,
    /// The task to wake from outside. Locked when the task changes and when a wake comes
    /// from outside (the socket), not per poll.
    task: Mutex<Option<Waker>>,
}

const OUTSIDE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN_WHILE_POLLING: u8 = 2;

/// Rounds one poll may take when the connection and the body keep waking each other;
/// then the task is woken and yields, like any other.
pub(super) const ROUNDS: usize = 4;

impl Nudge {
    pub(super) fn new() -> Nudge {
        let shared = Arc::new(NudgeState {
            state: AtomicU8::new(OUTSIDE),
            task: Mutex::new(None),
        });
        let waker = Waker::from(Arc::clone(&shared));
        Nudge {
            shared,
            waker,
            task: None,
        }
    }

    /// Runs `f` under this waker until it is ready, or until it was not woken while it ran.
    pub(super) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        if !self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            let waker = cx.waker().clone();
            *self
                .shared
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
            self.task = Some(waker);
        }
        let mut inner = Context::from_waker(&self.waker);
        for _ in 0..ROUNDS {
            self.shared.state.store(POLLING, Ordering::Release);
            let poll = f(&mut inner);
            // After the swap, a wake goes to the task; before it, it was noted here.
            let woken = self.shared.state.swap(OUTSIDE, Ordering::AcqRel) == WOKEN_WHILE_POLLING;
            // Ready: the caller polls again for the next frame, which drives both anew.
            if poll.is_ready() || !woken {
                return poll;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Lets go of the task, so that an idle connection does not keep it allocated.
    pub(super) fn forget(&mut self) {
        self.task = None;
        *self
            .shared
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Wake for NudgeState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let noted = self.state.compare_exchange(
            POLLING,
            WOKEN_WHILE_POLLING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if noted == Err(OUTSIDE)
            && let Some(task) = &*self.task.lock().unwrap_or_else(PoisonError::into_inner)
        {
            task.wake_by_ref();
        }
    }
}
