//! Waiting for work that finishes off the data path and gives no signal a test could wait
//! on (a record reaching the admin API, a counter on `/metrics`, a file, a child process's
//! exit): the condition is looked at again every [`POLL`] until it holds or the deadline
//! passes, then the test fails saying what it waited for. The only place tests wait on the
//! clock; nothing here decides a result by how long something took.

use std::time::{Duration, Instant};

/// How often a condition is looked at again.
pub const POLL: Duration = Duration::from_millis(10);

/// `poll_until!(what, within, check)`: evaluates `check` (a block giving `Option<T>`; it
/// may `.await`) every [`POLL`] until it gives `Some(value)`, and is that value; panics
/// naming `what` after `within`.
macro_rules! poll_until {
    ($what:expr, $within:expr, $check:block) => {{
        let within: ::std::time::Duration = $within;
        let deadline = ::tokio::time::Instant::now() + within;
        loop {
            if let Some(value) = $check {
                break value;
            }
            assert!(
                ::tokio::time::Instant::now() < deadline,
                "gave up after {within:?} waiting for {}",
                $what
            );
            $crate::common::wait::pause().await;
        }
    }};
}

/// `poll_loop!(deadline = expr, body)`: runs `body` (which leaves with `break`, `return` or
/// a failed assertion against `deadline`) again every [`POLL`].
macro_rules! poll_loop {
    ($deadline:ident = $at:expr, $body:block) => {{
        let $deadline = $at;
        loop {
            $body;
            $crate::common::wait::pause().await;
        }
    }};
}

/// The pause between two looks at a condition.
pub async fn pause() {
    tokio::time::sleep(POLL).await;
}

/// Looks at `check` every [`POLL`] until it gives a value, or `None` after `within`;
/// without a runtime (child processes).
pub fn blocking<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}
