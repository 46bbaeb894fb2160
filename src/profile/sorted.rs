//! Requests of one or more profile files in arrival order, in bounded memory.
//!
//! Files hold requests in the order they *finished*, so reading them in arrival order is
//! an external sort: [`Sorted::read`] scans the files once ([`Profile::scan`]), sorting
//! request lines in runs of at most [`RUN_BYTES`] that it spills to a temporary directory
//! (removed on drop); [`Sorted::for_each`] then k-way merges the runs, parsing one line
//! at a time, as many times as a command needs passes. Memory: one run while reading, one buffered line per run while merging,
//! and the files' block keys. A profile small enough for one run never touches the disk.
//! Ties keep reading order (file, then line), as [`Profile::read`]'s stable sort does,
//! so the order is exactly the in-memory one.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    fs::File,
    io::{BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
};

use super::read::{Line, Loaded, Profile, ReadError, parse_line};

/// Bytes of request lines sorted in memory before a run is spilled: a million-request
/// profile makes about ten runs, and the sort stays far below the 256 MB the profile
/// tools are held to.
pub const RUN_BYTES: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SortError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("temporary sort file: {0}")]
    Spill(#[source] std::io::Error),
    #[error(transparent)]
    Write(std::io::Error),
}

/// Profile files read for streaming in arrival order: their headers, keys and notes,
/// a few figures gathered on the way, and the sorted runs.
pub struct Sorted {
    profile: Profile,
    runs: Runs,
    earliest: Option<i64>,
    requests: usize,
    models: BTreeMap<String, u64>,
    generation: Span,
}

/// First and last arrival (Unix ms) and count of some requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub first: i64,
    pub last: i64,
    pub count: usize,
}

impl Span {
    fn add(&mut self, at_ms: i64) {
        if self.count == 0 {
            (self.first, self.last) = (at_ms, at_ms);
        } else {
            self.first = self.first.min(at_ms);
            self.last = self.last.max(at_ms);
        }
        self.count += 1;
    }
}

impl Sorted {
    pub fn read(paths: &[PathBuf]) -> Result<Sorted, SortError> {
        Sorted::read_in_runs(paths, RUN_BYTES)
    }

    pub(super) fn read_in_runs(paths: &[PathBuf], run_bytes: usize) -> Result<Sorted, SortError> {
        let mut runs = Runs::new(run_bytes).map_err(SortError::Spill)?;
        let mut failed: Option<std::io::Error> = None;
        let mut earliest: Option<i64> = None;
        let mut requests = 0;
        let mut models = BTreeMap::new();
        let mut generation = Span::default();
        let profile = Profile::scan(paths, &mut |_, loaded, text| {
            if crate::decode::is_generation_label(&loaded.entry.api) {
                generation.add(loaded.at_ms);
            }
            earliest = Some(earliest.map_or(loaded.at_ms, |e| e.min(loaded.at_ms)));
            requests += 1;
            *models
                .entry(loaded.entry.model.clone().unwrap_or_default())
                .or_insert(0u64) += 1;
            if failed.is_none()
                && let Err(e) = runs.push(loaded.at_ms, loaded.file, text)
            {
                failed = Some(e);
            }
        })?;
        if let Some(e) = failed {
            return Err(SortError::Spill(e));
        }
        runs.finish().map_err(SortError::Spill)?;
        Ok(Sorted {
            profile,
            runs,
            earliest,
            requests,
            models,
            generation,
        })
    }

    /// The files (headers, keys, reports); its `entries` are empty.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The first arrival (Unix ms), if any request.
    pub fn earliest(&self) -> Option<i64> {
        self.earliest
    }

    /// How many requests.
    pub fn requests(&self) -> usize {
        self.requests
    }

    /// The arrivals of generation requests (those shapes are made of).
    pub fn generation(&self) -> Span {
        self.generation
    }

    /// Requests per model (`""` for none).
    pub fn models(&self) -> &BTreeMap<String, u64> {
        &self.models
    }

    /// Hands every request to `each` in arrival order, with the files. May be called
    /// again (each call reads the runs anew).
    pub fn for_each<E: From<SortError>>(
        &self,
        each: &mut dyn FnMut(&Profile, Loaded) -> Result<(), E>,
    ) -> Result<(), E> {
        let profile = &self.profile;
        self.runs.drain(|file, text| {
            let Ok(Line::Entry(entry)) = parse_line(text) else {
                return Ok(());
            };
            let at_ms = profile.files[file].start_ms.saturating_add(entry.t_ms);
            each(
                profile,
                Loaded {
                    file,
                    at_ms,
                    entry: *entry,
                },
            )
        })
    }
}

