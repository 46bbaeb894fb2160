//! Reading profile files back: every command and the drift baseline go through
//! [`Profile::read`].
//!
//! A file must start with a header of a known major version (anything else is refused
//! with an error naming the file). After that the reader is forgiving, and says what it
//! forgave in [`FileReport`]: a last line without its newline that does not parse is a
//! *torn* line (a crash mid-write) and is skipped; other lines that do not parse are
//! skipped and counted; unknown fields are ignored and listed.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fmt,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::Value;

use super::{
    format::{BlocksLine, Contract, Entry, FORMAT, Header, VERSION},
    table::IdTable,
};

/// A profile file could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read `{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not a goodput profile: {reason}")]
    NotAProfile { path: String, reason: String },
    #[error(
        "`{path}` is profile format version {version}; this goodput reads version {VERSION} only (upgrade goodput to read it)"
    )]
    UnsupportedVersion { path: String, version: u32 },
}

/// What the reader skipped or ignored in one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileReport {
    pub torn_last_line: bool,
    /// Lines (1-based) that did not parse, torn line excluded.
    pub invalid_lines: Vec<usize>,
    pub unknown_fields: BTreeSet<String>,
}

/// One file of a profile.
#[derive(Debug, Clone)]
pub struct ProfileFile {
    pub path: PathBuf,
    pub header: Header,
    /// `header.started_at` as Unix ms.
    pub start_ms: i64,
    pub report: FileReport,
    /// Key (64-bit keyed hash) of each `hash_ids` id of this file, where known.
    pub keys: IdTable<u64>,
}

/// One request of a profile, with its file and absolute arrival time.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub file: usize,
    /// Arrival, Unix ms (`start_ms + t_ms`).
    pub at_ms: i64,
    pub entry: Entry,
}

/// One or more profile files read together; entries sorted by arrival.
#[derive(Clone, Default)]
pub struct Profile {
    pub files: Vec<ProfileFile>,
    pub entries: Vec<Loaded>,
    /// Files left out because a crash left them without a complete header (empty, or a
    /// torn first line), with why.
    pub skipped_files: Vec<(PathBuf, String)>,
    /// [`Profile::shared_keys`], once asked for.
    shared: OnceLock<HashSet<u64>>,
}

impl Profile {
    /// Reads and merges `paths`, sorting requests by absolute arrival time.
    pub fn read(paths: &[PathBuf]) -> Result<Profile, ReadError> {
        let mut profile = Profile::default();
        for path in paths {
            let file = std::fs::File::open(path).map_err(|source| ReadError::Io {
                path: path.display().to_string(),
                source,
            })?;
            profile.add(path, BufReader::new(file))?;
        }
        profile.entries.sort_by_key(|e| e.at_ms);
        Ok(profile)
    }

    /// Reads one file's text from `reader`, named `path` in errors.
    pub fn add(&mut self, path: &Path, reader: impl BufRead) -> Result<(), ReadError> {
        self.shared = OnceLock::new();
        let entries = &mut self.entries;
        if let Some(file) = read_file(
            path,
            reader,
            self.files.len(),
            &mut self.skipped_files,
            &mut |_, loaded, _| entries.push(loaded),
        )? {
            self.files.push(file);
        }
        Ok(())
    }

    /// Reads `paths` without keeping their requests: each is handed to `each` as it is
    /// read (in file order, not sorted), with its file as known so far (the `keys` of the
    /// ids it uses are already there) and its line's text. The profile returned has the
    /// files and notes, and no `entries`; memory stays bounded by the block keys.
    pub fn scan(paths: &[PathBuf], each: &mut RequestSink<'_>) -> Result<Profile, ReadError> {
        let mut profile = Profile::default();
        for path in paths {
            let file = std::fs::File::open(path).map_err(|source| ReadError::Io {
                path: path.display().to_string(),
                source,
            })?;
            if let Some(file) = read_file(
                path,
                BufReader::with_capacity(1 << 16, file),
                profile.files.len(),
                &mut profile.skipped_files,
                each,
            )? {
                profile.files.push(file);
            }
        }
        Ok(profile)
    }

