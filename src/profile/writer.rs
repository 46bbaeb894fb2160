//! The file side of recording, run on the recorder's own thread (never on a request's
//! path): opens files lazily on the first line, writes lines, rotates by size and age,
//! fsyncs and closes on rotation and shutdown, applies retention, remaps block
//! fingerprints to small integers per file, and survives disk errors.
//!
//! A disk error (full, read-only, permission, missing directory...) starts an *episode*:
//! the open file is abandoned (its last line may be torn; readers skip it), one warning
//! is logged, and lines are dropped and counted (`reason="disk"`) until a retry, with
//! exponential backoff, opens a new file; then one line says recording resumed.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::metrics::counter::Counter;

use super::{
    Anonymizer, ProfileLine,
    format::{Contract, unix_ms},
    line::LineEncoder,
};

/// Distinct blocks per file before it is rotated early: bounds the id map's memory
/// (≈ 40 MB at this size) whatever the traffic.
const MAX_IDS_PER_FILE: usize = 1 << 21;

/// What the writer needs from `[profile]`.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub dir: PathBuf,
    pub instance: String,
    pub rotate_bytes: u64,
    pub rotate_every: Duration,
    pub max_files: usize,
    pub max_age: Option<Duration>,
    pub contract: Contract,
    /// First retry after a disk error; doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
}

/// Counters the writer updates.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub written: Counter,
    pub dropped_disk: Counter,
}

struct OpenFile {
    out: BufWriter<File>,
    path: PathBuf,
    opened: Instant,
    bytes: u64,
    /// Lines in the buffer, counted as written once flushed.
    pending: u64,
    /// Numbers this file's blocks.
    lines: LineEncoder,
}

struct Failure {
    retry_at: Instant,
    backoff: Duration,
    dropped: u64,
}

pub struct Writer {
    s: WriterSettings,
    anon: Anonymizer,
    counters: Counters,
    open: Option<OpenFile>,
    failure: Option<Failure>,
}

impl Writer {
    pub fn new(s: WriterSettings, anon: Anonymizer, counters: Counters) -> Writer {
        Writer {
            s,
            anon,
            counters,
            open: None,
            failure: None,
        }
    }

    /// Writes one line (buffered), opening or rotating files as needed.
    pub fn write(&mut self, line: &ProfileLine, now: Instant) {
        if let Some(f) = &mut self.failure
            && now < f.retry_at
        {
            f.dropped += 1;
            self.counters.dropped_disk.inc();
            return;
        }
        let expired = self
            .open
            .as_ref()
            .is_some_and(|o| now.duration_since(o.opened) >= self.s.rotate_every);
        if expired {
            self.close();
        }
        if self.open.is_none() {
            match self.open_file(now) {
                Ok(o) => {
                    self.open = Some(o);
                    if let Some(f) = self.failure.take() {
                        tracing::info!(dropped = f.dropped, "profile recording resumed");
                    }
                }
                Err(e) => {
                    self.fail(&e, now);
                    self.drop_line();
                    return;
                }
            }
        }
        let Some(o) = self.open.as_mut() else {
            return;
        };
        let mut text = String::new();
        if let Err(e) = o.lines.encode(line, &mut text) {
            // Plain data always serializes; should it not, the line is dropped, not torn.
            tracing::debug!(error = %e, "profile line not serializable");
            return;
        }
        match o.out.write_all(text.as_bytes()) {
            Ok(()) => {
                o.bytes += text.len() as u64;
                o.pending += 1;
                if o.bytes >= self.s.rotate_bytes || o.lines.distinct_blocks() >= MAX_IDS_PER_FILE {
                    self.close();
                }
            }
            Err(e) => {
                self.fail(&e, now);
                self.drop_line();
            }
        }
    }

    /// Hands buffered lines to the OS (called when the queue is idle), so a crash of the
    /// process loses nothing already dequeued.
    pub fn flush(&mut self, now: Instant) {
        let Some(o) = self.open.as_mut() else {
            return;
        };
        match o.out.flush() {
            Ok(()) => {
                self.counters.written.inc_by(o.pending);
                o.pending = 0;
            }
            Err(e) => self.fail(&e, now),
        }
    }

    /// Time-based rotation when no line comes to trigger it.
    pub fn tick(&mut self, now: Instant) {
        if self
            .open
            .as_ref()
            .is_some_and(|o| now.duration_since(o.opened) >= self.s.rotate_every)
        {
            self.close();
        }
    }

