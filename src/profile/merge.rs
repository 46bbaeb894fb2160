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

use std::{collections::HashMap, io::Write};

use super::{
    format::{BlocksLine, Header, from_unix_ms},
    read::{BlockId, Profile},
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
    let start_ms = profile
        .entries
        .first()
        .map_or(first.start_ms, |e| e.at_ms.min(first.start_ms));
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
    let mut ids: HashMap<BlockId, u32> = HashMap::new();
    for (loaded, blocks) in profile.entries.iter().zip(profile.block_identities()) {
        let mut fresh: Vec<(u32, Option<u64>)> = Vec::new();
        let hash_ids: Vec<u32> = blocks
            .iter()
            .map(|b| {
                let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                *ids.entry(*b).or_insert_with(|| {
                    fresh.push((
                        next,
                        match b {
                            BlockId::Key(k) => Some(*k),
                            BlockId::Local(..) => None,
                        },
                    ));
                    next
                })
            })
            .collect();
        if linked {
            write_keys(out, &fresh)?;
        }
        let mut entry = loaded.entry.clone();
        entry.t_ms = loaded.at_ms - start_ms;
        entry.hash_ids = loaded.entry.hash_ids.as_ref().map(|_| hash_ids);
        writeln!(
            out,
            "{}",
            serde_json::to_string(&entry).map_err(std::io::Error::other)?
        )?;
    }
    out.flush()?;
    Ok(MergeStats {
        files: profile.files.len(),
        requests: profile.entries.len(),
        linked,
    })
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