    /// The salt id shared by every file, or `None` when they differ.
    pub fn common_salt_id(&self) -> Option<&str> {
        let first = self.files.first()?.header.salt_id.as_str();
        self.files
            .iter()
            .all(|f| f.header.salt_id == first)
            .then_some(first)
    }

    /// Global block identities per entry (same order as `entries`): with one salt, the
    /// key behind each id (so equal blocks in different files match); otherwise, or where
    /// a key is missing, an identity private to the file.
    pub fn block_identities(&self) -> Vec<Vec<BlockId>> {
        let linked = self.common_salt_id().is_some();
        self.entries
            .iter()
            .map(|l| self.identities_of(l, linked))
            .collect()
    }

    /// The block identities of one request (see [`Profile::block_identities`]);
    /// `linked`: the files share one salt.
    pub fn identities_of(&self, l: &Loaded, linked: bool) -> Vec<BlockId> {
        let file = &self.files[l.file];
        l.entry
            .hash_ids
            .iter()
            .flatten()
            .map(|id| match file.keys.get(*id) {
                Some(key) if linked => BlockId::Key(key),
                _ => BlockId::Local(l.file, *id),
            })
            .collect()
    }

    /// Identities equal where [`Profile::identities_of`]'s are, for tables of millions
    /// of blocks: a block is named by its key only when the key stands behind more than
    /// one id ([`Profile::shared_keys`]); otherwise its file and id name it just as well,
    /// and fit in compact per-file tables ([`BlockMap`](super::BlockMap)).
    pub fn compact_identities_of(&self, l: &Loaded, linked: bool) -> Vec<BlockId> {
        let file = &self.files[l.file];
        let shared = linked.then(|| self.shared_keys());
        l.entry
            .hash_ids
            .iter()
            .flatten()
            .map(|id| match (file.keys.get(*id), shared) {
                (Some(key), Some(shared)) if shared.contains(&key) => BlockId::Key(key),
                _ => BlockId::Local(l.file, *id),
            })
            .collect()
    }

    /// The keys that stand behind more than one id: in several files (the prefixes
    /// their traffic shared) or, rarely, twice in one. Found once, in two passes over the
    /// keys without a copy of them: a Bloom filter marks the candidates (every repeat,
    /// and about 1% of the rest), whose occurrences are then counted exactly.
    pub fn shared_keys(&self) -> &HashSet<u64> {
        self.shared.get_or_init(|| {
            let keys = || self.files.iter().flat_map(|f| f.keys.values());
            let mut filter = Bloom::with_capacity(keys().count());
            let mut counts: HashMap<u64, u32> = HashMap::new();
            for k in keys() {
                if !filter.insert(k) {
                    counts.insert(k, 0);
                }
            }
            for k in keys() {
                if let Some(n) = counts.get_mut(&k) {
                    *n += 1;
                }
            }
            counts
                .into_iter()
                .filter(|(_, n)| *n > 1)
                .map(|(k, _)| k)
                .collect()
        })
    }

    /// Human-readable notes on what was skipped or ignored, one per line.
    pub fn notes(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .skipped_files
            .iter()
            .map(|(p, why)| format!("{}: skipped: {why}", p.display()))
            .collect();
        for f in &self.files {
            let p = f.path.display();
            if f.report.torn_last_line {
                out.push(format!(
                    "{p}: skipped a torn last line (the writer stopped mid-line)"
                ));
            }
            if !f.report.invalid_lines.is_empty() {
                out.push(format!(
                    "{p}: skipped {} line(s) that did not parse (first: line {})",
                    f.report.invalid_lines.len(),
                    f.report.invalid_lines[0]
                ));
            }
            if !f.report.unknown_fields.is_empty() {
                let names: Vec<&str> = f.report.unknown_fields.iter().map(String::as_str).collect();
                out.push(format!("{p}: ignored unknown fields: {}", names.join(", ")));
            }
        }
        out
    }
}

