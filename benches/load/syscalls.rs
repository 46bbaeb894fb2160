//! A proxy's system calls over a measurement window, counted by `perf stat` on the
//! `raw_syscalls:sys_enter` tracepoint (every system call, `epoll_wait` and `futex`
//! included; `/proc/PID/io` only counts the read and write families). perf prints a count
//! every [`INTERVAL`]; the intervals wholly inside the window give a rate, which divided by
//! the window's request or event rate gives calls per request or per event. `None` where
//! perf is missing or not allowed to trace (`kernel.perf_event_paranoid`).

use std::{
    io::Read as _,
    process::{Child, Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// How often perf prints its count.
const INTERVAL: Duration = Duration::from_millis(100);

/// perf attached to a process tree.
pub struct Syscalls {
    child: Child,
    /// When perf was started; its interval times count from about then.
    started: Instant,
}

impl Syscalls {
    /// Starts counting `pids` (all their threads). Start it a little before the window:
    /// perf takes a few milliseconds to attach.
    pub fn start(pids: &[u32]) -> Option<Syscalls> {
        if pids.is_empty() {
            return None;
        }
        let list = pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        static PERF: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
        let perf = PERF.get_or_init(crate::procs::find_perf).as_ref()?;
        let started = Instant::now();
        let child = Command::new(perf)
            .args(["stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-I"])
            .arg(INTERVAL.as_millis().to_string())
            .args(["-p", &list])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        Some(Syscalls { child, started })
    }

    /// Stops perf; the system calls per second over the intervals inside `from..to`.
    pub fn stop(mut self, from: Instant, to: Instant) -> Option<f64> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let mut out = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        let from = from.checked_duration_since(self.started)?.as_secs_f64();
        let to = to.checked_duration_since(self.started)?.as_secs_f64();
        rate(&out, from, to)
    }
}

/// Calls per second over the intervals of `perf stat -I -x,` output that lie wholly
/// within `from..to` (seconds since perf started).
fn rate(out: &str, from: f64, to: f64) -> Option<f64> {
    let step = INTERVAL.as_secs_f64();
    let (mut calls, mut secs) = (0.0, 0.0);
    for line in out.lines() {
        let mut fields = line.split(',');
        let (Some(at), Some(count), Some(_), Some(event)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(at), Ok(count)) = (at.trim().parse::<f64>(), count.trim().parse::<f64>()) else {
            continue;
        };
        if event == "raw_syscalls:sys_enter" && at - step >= from && at <= to {
            calls += count;
            secs += step;
        }
    }
    (secs > 0.0).then(|| calls / secs)
}

/// The system calls `pids` make per unit of work (`done`: requests or events completed so
/// far) over `window`, counted while the load keeps running, after the measured window so
/// that perf's own cost is in none of its figures; `None` for direct (no pids) or without
/// perf.
pub async fn per_unit(pids: &[u32], done: &AtomicU64, window: Duration) -> Option<f64> {
    let syscalls = Syscalls::start(pids)?;
    // perf takes a few milliseconds to attach.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ta, da) = (Instant::now(), done.load(Ordering::Relaxed));
    tokio::time::sleep(window).await;
    let (tb, db) = (Instant::now(), done.load(Ordering::Relaxed));
    let calls_per_s = tokio::task::block_in_place(|| syscalls.stop(ta, tb))?;
    let units_per_s = db.saturating_sub(da) as f64 / tb.duration_since(ta).as_secs_f64();
    (units_per_s > 0.0).then(|| calls_per_s / units_per_s)
}
