//! Anonymized traffic profiles: recording the shape of real traffic (arrivals, lengths,
//! mix, prefix reuse, outcomes, latencies) without its content, reading it back, comparing
//! it with a baseline (live drift detection and `goodput profile diff`), and exporting it
//! for replay tools. The format is specified in `docs/PROFILE.md`.
//!
//! Recording sits beside the aggregator: for each finished request the aggregator builds
//! a [`ProfileLine`] (with the [`Anonymizer`]'s tenant id and block fingerprints) and
//! hands it to [`ProfileRecorder::record`], which never blocks; a writer thread does all
//! file I/O. The same lines feed [`drift::Monitor`].
//!
//! # Layout
//! - `format`: the file format: [`Header`], [`Entry`], the `blocks` line, [`Contract`].
//! - `hash`: [`Anonymizer`], chained keyed block fingerprints, salt ids, prompt text.
//! - `line`: [`ProfileLine`], one request on its way to a file or the drift window.
//! - `recorder`: [`ProfileRecorder`], the bounded queue and writer thread.
//! - `writer`: files, rotation, retention, fsync, per-file id remap, disk errors.
//! - `read`: [`Profile`], reading files back (torn lines, unknown fields, versions).
//! - `table`: compact per-file tables keyed by block id (keys, ids handed out, seen).
//! - `sorted`: [`Sorted`], requests in arrival order by an external sort, in bounded memory.
//! - `stats`: percentiles, CV, PSI, KS, TVD and their noise floors.
//! - `shape`: [`Shape`], the distributions a profile or a live window is described by.
//! - [`drift`]: thresholds, comparison, the live [`drift::Monitor`], webhook, snapshots.
//! - `summary`: `goodput profile summarize`.
//! - `export`: Mooncake JSONL, Azure and BurstGPT CSV, and the replay command lines.
//! - `columnar`: the Parquet export, one row group at a time.
//! - `merge`: several files (instances) into one, streamed from [`Sorted`].
//! - `sample`: the k-anonymity guard.
//! - [`cli`]: the `goodput profile` commands.

pub mod cli;
mod columnar;
pub mod drift;
mod export;
pub mod filter;
mod format;
mod hash;
pub(crate) mod line;
mod merge;
mod metrics;
mod read;
mod recorder;
mod sample;
mod shape;
mod sorted;
mod stats;
mod summary;
mod table;
pub mod writer;

pub use export::{ExportError, ExportFormat, ReplayTarget, export, export_sorted, replay_commands};
pub use format::{
    Anonymized, Block, BlockUnit, BlocksLine, Contract, Entry, FORMAT, Header,
    MOONCAKE_BLOCK_TOKENS, VERSION, from_unix_ms, unix_ms,
};
pub use hash::{Anonymizer, block_hashes, prompt_bytes, salt_id, token_block_hashes};
pub use line::ProfileLine;
pub use merge::{MergeError, MergeStats, merge, merge_sorted};
pub use metrics::ProfileMetrics;
pub use read::{BlockId, FileReport, Loaded, Profile, ProfileFile, ReadError, RequestSink};
pub use recorder::{Clock, DropReason, ProfileRecorder, StartError};
pub use sample::{SampleReport, k_anonymize, k_anonymize_sorted};
pub use shape::{Sample, Shape, sample_of, samples_of, shape_of_sorted};
pub use sorted::{RUN_BYTES, SortError, Sorted, Span};
pub use summary::Summary;
pub use table::{BlockMap, BlockSet, IdTable};