impl fmt::Debug for Profile {
    // A baseline holds thousands of requests: say which files, not every line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field(
                "files",
                &self.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
            )
            .field("requests", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// A Bloom filter of 64-bit keys: 10 bits and 7 probes a key, about 1% false positives.
struct Bloom {
    bits: Vec<u64>,
}

impl Bloom {
    fn with_capacity(n: usize) -> Bloom {
        Bloom {
            bits: vec![0; (n.max(64) * 10).div_ceil(64)],
        }
    }

    /// Adds `key`; `false` when it was (probably) there already.
    fn insert(&mut self, key: u64) -> bool {
        let m = self.bits.len() as u64 * 64;
        // Double hashing from the key's two halves, spread first (keys are hashes, but
        // a hand-made file's need not be).
        let mut h = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
        let (a, b) = (h, h.rotate_left(32) | 1);
        let mut fresh = false;
        for i in 0..7u64 {
            let bit = a.wrapping_add(i.wrapping_mul(b)) % m;
            let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
            fresh |= self.bits[word] & mask == 0;
            self.bits[word] |= mask;
        }
        fresh
    }
}

/// A block identity across files; see [`Profile::block_identities`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockId {
    Key(u64),
    Local(usize, u32),
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockId::Key(k) => write!(f, "{k:016x}"),
            BlockId::Local(file, id) => write!(f, "{file}:{id}"),
        }
    }
}

/// What [`Profile::scan`] hands each request to: its file (so far), the request, and the
/// text of its line.
pub type RequestSink<'a> = dyn FnMut(&ProfileFile, Loaded, &[u8]) + 'a;

/// Reads one file, handing each request to `each`; `None` when the file is skipped (no
/// complete header), with why in `skipped`.
fn read_file(
    path: &Path,
    mut reader: impl BufRead,
    index: usize,
    skipped: &mut Vec<(PathBuf, String)>,
    each: &mut RequestSink<'_>,
) -> Result<Option<ProfileFile>, ReadError> {
    let shown = || path.display().to_string();
    let io = |source| ReadError::Io {
        path: shown(),
        source,
    };
    let mut buf = Vec::new();
    if reader.read_until(b'\n', &mut buf).map_err(io)? == 0 {
        skipped.push((path.to_path_buf(), "empty (created, never written)".into()));
        return Ok(None);
    }
    let (header, unknown_contract) = match parse_header(&buf) {
        Ok(h) => h,
        // A first line cut short by a crash: the file never got going.
        Err(_) if !buf.ends_with(b"\n") && buf.starts_with(b"{\"type\":\"header\"") => {
            skipped.push((
                path.to_path_buf(),
                "torn header (the writer stopped mid-line)".into(),
            ));
            return Ok(None);
        }
        Err(reason) => {
            return Err(ReadError::NotAProfile {
                path: shown(),
                reason,
            });
        }
    };
    if header.version != VERSION {
        return Err(ReadError::UnsupportedVersion {
            path: shown(),
            version: header.version,
        });
    }
    let start_ms = header.started_ms().ok_or_else(|| ReadError::NotAProfile {
        path: shown(),
        reason: format!("`started_at` {:?} is not RFC 3339", header.started_at),
    })?;
    let mut file = ProfileFile {
        path: path.to_path_buf(),
        report: FileReport {
            unknown_fields: header
                .extra
                .keys()
                .map(|k| format!("header.{k}"))
                .chain(
                    unknown_contract
                        .iter()
                        .map(|k| format!("header.contract.{k}")),
                )
                .collect(),
            ..Default::default()
        },
        header,
        start_ms,
        keys: IdTable::new(u64::MAX),
    };
    let mut line_no = 1;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf).map_err(io)? == 0 {
            break;
        }
        line_no += 1;
        let complete = buf.ends_with(b"\n");
        let text = buf.trim_ascii();
        if text.is_empty() {
            continue;
        }
        match parse_line(text) {
            Ok(Line::Entry(entry)) => {
                file.report
                    .unknown_fields
                    .extend(entry.extra.keys().cloned());
                let loaded = Loaded {
                    file: index,
                    at_ms: start_ms.saturating_add(entry.t_ms),
                    entry: *entry,
                };
                each(&file, loaded, text);
            }
            Ok(Line::Blocks(b)) => {
                for (i, key) in b.keys.iter().enumerate() {
                    if let (Ok(key), Ok(i)) = (u64::from_str_radix(key, 16), u32::try_from(i)) {
                        file.keys.insert(b.first_id.saturating_add(i), key);
                    }
                }
            }
            Ok(Line::Other(kind)) => {
                file.report.unknown_fields.insert(format!("type={kind}"));
            }
            Err(()) if !complete => file.report.torn_last_line = true,
            Err(()) => file.report.invalid_lines.push(line_no),
        }
    }
    Ok(Some(file))
}

