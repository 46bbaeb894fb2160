//! `goodput profile export`: a profile in the trace formats replay tools read, and the
//! command lines that replay it.
//!
//! - **Mooncake JSONL** (`mooncake`): `{"timestamp": ms from the first request,
//!   "input_length", "output_length", "hash_ids"}`, sorted by timestamp, with
//!   `len(hash_ids) == ceil(input_length / 512)` exactly: the recorded blocks are renumbered
//!   0.. in order of first appearance (blocks shared across files only when the files share
//!   a salt), cut to that length when there are more, and padded with fresh ids (never
//!   seen elsewhere, i.e. no reuse) when there are fewer. `output_length` is the recorded
//!   output tokens, or the request's `max_tokens` when none were produced (a failed
//!   request). Requests without input tokens or any output figure are skipped (counted).
//! - **Azure LLM inference trace CSV** (`azure-csv`): `TIMESTAMP,ContextTokens,GeneratedTokens`
//!   with `TIMESTAMP` as `YYYY-MM-DD HH:MM:SS.fffffff` (UTC).
//! - **BurstGPT CSV** (`burstgpt-csv`): `Timestamp,Model,Request tokens,Response tokens,
//!   Total tokens,Log Type`, `Timestamp` in seconds from the first request, `Log Type`
//!   `API log`.
//!
//! - **Parquet** (`parquet`): every request, all its fields, one row each in arrival order
//!   (see `columnar`).
//!
//! [`export_sorted`] streams the rows as requests come off the external sort by arrival
//! ([`Sorted`]), so an export holds no more than the id map, whatever the input size.

use std::io::Write;

use serde::Serialize;

use parquet::errors::ParquetError;

use super::{
    columnar::ParquetExport,
    format::{MOONCAKE_BLOCK_TOKENS, from_unix_ms},
    read::{BlockId, Loaded, Profile},
    sorted::{SortError, Sorted},
    table::BlockMap,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Mooncake,
    AzureCsv,
    BurstgptCsv,
    Parquet,
}

impl ExportFormat {
    /// The usual file extension.
    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::Mooncake => "jsonl",
            ExportFormat::AzureCsv | ExportFormat::BurstgptCsv => "csv",
            ExportFormat::Parquet => "parquet",
        }
    }
}

/// An export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Sort(#[from] SortError),
    #[error("writing Parquet: {0}")]
    Parquet(#[from] ParquetError),
}

/// What an export wrote and adjusted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExportStats {
    pub written: usize,
    /// Requests without input tokens or any output figure.
    pub skipped: usize,
    /// Mooncake rows whose hash_ids were padded with fresh ids / cut to length.
    pub padded: usize,
    pub truncated: usize,
}

