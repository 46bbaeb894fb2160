//! The live progress line on a terminal: step, elapsed time, requests, the current P95
//! TTFT (over the last [`RECENT`] requests) and errors, redrawn a few times a second by
//! indicatif. Hidden when stderr is not a terminal or with `--quiet`; the counters are
//! kept either way (cheap atomics and one short lock per finished request).

use std::{
    collections::VecDeque,
    io::IsTerminal,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// TTFTs the live P95 is computed over.
const RECENT: usize = 512;

#[derive(Debug)]
struct State {
    started: Instant,
    done: AtomicU64,
    errors: AtomicU64,
    recent: Mutex<VecDeque<f64>>,
    step: Mutex<String>,
}

/// Counters shared with the load tasks, and the display fed from them. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Progress {
    state: Arc<State>,
    bar: ProgressBar,
}

impl Progress {
    /// A display on stderr when it is a terminal and `quiet` is off; hidden otherwise.
    pub fn new(quiet: bool) -> Progress {
        let visible = !quiet && std::io::stderr().is_terminal();
        let target = if visible {
            ProgressDrawTarget::stderr_with_hz(4)
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        let style = ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        Progress {
            state: Arc::new(State {
                started: Instant::now(),
                done: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                recent: Mutex::new(VecDeque::with_capacity(RECENT)),
                step: Mutex::new(String::new()),
            }),
            bar,
        }
    }

    pub fn set_step(&self, label: &str) {
        *self
            .state
            .step
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = label.to_owned();
        self.state
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// One finished request.
    pub fn finished(&self, ttft_ms: Option<f64>, error: bool) {
        self.state.done.fetch_add(1, Ordering::Relaxed);
        if error {
            self.state.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = ttft_ms {
            let mut r = self
                .state
                .recent
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if r.len() == RECENT {
                r.pop_front();
            }
            r.push_back(t);
        }
    }

    /// A line printed above the live one (shown on a terminal only).
    pub fn println(&self, line: &str) {
        self.bar.println(line);
    }

    /// The line as it would be drawn now.
    pub fn line(&self) -> String {
        let s = &self.state;
        let mut recent: Vec<f64> = s
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect();
        recent.sort_by(f64::total_cmp);
        let p95 = super::tally::quantile(&recent, 0.95)
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.0} ms"));
        let step = s
            .step
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        format!(
            "{step} | {:.0}s | {} requests | P95 TTFT {p95} | {} errors",
            s.started.elapsed().as_secs_f64(),
            s.done.load(Ordering::Relaxed),
            s.errors.load(Ordering::Relaxed),
        )
    }

    /// Redraws every 250 ms until the returned guard is dropped.
    pub fn start(&self) -> Ticker {
        let me = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                me.bar.set_message(me.line());
                me.bar.tick();
            }
        });
        Ticker {
            task,
            bar: self.bar.clone(),
        }
    }
}

/// Stops the redraws and clears the line when dropped.
pub struct Ticker {
    task: tokio::task::JoinHandle<()>,
    bar: ProgressBar,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}
