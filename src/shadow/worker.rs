//! The shadow's own thread (`goodput-shadow`) with a single-threaded tokio runtime: every
//! copy's exchange, the reading and decoding of its answer, and the shadow client's
//! connections run there, never on the worker threads that serve the clients. Handing a
//! copy over is a spawn on its handle: no await on the data path.
//!
//! The thread runs at a lower scheduling priority than the proxy's (nice [`NICE`], on
//! Linux): where the cores are contended, the clients' streams win them and the copies
//! take what is left. The copies' own times may then run late by the wait; the candidate
//! and the secondary share the thread and wait alike (docs/SHADOW.md).
//!
//! The thread ends when [`Worker::end`] is called or the worker is dropped; the runtime
//! then drops the copies still under way, and each counts itself lost (`shutdown`).

use std::{future::Future, io, sync::Mutex, thread};

use tokio::{runtime, sync::oneshot};

/// The shadow thread's nice value, added to the proxy's: 10 gives it about a tenth of a
/// contended core's time against one thread of the proxy's (the kernel's weights 110 and
/// 1024), all of an idle one. Threads it starts (the runtime's blocking pool, the
/// resolver's) inherit it.
pub(super) const NICE: i32 = 10;

pub(super) struct Worker {
    handle: runtime::Handle,
    /// Dropping (or sending on) this ends the thread.
    end: Mutex<Option<oneshot::Sender<()>>>,
    /// Resolves once the runtime is gone, with every copy it ran.
    ended: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Worker {
    pub(super) fn start() -> io::Result<Worker> {
        let rt = runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("goodput-shadow")
            .build()?;
        let handle = rt.handle().clone();
        let (end_tx, end_rx) = oneshot::channel::<()>();
        let (ended_tx, ended_rx) = oneshot::channel();
        thread::Builder::new()
            .name("goodput-shadow".into())
            .spawn(move || {
                lower_priority();
                rt.block_on(async {
                    let _ = end_rx.await;
                });
                // Drops every task still on the runtime (their copies count themselves).
                drop(rt);
                let _ = ended_tx.send(());
            })?;
        Ok(Worker {
            handle,
            end: Mutex::new(Some(end_tx)),
            ended: Mutex::new(Some(ended_rx)),
        })
    }

    /// Runs `task` on the shadow's thread. After [`Worker::end`], the task is dropped
    /// unrun.
    pub(super) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.handle.spawn(task));
    }

    /// Ends the thread; resolves once its runtime and every task on it are gone.
    pub(super) async fn end(&self) {
        drop(self.end.lock().ok().and_then(|mut e| e.take()));
        let ended = self.ended.lock().ok().and_then(|mut e| e.take());
        if let Some(ended) = ended {
            let _ = ended.await;
        }
    }
}

/// Lowers the calling thread's priority by [`NICE`]; a failure (a sandbox that forbids
/// it) leaves it as it is, logged: the copies then compete as equals.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // On Linux, PRIO_PROCESS with a thread's id sets that thread alone.
        let tid = rustix::thread::gettid();
        let now = rustix::process::getpriority_process(Some(tid)).unwrap_or(0);
        if let Err(e) = rustix::process::setpriority_process(Some(tid), now + NICE) {
            tracing::warn!(error = %e, "cannot lower the shadow thread's priority");
        }
    }
}

/// The calling thread's nice value (for the test).
#[cfg(all(test, target_os = "linux"))]
fn nice() -> Option<i32> {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    /// Set when dropped.
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn tasks_run_on_the_shadow_thread_and_end_with_it() {
        let worker = Worker::start().unwrap();
        let (tx, rx) = oneshot::channel();
        worker.spawn(async move {
            let _ = tx.send(thread::current().name().map(str::to_owned));
        });
        assert_eq!(rx.await.unwrap().as_deref(), Some("goodput-shadow"));
        // The shadow's thread runs NICE below the thread that started it.
        #[cfg(target_os = "linux")]
        {
            let (tx, rx) = oneshot::channel();
            worker.spawn(async move {
                let _ = tx.send(nice());
            });
            let here = nice().unwrap();
            assert_eq!(rx.await.unwrap(), Some((here + NICE).min(19)));
        }
        // A task that never ends is dropped with the runtime.
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Flag(dropped.clone());
        let (started_tx, started_rx) = oneshot::channel();
        worker.spawn(async move {
            let _flag = flag;
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        started_rx.await.unwrap();
        worker.end().await;
        assert!(dropped.load(Ordering::SeqCst));
        // After the end, a task is dropped without running.
        let late = Arc::new(AtomicBool::new(false));
        let flag = Flag(late.clone());
        worker.spawn(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        assert!(late.load(Ordering::SeqCst));
    }
}
