//! `goodput profile summarize | diff | export | merge | sample | filter`. Command and flag names
//! are a contract with users' scripts (`docs/PROFILE.md`): extend, never rename.
//!
//! Exit codes: 0 success (for `diff`: nothing drifted), 1 `diff` found drift, 2 an error
//! (unreadable file, unknown format version, bad flags). Data goes to stdout (or `-o`),
//! everything else (what the reader skipped, export notes, replay commands) to stderr.

use std::{
    fs::File,
    io::{self, BufWriter, IsTerminal, Write},
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::{Args, Subcommand};

use super::{
    ExportFormat, Shape, Sorted, Summary,
    drift::{Report, Thresholds},
    export_sorted, k_anonymize_sorted, merge_sorted, replay_commands, shape_of_sorted,
};

const EXIT_DRIFT: u8 = 1;
const EXIT_ERROR: u8 = 2;

#[derive(Args, Debug)]
pub struct ProfileArgs {
    #[command(subcommand)]
    pub command: ProfileCommand,
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// Requests, arrival rate and burstiness, mix, length distributions, prefix reuse,
    /// outcomes and SLO attainment of one or more profile files.
    Summarize {
        #[arg(long)]
        json: bool,
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Drift of LIVE from BASE; exit 1 when something drifted.
    Diff {
        #[arg(long)]
        json: bool,
        base: PathBuf,
        live: PathBuf,
        #[command(flatten)]
        opts: DiffOpts,
    },
    /// Convert to a replay tool's trace format, or to Parquet for analysis (stdout or
    /// -o), and print the replay commands.
    Export {
        #[arg(long, value_enum)]
        format: ExportFormat,
        #[arg(long, short, visible_alias = "out", value_name = "OUT")]
        output: Option<PathBuf>,
        /// Print the replay command lines to stdout instead of the data.
        #[arg(long)]
        commands: bool,
        /// Model named in the commands (default: the profile's most frequent model).
        #[arg(long)]
        model: Option<String>,
        /// Endpoint named in the commands.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Tokenizer (HF id or directory) named in the commands.
        #[arg(long, default_value = "TOKENIZER")]
        tokenizer: String,
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Several files (instances) into one profile on one absolute timeline.
    Merge {
        /// Merge files with different salts, keeping their block ids apart.
        #[arg(long)]
        keep_separate: bool,
        #[arg(long, short, visible_alias = "out", value_name = "OUT")]
        output: Option<PathBuf>,
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// The requests matching every condition, as a valid profile (header and the `blocks`
    /// lines the kept requests need): one capture, several scenarios.
    Filter {
        /// Input tokens in MIN..MAX (inclusive; `4096..`, `..2048`).
        #[arg(long, value_name = "RANGE", value_parser = super::filter::Range::parse)]
        input_tokens: Option<super::filter::Range>,
        /// Output tokens in MIN..MAX.
        #[arg(long, value_name = "RANGE", value_parser = super::filter::Range::parse)]
        output_tokens: Option<super::filter::Range>,
        /// Keep this model (repeatable).
        #[arg(long, value_name = "NAME")]
        model: Vec<String>,
        /// Keep this API, as recorded: chat_completions, completions, messages, ...
        /// (repeatable).
        #[arg(long, value_name = "API")]
        api: Vec<String>,
        /// Keep this tenant, the hash as recorded (repeatable).
        #[arg(long, value_name = "HASH")]
        tenant: Vec<String>,
        #[arg(long, short, value_name = "OUT")]
        output: Option<PathBuf>,
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Coarsen lengths and times until each (model, length, time) group has k requests.
    Sample {
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        k: u64,
        /// Largest share of requests dropped rather than coarsening further.
        #[arg(long, default_value_t = 0.01)]
        max_drop: f64,
        #[arg(long, short, visible_alias = "out", value_name = "OUT")]
        output: Option<PathBuf>,
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

/// Thresholds of `diff` (defaults as `[drift.thresholds]`).
#[derive(Args, Debug)]
pub struct DiffOpts {
    /// Requests each side needs before a statistic is judged.
    #[arg(long, default_value_t = 200)]
    pub min_samples: usize,
    #[arg(long, default_value_t = 0.2)]
    pub psi: f64,
    #[arg(long, default_value_t = 0.1)]
    pub ks: f64,
    #[arg(long, default_value_t = 0.1)]
    pub tvd: f64,
    #[arg(long, default_value_t = 2.0)]
    pub rate_ratio: f64,
    #[arg(long, default_value_t = 0.5)]
    pub burstiness_change: f64,
    #[arg(long, default_value_t = 0.2)]
    pub reuse_change: f64,
    #[arg(long, default_value_t = 2.0)]
    pub concurrency_ratio: f64,
}

/// Runs a `goodput profile` command; see the module doc for exit codes.
pub fn run(args: ProfileArgs) -> ExitCode {
    match dispatch(args.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("goodput profile: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The files in arrival order, in bounded memory (every command streams them); what the
/// reader skipped or ignored goes to stderr.
fn read_sorted(files: &[PathBuf]) -> Result<Sorted> {
    let s = Sorted::read(files)?;
    for note in s.profile().notes() {
        eprintln!("note: {note}");
    }
    Ok(s)
}

fn sink(output: Option<&Path>) -> Result<Box<dyn Write + Send>> {
    Ok(match output {
        Some(path) => Box::new(BufWriter::new(File::create(path).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create `{}`: {e}", path.display()))
        })?)),
        None => Box::new(BufWriter::new(io::stdout())),
    })
}

fn dispatch(cmd: ProfileCommand) -> Result<ExitCode> {
    match cmd {
        ProfileCommand::Summarize { json, files } => summarize(json, &files),
        ProfileCommand::Diff {
            json,
            base,
            live,
            opts,
        } => diff(json, &base, &live, &opts),
        ProfileCommand::Export {
            format,
            output,
            commands,
            model,
            url,
            tokenizer,
            files,
        } => {
            let target = ExportTarget {
                format,
                output,
                model,
                url,
                tokenizer,
            };
            export_files(&target, commands, &files)
        }
        ProfileCommand::Merge {
            keep_separate,
            output,
            files,
        } => merge_files(keep_separate, output.as_deref(), &files),
        ProfileCommand::Filter {
            input_tokens,
            output_tokens,
            model,
            api,
            tenant,
            output,
            file,
        } => {
            let filter = super::filter::Filter {
                input_tokens,
                output_tokens,
                models: model,
                apis: api,
                tenants: tenant,
            };
            filter_file(&filter, output.as_deref(), &file)
        }
        ProfileCommand::Sample {
            k,
            max_drop,
            output,
            files,
        } => sample_files(k, max_drop, output.as_deref(), &files),
    }
}

/// `goodput profile summarize`.
fn summarize(json: bool, files: &[PathBuf]) -> Result<ExitCode> {
    let summary = Summary::of_sorted(&read_sorted(files)?)?;
    let mut out = sink(None)?;
    if json {
        serde_json::to_writer_pretty(&mut out, &summary)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", summary.render())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Where and how `goodput profile export` writes, and what its replay commands name.
struct ExportTarget {
    format: ExportFormat,
    output: Option<PathBuf>,
    model: Option<String>,
    url: String,
    tokenizer: String,
}

/// `goodput profile export`: the file (or, with `commands`, only the replay command lines).
fn export_files(t: &ExportTarget, commands: bool, files: &[PathBuf]) -> Result<ExitCode> {
    if t.format == ExportFormat::Parquet
        && t.output.is_none()
        && !commands
        && io::stdout().is_terminal()
    {
        return Err("Parquet is binary: redirect stdout to a file or name one with --out".into());
    }
    let sorted = read_sorted(files)?;
    let model = t
        .model
        .clone()
        .unwrap_or_else(|| top_model(sorted.models()));
    let shown = t.output.as_ref().map_or_else(
        || format!("out.{}", t.format.extension()),
        |p| p.display().to_string(),
    );
    let lines = replay_commands(
        t.format,
        &shown,
        sorted.requests(),
        &model,
        &t.url,
        &t.tokenizer,
    );
    if commands {
        for (_, line) in &lines {
            println!("{line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = sink(t.output.as_deref())?;
    let stats = export_sorted(&sorted, t.format, &mut out)?;
    if t.format == ExportFormat::Parquet {
        eprintln!("exported {} requests", stats.written);
    } else {
        eprintln!(
            "exported {} requests ({} skipped without token counts; hash_ids padded on {}, cut on {})",
            stats.written, stats.skipped, stats.padded, stats.truncated
        );
    }
    print_replay_commands(&lines, t.output.is_none());
    Ok(ExitCode::SUCCESS)
}

/// The replay command lines after an export, on stderr.
fn print_replay_commands<T>(lines: &[(T, String)], to_stdout: bool) {
    if lines.is_empty() {
        return;
    }
    eprintln!(
        "replay with{}:",
        if to_stdout {
            " (out.* = where you redirected stdout)"
        } else {
            ""
        }
    );
    for (_, line) in lines {
        eprintln!("  {line}");
    }
}

/// `goodput profile merge`.
fn merge_files(keep_separate: bool, output: Option<&Path>, files: &[PathBuf]) -> Result<ExitCode> {
    let sorted = read_sorted(files)?;
    let mut out = sink(output)?;
    let stats = merge_sorted(&sorted, keep_separate, &mut out)?;
    eprintln!(
        "merged {} requests from {} files; block ids {}",
        stats.requests,
        stats.files,
        if stats.linked {
            "linked across files (one salt)"
        } else {
            "kept per file (different salts)"
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `goodput profile filter`.
fn filter_file(
    filter: &super::filter::Filter,
    output: Option<&Path>,
    file: &Path,
) -> Result<ExitCode> {
    let input =
        io::BufReader::new(File::open(file).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot open `{}`: {e}", file.display()))
        })?);
    let mut out = sink(output)?;
    let r = filter
        .run(input, &mut out)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    eprintln!(
        "kept {} of {} requests ({} blocks lines)",
        r.kept, r.requests, r.blocks_lines
    );
    Ok(ExitCode::SUCCESS)
}

/// `goodput profile sample`: the k-anonymity guard.
fn sample_files(
    k: u64,
    max_drop: f64,
    output: Option<&Path>,
    files: &[PathBuf],
) -> Result<ExitCode> {
    let sorted = read_sorted(files)?;
    let mut out = sink(output)?;
    let k = usize::try_from(k).unwrap_or(usize::MAX);
    let r = k_anonymize_sorted(&sorted, k, max_drop.clamp(0.0, 1.0), &mut out)?;
    let lengths = match r.length_bucket_factor {
        0.0 => "one bucket".to_owned(),
        f => format!("×{f:.2} per bucket"),
    };
    let times = match r.time_bucket_ms {
        0 => "one bucket".to_owned(),
        ms => humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string(),
    };
    eprintln!(
        "k={}: lengths coarsened to {lengths}, times to {times}; kept {}, dropped {} request(s) in groups smaller than k; hash_ids and tenants removed",
        r.k, r.kept, r.dropped
    );
    Ok(ExitCode::SUCCESS)
}

fn diff(json: bool, base: &Path, live: &Path, o: &DiffOpts) -> Result<ExitCode> {
    let thresholds = Thresholds {
        psi: o.psi,
        ks: o.ks,
        tvd: o.tvd,
        rate_ratio: o.rate_ratio,
        burstiness_change: o.burstiness_change,
        reuse_change: o.reuse_change,
        concurrency_ratio: o.concurrency_ratio,
    };
    if let Some((key, why)) = thresholds.problems().first() {
        return Err(format!("--{}: {why}", key.replace('_', "-")).into());
    }
    let shape =
        |p: &Path| -> Result<Shape> { Ok(shape_of_sorted(&read_sorted(&[p.to_path_buf()])?)?) };
    let report = Report::new(&shape(base)?, &shape(live)?, &thresholds, o.min_samples);
    let mut out = sink(None)?;
    if json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{}: baseline {} requests, live {} requests",
            if report.drifted {
                "DRIFTED"
            } else {
                "no drift"
            },
            report.base_requests,
            report.live_requests
        )?;
        for d in &report.dimensions {
            let mark = if d.drifted {
                "DRIFT"
            } else if d.value.is_none() {
                "  n/a"
            } else {
                "   ok"
            };
            writeln!(
                out,
                "{mark}  {:<14} {:<12} {}",
                d.name, d.statistic, d.explanation
            )?;
        }
    }
    out.flush()?;
    Ok(if report.drifted {
        ExitCode::from(EXIT_DRIFT)
    } else {
        ExitCode::SUCCESS
    })
}

fn top_model(counts: &std::collections::BTreeMap<String, u64>) -> String {
    counts
        .iter()
        .filter(|(m, _)| !m.is_empty())
        .max_by_key(|(_, n)| **n)
        .map_or_else(|| "MODEL".into(), |(m, _)| m.clone())
}
