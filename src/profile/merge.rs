//! `goodput profile merge`: profiles from many proxy instances (or many rotated files)
//! into one, on one absolute timeline.
//!
//! Arrival times are aligned on absolute time (each file's `started_at` + `t_ms`), and
//! the merged file starts at the earliest request. Block ids are renumbered: when every
//! file has the same `salt_id`, equal blocks from different files get the same id (their
//! keys, from the `blocks` lines, match), so cross-instance prefix reuse is kept. Files
//! with different salts cannot be linked: merge refuses them, unless asked to keep their
//! blocks separate (then no id is shared across files and the header's `salt_id` is
//! `mixed`).
//!
//! [`merge_sorted`] merges in bounded memory whatever the input size: it writes each
//! request as it comes off the external sort by arrival ([`Sorted`]), keeping only the
//! block-id maps (one entry per distinct prompt block). [`merge`] does the same from a
//! [`Profile`] already in memory.

use std::io::Write;

use super::{
    format::{BlocksLine, Entry, Header, from_unix_ms},
    read::{Loaded, Profile},
    sorted::{SortError, Sorted},
    table::BlockMap,
};

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(
        "the files were recorded with different salts ({0}): their hash_ids cannot be linked; pass --keep-separate to merge them with unlinked block ids"
    )]
    MixedSalts(String),
    #[error("nothing to merge")]
    Empty,
    #[error(transparent)]
    Sort(#[from] SortError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What a merge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeStats {
    pub files: usize,
    pub requests: usize,
    /// Block ids were linked across files (one salt).
    pub linked: bool,
}

/// Writes the merge of `profile`'s files to `out`.
pub fn merge(
    profile: &Profile,
    keep_separate: bool,
    out: &mut dyn Write,
) -> Result<MergeStats, MergeError> {
    let earliest = profile.entries.first().map(|e| e.at_ms);
    let mut w = Merged::start(profile, earliest, keep_separate, out)?;
    for loaded in &profile.entries {
        w.write(profile, loaded, out)?;
    }
    out.flush()?;
    Ok(w.stats(profile))
}

/// Writes the merge of `sorted`'s files to `out`, in bounded memory (see the module doc).
pub fn merge_sorted(
    sorted: &Sorted,
    keep_separate: bool,
    out: &mut dyn Write,
) -> Result<MergeStats, MergeError> {
    let mut w = Merged::start(sorted.profile(), sorted.earliest(), keep_separate, out)?;
    sorted
        .for_each(&mut |profile, loaded| w.write(profile, &loaded, out).map_err(MergeError::Io))?;
    out.flush()?;
    Ok(w.stats(sorted.profile()))
}

/// The merged file as it is written: its start and the block ids handed out so far.
struct Merged {
    start_ms: i64,
    linked: bool,
    ids: BlockMap<u32>,
    next_id: u32,
    requests: usize,
}

impl Merged {
    /// Checks the salts and writes the header; `earliest` is the first arrival.
    fn start(
        profile: &Profile,
        earliest: Option<i64>,
        keep_separate: bool,
        out: &mut dyn Write,
    ) -> Result<Merged, MergeError> {
        let first = profile.files.first().ok_or(MergeError::Empty)?;
        let linked = profile.common_salt_id().is_some();
        if !linked && !keep_separate {
            let mut salts: Vec<&str> = profile
                .files
                .iter()
                .map(|f| f.header.salt_id.as_str())
                .collect();
            salts.sort_unstable();
            salts.dedup();
            return Err(MergeError::MixedSalts(salts.join(", ")));
        }
        let start_ms = earliest.map_or(first.start_ms, |at| at.min(first.start_ms));
        let mut header: Header = first.header.clone();
        header.started_at = humantime::format_rfc3339_millis(from_unix_ms(start_ms)).to_string();
        header.goodput_version = env!("CARGO_PKG_VERSION").into();
        if !linked {
            header.salt_id = "mixed".into();
        }
        if profile
            .files
            .iter()
            .any(|f| f.header.contract != first.header.contract)
        {
            header.contract.notes = Some(format!(
                "merged from {} files whose test contracts differ; this is the first file's",
                profile.files.len()
            ));
        }
        writeln!(
            out,
            "{}",
            serde_json::to_string(&header).map_err(std::io::Error::other)?
        )?;
        Ok(Merged {
            start_ms,
            linked,
            ids: BlockMap::new(u32::MAX),
            next_id: 0,
            requests: 0,
        })
    }