#[derive(Serialize)]
struct MooncakeRow {
    timestamp: i64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// Writes `profile` in `format` to `out`.
pub fn export(
    profile: &Profile,
    format: ExportFormat,
    out: &mut (dyn Write + Send),
) -> std::io::Result<ExportStats> {
    let first = profile.entries.first().map_or(0, |e| e.at_ms);
    let Some(text) = Text::of(format) else {
        let mut parquet = || -> Result<ExportStats, ParquetError> {
            let mut x = ParquetExport::start(&mut *out, &profile.files, first)?;
            for (loaded, blocks) in profile.entries.iter().zip(profile.block_identities()) {
                x.push(loaded.clone(), &blocks)?;
            }
            let (written, _, _) = x.finish()?;
            Ok(ExportStats {
                written,
                ..ExportStats::default()
            })
        };
        return parquet().map_err(std::io::Error::other);
    };
    let mut x = Exporter::start(text, first, out)?;
    for (loaded, blocks) in profile.entries.iter().zip(profile.block_identities()) {
        x.row(loaded, &blocks, out)?;
    }
    out.flush()?;
    Ok(x.stats)
}

/// Writes `sorted`'s requests in `format` to `out` as they come off the sort, in bounded
/// memory (the Mooncake id map holds one entry per distinct block); the same output as
/// [`export`].
pub fn export_sorted(
    sorted: &Sorted,
    format: ExportFormat,
    out: &mut (dyn Write + Send),
) -> Result<ExportStats, ExportError> {
    let linked = sorted.profile().common_salt_id().is_some();
    let first = sorted.earliest().unwrap_or(0);
    let Some(text) = Text::of(format) else {
        let mut x = ParquetExport::start(&mut *out, &sorted.profile().files, first)?;
        sorted.for_each(&mut |profile, loaded| {
            let blocks = profile.compact_identities_of(&loaded, linked);
            x.push(loaded, &blocks).map_err(ExportError::from)
        })?;
        let (written, _, _) = x.finish()?;
        return Ok(ExportStats {
            written,
            ..ExportStats::default()
        });
    };
    let mut x = Exporter::start(text, first, out).map_err(SortError::Write)?;
    sorted.for_each(&mut |profile, loaded| {
        let blocks = profile.compact_identities_of(&loaded, linked);
        x.row(&loaded, &blocks, out).map_err(SortError::Write)
    })?;
    out.flush().map_err(SortError::Write)?;
    Ok(x.stats)
}

/// The formats written line by line.
#[derive(Clone, Copy)]
enum Text {
    Mooncake,
    AzureCsv,
    BurstgptCsv,
}

impl Text {
    fn of(format: ExportFormat) -> Option<Text> {
        match format {
            ExportFormat::Mooncake => Some(Text::Mooncake),
            ExportFormat::AzureCsv => Some(Text::AzureCsv),
            ExportFormat::BurstgptCsv => Some(Text::BurstgptCsv),
            ExportFormat::Parquet => None,
        }
    }
}

/// A text export under way: the first arrival, the Mooncake ids handed out, the counts.
struct Exporter {
    format: Text,
    first: i64,
    ids: BlockMap<u64>,
    next_id: u64,
    stats: ExportStats,
}

impl Exporter {
    /// Writes the CSV header line, if any.
    fn start(format: Text, first: i64, out: &mut dyn Write) -> std::io::Result<Self> {
        match format {
            Text::Mooncake => {}
            Text::AzureCsv => writeln!(out, "TIMESTAMP,ContextTokens,GeneratedTokens")?,
            Text::BurstgptCsv => writeln!(
                out,
                "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
            )?,
        }
        Ok(Exporter {
            format,
            first,
            ids: BlockMap::new(u64::MAX),
            next_id: 0,
            stats: ExportStats::default(),
        })
    }