/// Request lines sorted by arrival in runs spilled to a temporary directory (removed on
/// drop), then merged back in order. Ties keep reading order (file, then line), as a
/// stable sort of everything would.
struct Runs {
    dir: PathBuf,
    run_bytes: usize,
    pending: Vec<(i64, usize, Box<[u8]>)>,
    pending_bytes: usize,
    files: Vec<PathBuf>,
}

impl Runs {
    fn new(run_bytes: usize) -> std::io::Result<Runs> {
        // Unique within the process (sorts may run side by side, as tests do) and across
        // processes; a directory left by a killed process with the same id is skipped.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("goodput-sort-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        };
        Ok(Runs {
            dir,
            run_bytes,
            pending: Vec::new(),
            pending_bytes: 0,
            files: Vec::new(),
        })
    }

    fn push(&mut self, at_ms: i64, file: usize, text: &[u8]) -> std::io::Result<()> {
        self.pending_bytes += text.len() + 32;
        self.pending.push((at_ms, file, text.into()));
        if self.pending_bytes >= self.run_bytes {
            self.spill()?;
        }
        Ok(())
    }

    /// Writes the pending lines, sorted, as one run: `at_ms file line` per line.
    fn spill(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pending.sort_by_key(|(at, ..)| *at);
        let path = self.dir.join(format!("run-{}", self.files.len()));
        let mut w = BufWriter::new(File::create(&path)?);
        for (at, file, text) in self.pending.drain(..) {
            write!(w, "{at} {file} ")?;
            w.write_all(&text)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
        self.files.push(path);
        self.pending_bytes = 0;
        self.pending.shrink_to(0);
        Ok(())
    }

    /// Sorts what is pending: in memory when nothing was spilled (a profile that fits in
    /// one run never touches the disk), else as the last run.
    fn finish(&mut self) -> std::io::Result<()> {
        if self.files.is_empty() {
            self.pending.sort_by_key(|(at, ..)| *at);
            Ok(())
        } else {
            self.spill()
        }
    }

    /// Hands every line to `each` in arrival order (after [`Runs::finish`]).
    fn drain<E: From<SortError>>(
        &self,
        mut each: impl FnMut(usize, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let spill = |e| E::from(SortError::Spill(e));
        if self.files.is_empty() {
            for (_, file, text) in &self.pending {
                each(*file, text)?;
            }
            return Ok(());
        }
        let mut readers: Vec<RunReader> = Vec::with_capacity(self.files.len());
        let mut heap = BinaryHeap::new();
        for (i, path) in self.files.iter().enumerate() {
            let mut r = RunReader::open(path).map_err(spill)?;
            if let Some(at) = r.advance().map_err(spill)? {
                heap.push(Reverse((at, i)));
            }
            readers.push(r);
        }
        while let Some(Reverse((_, i))) = heap.pop() {
            let r = &mut readers[i];
            each(r.file, r.text())?;
            if let Some(at) = r.advance().map_err(spill)? {
                heap.push(Reverse((at, i)));
            }
        }
        Ok(())
    }
}

impl Drop for Runs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The current line of one run.
struct RunReader {
    reader: BufReader<File>,
    line: Vec<u8>,
    file: usize,
    text_at: usize,
}

impl RunReader {
    fn open(path: &Path) -> std::io::Result<RunReader> {
        Ok(RunReader {
            reader: BufReader::with_capacity(1 << 16, File::open(path)?),
            line: Vec::new(),
            file: 0,
            text_at: 0,
        })
    }

    /// Reads the next line; its arrival, or `None` at the end of the run.
    fn advance(&mut self) -> std::io::Result<Option<i64>> {
        self.line.clear();
        if self.reader.read_until(b'\n', &mut self.line)? == 0 {
            return Ok(None);
        }
        let bad = || std::io::Error::other("malformed run line");
        let mut parts = self.line.splitn(3, |b| *b == b' ');
        let number = |what: Option<&[u8]>| {
            std::str::from_utf8(what.ok_or_else(bad)?)
                .map_err(|_| bad())?
                .parse::<i64>()
                .map_err(|_| bad())
        };
        let at = number(parts.next())?;
        let file = usize::try_from(number(parts.next())?).map_err(|_| bad())?;
        let rest = parts.next().ok_or_else(bad)?;
        self.text_at = self.line.len() - rest.len();
        self.file = file;
        Ok(Some(at))
    }

    fn text(&self) -> &[u8] {
        self.line[self.text_at..].trim_ascii()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::profile::format::Entry;

    const HEADER: &str = r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"00","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#;

    /// A file of `n` requests written in the order they finished (long ones late), with
    /// `blocks` lines; arrivals `offset_ms` apart from the header's start.
    fn file(n: i64, offset_ms: i64, seed: u64) -> String {
        let mut lines: Vec<(f64, String)> = Vec::new();
        let mut text = format!("{HEADER}\n");
        let mut next_id = 0u32;
        let mut keyed = Vec::new();
        for i in 0..n {
            let t = offset_ms + i * 7;
            let e2e = ((i as u64 * 2_654_435_761 + seed) % 5_000) as f64 + 0.3;
            // Block 0 is shared by everyone (same key in every file); one fresh per request.
            let ids = if i == 0 { vec![0, 1] } else { vec![0, next_id] };
            if i == 0 {
                keyed.push((0u32, 0xabcu64));
                next_id = 1;
            }
            keyed.push((next_id, seed << 32 | i as u64));
            next_id += 1;
            let line = format!(
                r#"{{"t_ms":{t},"model":"m{}","api":"chat_completions","stream":true,"input_tokens":{},"output_tokens":{},"outcome":"ok","slo_class":"default","slo_met":true,"ttft_ms":12.3,"e2e_ms":{e2e},"hash_ids":{ids:?},"later":1}}"#,
                i % 3,
                100 + i,
                i % 50
            );
            lines.push((t as f64 + e2e, line));
        }
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Keys go before the request that first uses them; the writer emits them once.
        let mut given = std::collections::HashSet::new();
        for (_, line) in lines {
            let e: Entry = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}"));
            for id in e.hash_ids.unwrap_or_default() {
                if given.insert(id) {
                    let key = keyed.iter().find(|(k, _)| *k == id).map_or(0, |(_, v)| *v);
                    text.push_str(&format!(
                        "{{\"type\":\"blocks\",\"first_id\":{id},\"keys\":[\"{key:016x}\"]}}\n"
                    ));
                }
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    }

    /// Three files in finish order (the first two interleaved in time, one salt) in a
    /// fresh directory named after `test`.
    pub(crate) fn finish_ordered_files(test: &str) -> (PathBuf, Vec<PathBuf>) {
        let dir = std::env::temp_dir().join(format!("goodput-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths = [(300, 0, 1), (250, 3, 2), (5, 100_000, 3)]
            .iter()
            .enumerate()
            .map(|(i, (n, off, seed))| {
                let p = dir.join(format!("f{i}.jsonl"));
                std::fs::write(&p, file(*n, *off, *seed)).unwrap();
                p
            })
            .collect();
        (dir, paths)
    }

    #[test]
    fn requests_come_out_as_the_in_memory_sort_orders_them() {
        let (dir, paths) = finish_ordered_files("sorted");
        let exact = Profile::read(&paths).unwrap();
        for run_bytes in [RUN_BYTES, 4096, 1] {
            let sorted = Sorted::read_in_runs(&paths, run_bytes).unwrap();
            assert_eq!(sorted.requests(), exact.entries.len());
            assert_eq!(sorted.earliest(), exact.entries.first().map(|e| e.at_ms));
            let mut got = Vec::new();
            sorted
                .for_each(&mut |_, l| {
                    got.push((l.file, l.at_ms, l.entry));
                    Ok::<_, SortError>(())
                })
                .unwrap();
            let want: Vec<_> = exact
                .entries
                .iter()
                .map(|l| (l.file, l.at_ms, l.entry.clone()))
                .collect();
            assert!(got == want, "run_bytes {run_bytes}");
        }
        // The runs' directory is gone once the sort is done with.
        let sorted = Sorted::read_in_runs(&paths, 1).unwrap();
        let runs = sorted.runs.dir.clone();
        assert!(runs.exists());
        sorted.for_each(&mut |_, _| Ok::<_, SortError>(())).unwrap();
        assert!(runs.exists(), "kept for another pass");
        drop(sorted);
        assert!(!runs.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
