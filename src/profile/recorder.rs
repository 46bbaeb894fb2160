//! The recording component: a bounded queue in front of a dedicated writer thread.
//!
//! [`ProfileRecorder::record`] never blocks and never fails: it `try_send`s into a bounded
//! channel, and a full queue drops the line and counts it
//! (`goodput_profile_records_dropped_total{reason="queue_full"}`). File I/O happens only on
//! the writer thread ([`super::writer`]), which also wakes up on its own to rotate files
//! by age. [`ProfileRecorder::shutdown`] drains the queue, fsyncs and closes the file.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        mpsc::{self, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::oneshot;

use super::{
    Anonymizer, ProfileLine,
    writer::{Counters, Writer, WriterSettings},
};
use crate::{config::ProfileConfig, metrics::DropReasonLabel, profile::ProfileMetrics};

/// How often the writer thread wakes up without traffic (age-based rotation).
const TICK: Duration = Duration::from_millis(250);
/// Lines written between two flushes to the OS when the queue never empties.
const FLUSH_BATCH: usize = 1024;

/// Why a profile record was not written: the `reason` label of
/// `goodput_profile_records_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The recorder's queue was full (the disk is slower than the traffic).
    QueueFull,
    /// The directory could not be written (full, read-only, missing permission).
    Disk,
    /// The recorder had been shut down.
    Closed,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Disk => "disk",
            DropReason::Closed => "closed",
        }
    }
}

/// Recording could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("`[profile] dir` is not set: recording is off")]
    NoDir,
    #[error("cannot start the profile writer thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Where the writer thread reads the time it rotates files by and retries the disk after
/// an error. Passed in, so that tests can run the writer on paused time.
#[derive(Clone, Debug)]
pub struct Clock(Option<tokio::runtime::Handle>);

impl Clock {
    /// The process's monotonic clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// The clock of the tokio runtime this is called on: the process's clock, unless the
    /// runtime's time is paused (tests), when it moves only as the runtime advances it.
    pub fn of_runtime() -> Clock {
        Clock(tokio::runtime::Handle::try_current().ok())
    }

    pub fn now(&self) -> Instant {
        match &self.0 {
            None => Instant::now(),
            Some(handle) => {
                let _entered = handle.enter();
                tokio::time::Instant::now().into_std()
            }
        }
    }
}

enum Msg {
    Line(Box<ProfileLine>),
    Flush(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

/// The handle the aggregator records through. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ProfileRecorder {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: SyncSender<Msg>,
    dropped: Family<DropReasonLabel, Counter>,
    anon: Anonymizer,
    dir: PathBuf,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ProfileRecorder {
    /// Starts the writer thread for `cfg.dir`, reading the time from `clock`. Files are
    /// opened on the first line, so an unwritable directory is not an error here: it is a
    /// disk episode, counted and retried like any other.
    pub fn start(
        cfg: &ProfileConfig,
        anon: Anonymizer,
        metrics: &ProfileMetrics,
        clock: Clock,
    ) -> Result<ProfileRecorder, StartError> {
        let dir = cfg.dir.clone().ok_or(StartError::NoDir)?;
        let settings = WriterSettings {
            dir: dir.clone(),
            instance: cfg.instance.clone(),
            rotate_bytes: cfg.rotate_bytes,
            rotate_every: cfg.rotate_every,
            max_files: cfg.max_files,
            max_age: cfg.max_age,
            contract: cfg.contract.clone(),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        };
        let counters = Counters {
            written: metrics.profile_records.clone(),
            dropped_disk: metrics
                .profile_dropped
                .get_or_create(&DropReasonLabel {
                    reason: DropReason::Disk.as_str(),
                })
                .clone(),
        };
        Self::spawn(
            settings,
            cfg.queue,
            anon,
            counters,
            metrics.profile_dropped.clone(),
            clock,
        )
    }

    /// As [`Self::start`] from explicit settings (tests).
    pub fn spawn(
        settings: WriterSettings,
        queue: usize,
        anon: Anonymizer,
        counters: Counters,
        dropped: Family<DropReasonLabel, Counter>,
        clock: Clock,
    ) -> Result<ProfileRecorder, StartError> {
        let (tx, rx) = mpsc::sync_channel(queue.max(1));
        let dir = settings.dir.clone();
        let writer = Writer::new(settings, anon.clone(), counters);
        let thread = std::thread::Builder::new()
            .name("goodput-profile".into())
            .spawn(move || run(writer, rx, &clock))
            .map_err(StartError::Thread)?;
        Ok(ProfileRecorder {
            inner: Arc::new(Inner {
                tx,
                dropped,
                anon,
                dir,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Queues a line for writing; never blocks. A full queue drops it (counted).
    pub fn record(&self, line: ProfileLine) {
        let reason = match self.inner.tx.try_send(Msg::Line(Box::new(line))) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => DropReason::QueueFull,
            Err(TrySendError::Disconnected(_)) => DropReason::Closed,
        };
        self.inner
            .dropped
            .get_or_create(&DropReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// The keys lines must be hashed with for this recorder's files.
    pub fn anonymizer(&self) -> &Anonymizer {
        &self.inner.anon
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.inner.dir
    }

    /// Waits until every line queued before this call has been handed to the OS, and the
    /// file has been rotated if it is due by age (at the clock's time now).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        let tx = self.inner.tx.clone();
        // `send` blocks while the queue is full: off the runtime's workers.
        let sent = tokio::task::spawn_blocking(move || tx.send(Msg::Flush(ack)).is_ok()).await;
        if matches!(sent, Ok(true)) {
            let _ = done.await;
        }
    }

    /// Writes what is queued, fsyncs and closes the file, and stops the thread. Lines
    /// recorded afterwards (through other clones) are dropped as `closed`.
    pub async fn shutdown(self) {
        let (ack, done) = oneshot::channel();
        let tx = self.inner.tx.clone();
        let sent = tokio::task::spawn_blocking(move || tx.send(Msg::Shutdown(ack)).is_ok()).await;
        if matches!(sent, Ok(true)) {
            let _ = done.await;
        }
        let thread = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// The writer thread: write what comes, flush when the queue is idle, rotate on time.
fn run(mut writer: Writer, rx: mpsc::Receiver<Msg>, clock: &Clock) {
    let mut since_flush = 0usize;
    loop {
        let msg = match rx.recv_timeout(TICK) {
            Ok(msg) => Some(msg),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut next = msg;
        while let Some(msg) = next.take() {
            let now = clock.now();
            match msg {
                Msg::Line(line) => {
                    writer.write(&line, now);
                    since_flush += 1;
                    if since_flush >= FLUSH_BATCH {
                        writer.flush(now);
                        since_flush = 0;
                    }
                }
                Msg::Flush(ack) => {
                    writer.flush(now);
                    writer.tick(now);
                    since_flush = 0;
                    let _ = ack.send(());
                }
                Msg::Shutdown(ack) => {
                    writer.close();
                    let _ = ack.send(());
                    return;
                }
            }
            next = rx.try_recv().ok();
        }
        let now = clock.now();
        if since_flush > 0 {
            writer.flush(now);
            since_flush = 0;
        }
        writer.tick(now);
    }
    writer.close();
}