    /// Writes one request (in arrival order), preceded by the keys of ids new to it.
    fn write(
        &mut self,
        profile: &Profile,
        loaded: &Loaded,
        out: &mut dyn Write,
    ) -> std::io::Result<()> {
        let file = &profile.files[loaded.file];
        let mut fresh: Vec<(u32, Option<u64>)> = Vec::new();
        let linked = self.linked;
        let blocks = profile.compact_identities_of(loaded, linked);
        let (ids, next_id) = (&mut self.ids, &mut self.next_id);
        let hash_ids: Option<Vec<u32>> = loaded.entry.hash_ids.as_ref().map(|raw| {
            raw.iter()
                .zip(&blocks)
                .map(|(id, b)| {
                    ids.get_or_insert_with(*b, || {
                        let next = *next_id;
                        *next_id = next_id.saturating_add(1);
                        fresh.push((next, file.keys.get(*id).filter(|_| linked)));
                        next
                    })
                })
                .collect()
        });
        if self.linked {
            write_keys(out, &fresh)?;
        }
        let entry = Entry {
            t_ms: loaded.at_ms - self.start_ms,
            hash_ids,
            ..loaded.entry.clone()
        };
        self.requests += 1;
        writeln!(
            out,
            "{}",
            serde_json::to_string(&entry).map_err(std::io::Error::other)?
        )
    }

    fn stats(&self, profile: &Profile) -> MergeStats {
        MergeStats {
            files: profile.files.len(),
            requests: self.requests,
            linked: self.linked,
        }
    }
}

/// `blocks` lines for each run of consecutive new ids that have keys.
fn write_keys(out: &mut dyn Write, fresh: &[(u32, Option<u64>)]) -> std::io::Result<()> {
    let mut run: Option<BlocksLine> = None;
    for (id, key) in fresh {
        match (key, run.as_mut()) {
            (Some(k), Some(r)) if r.first_id as usize + r.keys.len() == *id as usize => {
                r.keys.push(format!("{k:016x}"));
            }
            (Some(k), _) => {
                flush_run(out, run.take())?;
                run = Some(BlocksLine {
                    kind: "blocks".into(),
                    first_id: *id,
                    keys: vec![format!("{k:016x}")],
                });
            }
            (None, _) => flush_run(out, run.take())?,
        }
    }
    flush_run(out, run)
}

fn flush_run(out: &mut dyn Write, run: Option<BlocksLine>) -> std::io::Result<()> {
    if let Some(r) = run {
        writeln!(
            out,
            "{}",
            serde_json::to_string(&r).map_err(std::io::Error::other)?
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::sorted::tests::finish_ordered_files;

    #[test]
    fn the_streaming_merge_writes_what_the_in_memory_one_does() {
        let (dir, paths) = finish_ordered_files("merge");
        let mut exact = Vec::new();
        let want = merge(&Profile::read(&paths).unwrap(), false, &mut exact).unwrap();
        // Tiny runs: dozens of spilled runs merged back.
        for run_bytes in [1 << 30, 4096, 1] {
            let input = Sorted::read_in_runs(&paths, run_bytes).unwrap();
            assert!(input.profile().notes()[0].contains("later"));
            let mut streamed = Vec::new();
            let got = merge_sorted(&input, false, &mut streamed).unwrap();
            assert_eq!(got, want);
            assert_eq!(
                String::from_utf8(streamed).unwrap(),
                String::from_utf8(exact.clone()).unwrap(),
                "run_bytes {run_bytes}"
            );
        }
        assert_eq!(want.requests, 555);
        // The sorted output is in arrival order, and the temporary runs are gone.
        let merged = dir.join("merged.jsonl");
        std::fs::write(&merged, &exact).unwrap();
        let back = Profile::read(std::slice::from_ref(&merged)).unwrap();
        assert!(back.entries.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_and_mixed_inputs_are_refused_as_before() {
        let input = Sorted::read(&[]).unwrap();
        assert!(matches!(
            merge_sorted(&input, false, &mut Vec::new()),
            Err(MergeError::Empty)
        ));
    }
}
