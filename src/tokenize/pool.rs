//! A fixed set of worker threads fed through a bounded queue. Submitting never blocks:
//! when the queue is full the job is handed back, and the caller falls back instead of
//! waiting, so a burst of counting work can never slow the measurement path down.

use std::{
    io,
    sync::{
        Arc, Mutex, PoisonError,
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    thread,
};

/// Worker threads running `J` jobs.
pub struct Pool<J> {
    tx: SyncSender<J>,
}

impl<J: Send + 'static> Pool<J> {
    /// Starts `workers` threads (at least one) that run each job with `run`; at most
    /// `queue` jobs wait. Threads end once the pool is dropped and the queue is empty.
    pub fn new<F>(name: &str, workers: usize, queue: usize, run: F) -> io::Result<Pool<J>>
    where
        F: Fn(J) + Send + Sync + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(queue);
        let rx = Arc::new(Mutex::new(rx));
        let run = Arc::new(run);
        for i in 0..workers.max(1) {
            let (rx, run) = (rx.clone(), run.clone());
            thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&rx, &*run))?;
        }
        Ok(Pool { tx })
    }

    /// Queues a job, or hands it back when the queue is full (or the workers are gone).
    pub fn try_submit(&self, job: J) -> Result<(), J> {
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
        })
    }
}

fn work<J>(rx: &Mutex<Receiver<J>>, run: &(dyn Fn(J) + Send + Sync)) {
    loop {
        // The lock is held only while waiting for the next job, never while running it.
        let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match next {
            Ok(job) => run(job),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_full_queue_hands_the_job_back_and_every_queued_job_runs() {
        let (gate_tx, gate_rx) = channel::<()>();
        let gate = Mutex::new(gate_rx);
        let (done_tx, done_rx) = channel::<u32>();
        let done = Mutex::new(done_tx);
        let pool = Pool::new("t", 1, 1, move |n: u32| {
            // Job 0 holds the only worker until the test opens the gate.
            if n == 0 {
                let _ = gate.lock().unwrap().recv();
            }
            done.lock().unwrap().send(n).unwrap();
        })
        .unwrap();
        pool.try_submit(0).unwrap();
        // Wait until the worker has taken job 0, so the queue slot is free.
        let mut queued = None;
        for _ in 0..200 {
            if pool.try_submit(1).is_ok() {
                queued = Some(1);
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(queued, Some(1));
        assert_eq!(pool.try_submit(2), Err(2), "one running, one queued: full");
        gate_tx.send(()).unwrap();
        let mut got: Vec<u32> = (0..2).map(|_| done_rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1]);
        drop(pool);
        assert!(
            done_rx.recv_timeout(Duration::from_secs(5)).is_err(),
            "workers ended"
        );
    }
}
