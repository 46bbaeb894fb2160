//! A snapshot of the live window as a profile file, written next to the baseline when
//! drift fires, so the PoC can be re-run on the new shape (`goodput profile export`).
//! Blocking file I/O: call it from `spawn_blocking`.

use std::{
    fs::{self, OpenOptions},
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

use crate::profile::{ProfileLine, format::Header, line::LineEncoder};

/// Writes `lines` (sorted by arrival) under `header` to
/// `dir/goodput-snapshot-<started>.jsonl`, fsynced; returns the path. The header's
/// `started_at` is replaced by the first arrival (by now when the window is empty, as
/// when the system changed with no traffic).
pub fn write_snapshot<'a>(
    dir: &Path,
    header: &Header,
    lines: impl IntoIterator<Item = &'a ProfileLine>,
) -> io::Result<PathBuf> {
    let mut lines: Vec<&ProfileLine> = lines.into_iter().collect();
    lines.sort_by_key(|l| l.arrival_ms);
    let start_ms = lines.first().map_or_else(
        || crate::profile::format::unix_ms(std::time::SystemTime::now()),
        |l| l.arrival_ms,
    );
    let mut header = header.clone();
    header.started_at =
        humantime::format_rfc3339_millis(crate::profile::format::from_unix_ms(start_ms))
            .to_string();
    fs::create_dir_all(dir)?;
    let stamp = crate::profile::writer::stamp(start_ms);
    let mut n = 0u32;
    let (file, path) = loop {
        // A later snapshot of a window that starts at the same request: number it.
        let name = match n {
            0 => format!("goodput-snapshot-{stamp}.jsonl"),
            n => format!("goodput-snapshot-{stamp}.{n}.jsonl"),
        };
        let path = dir.join(name);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => break (f, path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(e),
        }
    };
    let mut out = BufWriter::new(file);
    write_profile(&mut out, &header, lines)?;
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(path)
}

/// Writes a whole profile: `header` (its `started_at` is where `t_ms` counts from), then
/// `lines` in the given order, with their block fingerprints numbered 0.. as a recorded
/// file would have them.
pub fn write_profile<'a>(
    out: &mut dyn Write,
    header: &Header,
    lines: impl IntoIterator<Item = &'a ProfileLine>,
) -> io::Result<()> {
    let start_ms = header.started_ms().unwrap_or(0);
    writeln!(
        out,
        "{}",
        serde_json::to_string(header).map_err(io::Error::other)?
    )?;
    let mut encoder = LineEncoder::new(start_ms);
    let mut text = String::new();
    for line in lines {
        text.clear();
        encoder.encode(line, &mut text).map_err(io::Error::other)?;
        out.write_all(text.as_bytes())?;
    }
    out.flush()
}