    /// Flushes, fsyncs and closes the current file, then applies retention.
    pub fn close(&mut self) {
        let Some(mut o) = self.open.take() else {
            return;
        };
        let result = o.out.flush().and_then(|()| o.out.get_ref().sync_all());
        match result {
            Ok(()) => {
                self.counters.written.inc_by(o.pending);
            }
            Err(e) => {
                self.counters.dropped_disk.inc_by(o.pending);
                tracing::warn!(error = %e, file = %o.path.display(), "profile file not fully written");
            }
        }
        drop(o);
        self.retention();
    }

    /// The file being written, if any.
    pub fn current(&self) -> Option<&Path> {
        self.open.as_ref().map(|o| o.path.as_path())
    }

    fn drop_line(&mut self) {
        self.counters.dropped_disk.inc();
        if let Some(f) = &mut self.failure {
            f.dropped += 1;
        }
    }

    fn fail(&mut self, e: &io::Error, now: Instant) {
        if let Some(o) = self.open.take() {
            // Buffered lines are lost with the file; what reached it stays readable.
            self.counters.dropped_disk.inc_by(o.pending);
        }
        match &mut self.failure {
            None => {
                tracing::warn!(
                    error = %e,
                    kind = ?e.kind(),
                    dir = %self.s.dir.display(),
                    "profile recording failing; records are dropped until the directory is writable again"
                );
                self.failure = Some(Failure {
                    retry_at: now + self.s.retry_min,
                    backoff: self.s.retry_min,
                    dropped: 0,
                });
            }
            Some(f) => {
                f.backoff = (f.backoff * 2).min(self.s.retry_max);
                f.retry_at = now + f.backoff;
            }
        }
    }

    fn open_file(&mut self, now: Instant) -> io::Result<OpenFile> {
        fs::create_dir_all(&self.s.dir)?;
        if self.failure.is_none() && self.open.is_none() {
            self.retention();
        }
        let mut start_ms = unix_ms(SystemTime::now());
        let (file, path) = loop {
            let path = self.s.dir.join(file_name(start_ms, &self.s.instance));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (f, path),
                // Two rotations within a millisecond, or a restarted twin: next name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => start_ms += 1,
                Err(e) => return Err(e),
            }
        };
        // The new name must survive a crash too.
        File::open(&self.s.dir).and_then(|d| d.sync_all()).ok();
        let header = self
            .anon
            .header(super::format::from_unix_ms(start_ms), &self.s.contract);
        let mut text = serde_json::to_string(&header).map_err(io::Error::other)?;
        text.push('\n');
        let mut out = BufWriter::with_capacity(64 * 1024, file);
        // Surface a full or read-only disk now rather than lines later; a file without
        // its header is of no use to anyone, so it goes.
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            drop(out);
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(OpenFile {
            out,
            path,
            opened: now,
            bytes: text.len() as u64,
            pending: 0,
            lines: LineEncoder::new(start_ms),
        })
    }

    /// Deletes this instance's oldest files beyond `max_files`, and any older than
    /// `max_age`. Errors are ignored: retention never stops recording.
    fn retention(&self) {
        let suffix = format!("-{}.jsonl", self.s.instance);
        let Ok(dir) = fs::read_dir(&self.s.dir) else {
            return;
        };
        let mut files: Vec<(String, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                (name.starts_with("goodput-") && name.ends_with(&suffix)).then(|| (name, e.path()))
            })
            .filter(|(_, p)| Some(p.as_path()) != self.current())
            .collect();
        files.sort();
        let excess = if self.s.max_files == 0 {
            0
        } else {
            files.len().saturating_sub(self.s.max_files)
        };
        for (i, (_, path)) in files.iter().enumerate() {
            let too_old = self.s.max_age.is_some_and(|age| {
                fs::metadata(path)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|e| e > age)
            });
            if (i < excess || too_old)
                && let Err(e) = fs::remove_file(path)
            {
                tracing::debug!(error = %e, file = %path.display(), "retention could not delete");
            }
        }
    }
}

/// `goodput-20261202T153000.123Z-<instance>.jsonl`: sorts by time as text.
pub fn file_name(start_ms: i64, instance: &str) -> String {
    format!("goodput-{}-{instance}.jsonl", stamp(start_ms))
}

/// `20261202T153000.123Z`: RFC 3339 without separators, sortable as text.
pub fn stamp(ms: i64) -> String {
    let t = humantime::format_rfc3339_millis(super::format::from_unix_ms(ms)).to_string();
    t.chars().filter(|c| *c != '-' && *c != ':').collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_sort_by_time() {
        let a = file_name(1_767_323_045_678, "gw1");
        assert_eq!(a, "goodput-20260102T030405.678Z-gw1.jsonl");
        let b = file_name(1_767_323_045_679, "gw1");
        let c = file_name(1_767_409_445_000, "gw1");
        assert!(a < b && b < c);
    }
}