    /// One request, in arrival order, with its block identities.
    fn row(
        &mut self,
        loaded: &Loaded,
        blocks: &[BlockId],
        out: &mut dyn Write,
    ) -> std::io::Result<()> {
        let e = &loaded.entry;
        let output = e.output_tokens.filter(|n| *n > 0).or(e.max_tokens);
        let (Some(input), Some(output)) = (e.input_tokens.filter(|n| *n > 0), output) else {
            self.stats.skipped += 1;
            return Ok(());
        };
        let offset_ms = loaded.at_ms - self.first;
        match self.format {
            Text::Mooncake => {
                let want =
                    usize::try_from(input.div_ceil(MOONCAKE_BLOCK_TOKENS)).unwrap_or(usize::MAX);
                let next_id = &mut self.next_id;
                let ids = &mut self.ids;
                let mut hash_ids: Vec<u64> = blocks
                    .iter()
                    .take(want)
                    .map(|b| {
                        ids.get_or_insert_with(*b, || {
                            *next_id += 1;
                            *next_id - 1
                        })
                    })
                    .collect();
                if blocks.len() > want {
                    self.stats.truncated += 1;
                } else if hash_ids.len() < want {
                    self.stats.padded += 1;
                    while hash_ids.len() < want {
                        hash_ids.push(*next_id);
                        *next_id += 1;
                    }
                }
                let row = MooncakeRow {
                    timestamp: offset_ms,
                    input_length: input,
                    output_length: output,
                    hash_ids,
                };
                serde_json::to_writer(&mut *out, &row)?;
                writeln!(out)?;
            }
            Text::AzureCsv => {
                writeln!(out, "{},{input},{output}", azure_time(loaded.at_ms))?;
            }
            Text::BurstgptCsv => {
                let model = csv_field(e.model.as_deref().unwrap_or("unknown"));
                let secs = offset_ms as f64 / 1000.0;
                writeln!(
                    out,
                    "{secs:.3},{model},{input},{output},{},API log",
                    input + output
                )?;
            }
        }
        self.stats.written += 1;
        Ok(())
    }
}

/// `2023-11-16 18:15:46.6805900`, the Azure trace's timestamp form.
fn azure_time(ms: i64) -> String {
    let t = humantime::format_rfc3339_nanos(from_unix_ms(ms)).to_string();
    // 2023-11-16T18:15:46.680000000Z → date, time, 7 fractional digits.
    let t = t.trim_end_matches('Z').replacen('T', " ", 1);
    match t.split_once('.') {
        Some((head, frac)) => format!("{head}.{:0<7}", &frac[..frac.len().min(7)]),
        None => format!("{t}.0000000"),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The tools whose replay command lines `export` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    Aiperf,
    Guidellm,
    Vllm,
}

/// Command lines replaying an export file. Versions targeted: AIPerf ≥ 0.3 (mooncake_trace
/// and burst_gpt_trace loaders), GuideLLM with the `replay` profile and `kind=mooncake`
/// data (docs/guides/trace_replay.md, 2026), `vllm bench serve` with the `timed_trace`
/// dataset (vLLM PR #39795, 2026), which passes pre-tokenized prompts and so needs a
/// completions backend: `--backend openai --endpoint /v1/completions` (vLLM 0.32 refuses
/// `openai-chat` for it).
pub fn replay_commands(
    format: ExportFormat,
    file: &str,
    requests: usize,
    model: &str,
    url: &str,
    tokenizer: &str,
) -> Vec<(ReplayTarget, String)> {
    let q = |s: &str| shell_quote(s);
    match format {
        ExportFormat::Mooncake => vec![
            (
                ReplayTarget::Aiperf,
                format!(
                    "aiperf profile --model {} --url {} --endpoint-type chat --streaming --input-file {} --custom-dataset-type mooncake_trace --fixed-schedule --tokenizer {}",
                    q(model),
                    q(url),
                    q(file),
                    q(tokenizer)
                ),
            ),
            (
                ReplayTarget::Guidellm,
                format!(
                    "guidellm run --backend kind=openai_http,target={} --profile kind=replay --data {}",
                    q(url),
                    q(&format!(
                        "kind=mooncake,source.kind=json_file,source.path={file},time_scale=0.001"
                    ))
                ),
            ),
            (
                ReplayTarget::Vllm,
                format!(
                    "vllm bench serve --backend openai --endpoint /v1/completions --base-url {} --model {} --tokenizer {} --dataset-name timed_trace --dataset-path {} --timed-trace-chunk-hash-size {MOONCAKE_BLOCK_TOKENS} --timed-trace-sec-multiplier 0.001 --num-prompts {requests}",
                    q(url),
                    q(model),
                    q(tokenizer),
                    q(file)
                ),
            ),
        ],
        ExportFormat::BurstgptCsv => vec![(
            ReplayTarget::Aiperf,
            format!(
                "aiperf profile --model {} --url {} --endpoint-type chat --streaming --input-file {} --custom-dataset-type burst_gpt_trace --fixed-schedule --tokenizer {}",
                q(model),
                q(url),
                q(file),
                q(tokenizer)
            ),
        )],
        ExportFormat::AzureCsv | ExportFormat::Parquet => Vec::new(),
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::sorted::tests::finish_ordered_files;

    #[test]
    fn the_streaming_export_writes_what_the_in_memory_one_does() {
        let (dir, paths) = finish_ordered_files("export");
        let profile = Profile::read(&paths).unwrap();
        for format in [
            ExportFormat::Mooncake,
            ExportFormat::AzureCsv,
            ExportFormat::BurstgptCsv,
        ] {
            let mut exact = Vec::new();
            let want = export(&profile, format, &mut exact).unwrap();
            let mut streamed = Vec::new();
            let sorted = Sorted::read_in_runs(&paths, 4096).unwrap();
            let got = export_sorted(&sorted, format, &mut streamed).unwrap();
            assert_eq!(got, want);
            assert!(streamed == exact, "{format:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn azure_timestamps_and_csv_fields() {
        assert_eq!(azure_time(1_700_136_946_680), "2023-11-16 12:15:46.6800000");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("out.jsonl"), "out.jsonl");
    }

    #[test]
    fn commands_name_the_file_and_block_size() {
        let c = replay_commands(
            ExportFormat::Mooncake,
            "out.jsonl",
            7,
            "m",
            "http://127.0.0.1:8080",
            "tok",
        );
        assert_eq!(c.len(), 3);
        assert!(
            c[0].1
                .contains("--custom-dataset-type mooncake_trace --fixed-schedule")
        );
        assert!(c[1].1.contains("kind=mooncake") && c[1].1.contains("time_scale=0.001"));
        assert!(
            c[2].1.contains("--timed-trace-chunk-hash-size 512")
                && c[2].1.contains("--num-prompts 7")
        );
    }
}