/// The header, and the contract keys it had that this build does not know.
fn parse_header(line: &[u8]) -> Result<(Header, Vec<String>), String> {
    let value: Value = serde_json::from_slice(line.trim_ascii())
        .map_err(|e| format!("the first line is not JSON ({e})"))?;
    if value.get("type").and_then(Value::as_str) != Some("header")
        || value.get("format").and_then(Value::as_str) != Some(FORMAT)
    {
        return Err(format!(
            "the first line is not a `{FORMAT}` header (`\"type\":\"header\"`)"
        ));
    }
    // Check the version before the rest, so a future layout is refused by version.
    if let Some(v) = value.get("version").and_then(Value::as_u64)
        && v != u64::from(VERSION)
    {
        return Ok((
            Header {
                version: u32::try_from(v).unwrap_or(u32::MAX),
                ..serde_json::from_value(value.clone()).unwrap_or_else(|_| placeholder_header())
            },
            Vec::new(),
        ));
    }
    let mut value = value;
    let unknown = set_aside_unknown_contract_keys(&mut value);
    let header = serde_json::from_value(value).map_err(|e| format!("bad header: {e}"))?;
    Ok((header, unknown))
}

/// Removes the header contract's keys this build does not know (a newer writer's, or one
/// written by hand) so that the file still reads; the caller lists them as unknown fields
/// like any other. `[profile.contract]` in the configuration stays strict.
fn set_aside_unknown_contract_keys(header: &mut Value) -> Vec<String> {
    let Some(contract) = header.get_mut("contract").and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    let known = serde_json::to_value(Contract {
        model_revision: Some(String::new()),
        engine: Some(String::new()),
        engine_version: Some(String::new()),
        hardware: Some(String::new()),
        precision: Some(String::new()),
        notes: Some(String::new()),
    })
    .unwrap_or_default();
    let unknown: Vec<String> = contract
        .keys()
        .filter(|k| known.get(k.as_str()).is_none())
        .cloned()
        .collect();
    for k in &unknown {
        contract.remove(k);
    }
    unknown
}

fn placeholder_header() -> Header {
    Header::new(
        std::time::SystemTime::UNIX_EPOCH,
        "",
        super::format::Block {
            unit: super::format::BlockUnit::Bytes,
            size: 0,
        },
        &Default::default(),
    )
}

pub(super) enum Line {
    Entry(Box<Entry>),
    Blocks(BlocksLine),
    Other(String),
}

pub(super) fn parse_line(text: &[u8]) -> Result<Line, ()> {
    let value: Value = serde_json::from_slice(text).map_err(|_| ())?;
    match value.get("type").and_then(Value::as_str) {
        None => serde_json::from_value(value)
            .map(|e| Line::Entry(Box::new(e)))
            .map_err(|_| ()),
        Some("blocks") => serde_json::from_value(value)
            .map(Line::Blocks)
            .map_err(|_| ()),
        Some(other) => Ok(Line::Other(other.to_owned())),
    }
}

#[cfg(test)]
mod tests;
