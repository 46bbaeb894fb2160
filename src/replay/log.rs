//! `requests.jsonl`, written as the run goes: each finished request's line is handed to a
//! writer thread the moment it is measured, so a long soak's log is on disk as it grows
//! (a killed run loses at most the last second of lines) and the file is never built in
//! memory.
//!
//! Lines come in finishing order (the order the runner records requests in). The writer
//! owns a buffered file; a write error is kept and reported when the log is closed.

use std::{
    fs::File,
    io::{BufWriter, Write as _},
    path::Path,
    sync::mpsc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// File name in the report directory.
pub const FILE: &str = "requests.jsonl";

/// Write buffer: a few hundred lines between writes.
const BUFFER: usize = 256 << 10;
/// Longest a finished request's line stays in the buffer: a killed run loses at most this.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// The open log; [`RequestLog::close`] flushes it.
pub struct RequestLog {
    tx: mpsc::Sender<Vec<u8>>,
    writer: JoinHandle<std::io::Result<()>>,
}

impl RequestLog {
    /// Creates (truncates) `dir/requests.jsonl` and starts its writer.
    pub fn create(dir: &Path) -> std::io::Result<RequestLog> {
        let mut out = BufWriter::with_capacity(BUFFER, File::create(dir.join(FILE))?);
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::Builder::new()
            .name("replay-log".into())
            .spawn(move || {
                let mut result = Ok(());
                let mut flushed = Instant::now();
                loop {
                    let line = match rx.recv_timeout(FLUSH_EVERY) {
                        Ok(line) => Some(line),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    };
                    if result.is_err() {
                        continue;
                    }
                    if let Some(line) = line {
                        result = out.write_all(&line);
                    }
                    if result.is_ok() && flushed.elapsed() >= FLUSH_EVERY {
                        result = out.flush();
                        flushed = Instant::now();
                    }
                }
                result.and_then(|()| out.flush())
            })?;
        Ok(RequestLog { tx, writer })
    }

    /// Queues one line (never blocks on the disk).
    pub fn push(&self, line: Vec<u8>) {
        // The writer only goes away at close.
        let _ = self.tx.send(line);
    }

    /// Waits for every queued line to be written and flushed.
    pub fn close(self) -> std::io::Result<()> {
        drop(self.tx);
        self.writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the request log writer panicked")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_arrive_in_order_and_whole() {
        let dir = std::env::temp_dir().join(format!("goodput-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = RequestLog::create(&dir).unwrap();
        for i in 0..10_000 {
            log.push(format!("{{\"i\":{i}}}\n").into_bytes());
        }
        log.close().unwrap();
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10_000);
        assert_eq!(lines[9_999], "{\"i\":9999}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_directory_is_an_error_at_once() {
        let missing = std::env::temp_dir().join("goodput-no-such-dir/deeper");
        assert!(RequestLog::create(&missing).is_err());
    }
}
