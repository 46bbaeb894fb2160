//! The load benchmark: direct to the simulator vs through nginx vs through goodput, in one
//! run, paths alternating round by round.
//!
//! ```sh
//! cargo bench --bench load -- --quick    # every scenario briefly (about three minutes)
//! cargo bench --bench load               # 5 rounds (about 8 minutes)
//! ```
//!
//! Flags: `--quick`, `--rounds N`, `--only latency,throughput,requests,memory,shadow,streams-10k`,
//! `--no-usage`
//! (clients do not ask for `include_usage`, so goodput counts tokens itself),
//! `--out FILE` (default `target/goodput-bench/load.json`), `--goodput PATH` (measure
//! another build of goodput, e.g. to compare two commits on the same machine),
//! `--plain-hyper` (measure a plain hyper proxy that measures nothing in goodput's place:
//! what the engine alone costs; `plain.rs`), `--goodput-config FILE` (TOML appended to the
//! generated configuration, e.g. a `[measure]` section to measure a setting's cost).
//!
//! The simulator runs in this process on its own runtime (threads `sim`); the load client
//! is hyper on a multi-thread runtime (threads `client`); nginx (`nginx-light`, installed
//! when missing) and `goodput serve` (the release build of this package, default
//! configuration: full measurement) are child processes on 127.0.0.1, so their CPU and
//! memory can be read from `/proc/PID`; the `requests` scenario adds Debian's HAProxy
//! (`haproxy`, installed when missing). `streams-10k` raises the open-file limit first
//! (the children inherit it). Every child is killed on exit, panic or Ctrl-C.
//! See docs/PERFORMANCE.md for the method and the latest results.

mod client;
mod latency;
mod memory;
mod paths;
mod plain;
mod procs;
mod report;
mod requests;
mod shadow;
mod stats;
mod streams;
mod syscalls;
mod throughput;

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result, bail};

use crate::paths::Env;
use crate::report::Results;

struct Args {
    quick: bool,
    rounds: Option<usize>,
    usage: bool,
    only: Vec<String>,
    out: PathBuf,
    /// The goodput binary to measure; `None`: the one this benchmark was built with.
    goodput: Option<PathBuf>,
    /// Measure the plain hyper proxy (`plain.rs`) in goodput's place.
    plain: bool,
    /// TOML appended to goodput's generated configuration.
    goodput_config: Option<String>,
}

const USAGE: &str = "usage: cargo bench --bench load -- [--quick] [--rounds N] \
                     [--only latency,throughput,requests,memory,shadow,streams-10k] [--no-usage] \
                     [--out FILE] \
                     [--goodput PATH | --plain-hyper] [--goodput-config FILE]";

fn parse_args() -> Result<Option<Args>> {
    let mut args = Args {
        quick: false,
        rounds: None,
        usage: true,
        only: Vec::new(),
        out: target_dir().join("goodput-bench").join("load.json"),
        goodput: None,
        plain: false,
        goodput_config: None,
    };
    // `cargo bench` passes `--bench`; without it (or `--run`) this binary was started by
    // something else (`cargo test --benches`) and must not start a benchmark.
    let mut run = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" | "--run" => run = true,
            "--quick" => args.quick = true,
            "--no-usage" => args.usage = false,
            "--rounds" => {
                let n = it.next().context("--rounds needs a number")?;
                args.rounds = Some(n.parse().context("--rounds needs a number")?);
            }
            "--only" => {
                let list = it.next().context("--only needs a list")?;
                args.only = list.split(',').map(str::to_owned).collect();
            }
            "--out" => args.out = PathBuf::from(it.next().context("--out needs a file")?),
            "--goodput" => {
                args.goodput = Some(PathBuf::from(it.next().context("--goodput needs a path")?));
            }
            "--plain-hyper" => args.plain = true,
            "--goodput-config" => {
                let file = it.next().context("--goodput-config needs a file")?;
                let toml = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read --goodput-config {file}"))?;
                args.goodput_config = Some(toml);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if args.plain && args.goodput.is_some() {
        bail!("--goodput and --plain-hyper both name what to measure; give one\n{USAGE}");
    }
    if !run {
        println!("load: not started by `cargo bench`; nothing to do. {USAGE}");
        return Ok(None);
    }
    Ok(Some(args))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn main() -> ExitCode {
    // `load plain-proxy --config FILE`: this executable as the plain hyper proxy, started
    // by the benchmark itself (`--plain-hyper`).
    let argv: Vec<String> = std::env::args().collect();
    if let [_, mode, flag, config] = argv.as_slice()
        && mode == "plain-proxy"
        && flag == "--config"
    {
        return match plain::main(std::path::Path::new(config)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("plain proxy: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e:#}");
            return ExitCode::from(2);
        }
    };
    let _cleanup = procs::Cleanup;
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let wants = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    // Before any child starts, so that they inherit it.
    let streams = wants(streams::NAME).then(streams::raise_file_limit);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let sim_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("sim")
        .enable_all()
        .build()?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("client")
        .enable_all()
        .build()?;
    let dir = std::env::temp_dir().join(format!("goodput-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let env = Env {
        quick: args.quick,
        rounds: args.rounds.unwrap_or(if args.quick { 1 } else { 5 }).max(1),
        usage: args.usage,
        goodput_bin: snapshot_binary(&dir, args.goodput.as_deref(), args.plain)?,
        plain: args.plain,
        goodput_config: args.goodput_config.clone().unwrap_or_default(),
        nginx_bin: procs::find_nginx(),
        haproxy_bin: (args.only.is_empty() || args.only.iter().any(|o| o == "requests"))
            .then(procs::find_haproxy)
            .flatten(),
        dir: dir.clone(),
        sim_rt: sim_rt.handle().clone(),
    };
    let result = client_rt.block_on(async {
        tokio::spawn(async {
            stop_signal().await;
            eprintln!("load: interrupted; stopping the proxies");
            procs::kill_all();
            std::process::exit(130);
        });
        scenarios(&env, &args, streams).await
    });
    client_rt.shutdown_background();
    sim_rt.shutdown_background();
    let results = result?;
    let (table, json) = report::render(&env, &results);
    println!("{table}");
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&json)?)?;
    println!("written: {}", args.out.display());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A private copy of the binary to measure on goodput's path (`--goodput`, this executable
/// for `--plain-hyper`, or the `goodput` this benchmark was built with): a concurrent
/// `cargo build` replacing it mid-run then changes nothing here.
fn snapshot_binary(
    dir: &std::path::Path,
    given: Option<&std::path::Path>,
    plain: bool,
) -> Result<PathBuf> {
    let built = match given {
        Some(path) => path.to_path_buf(),
        None if plain => std::env::current_exe().context("cannot find this executable")?,
        None => PathBuf::from(env!("CARGO_BIN_EXE_goodput")),
    };
    let copy = dir.join("goodput");
    std::fs::copy(&built, &copy).with_context(|| format!("cannot copy {}", built.display()))?;
    Ok(copy)
}

async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => None } } => {}
    }
}

async fn scenarios(env: &Env, args: &Args, streams: Option<usize>) -> Result<Results> {
    let wants = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let mut results = Results {
        load_before: report::loadavg(),
        ..Results::default()
    };
    eprintln!(
        "load: {} mode, {} round(s); load average {}",
        if env.quick { "quick" } else { "full" },
        env.rounds,
        results.load_before
    );
    if wants("latency") {
        let (sim, addr) = env.start_sim(latency::sim_config())?;
        for concurrency in [1, 64] {
            eprintln!("load: latency, {concurrency} stream(s)");
            results
                .latency
                .push(latency::run(env, &sim, addr, concurrency).await?);
        }
    }
    if wants("throughput") {
        let (_sim, addr) = env.start_sim(throughput::sim_config())?;
        eprintln!("load: throughput, {} streams", throughput::STREAMS);
        results.throughput = Some(throughput::run(env, addr).await?);
    }
    if wants("requests") {
        let (_sim, addr) = env.start_sim(requests::sim_config())?;
        eprintln!(
            "load: requests, {:?} clients, short requests back to back",
            requests::levels(env.quick)
        );
        results.requests = Some(requests::run(env, addr).await?);
    }
    if wants("memory") {
        let (_sim, addr) = env.start_sim(memory::sim_config())?;
        eprintln!("load: memory, {} idle streams", memory::STREAMS);
        results.memory = Some(memory::run(env, addr).await?);
    }
    if wants("shadow") {
        eprintln!(
            "load: shadow, {} streams, goodput with and without a shadow",
            shadow::STREAMS
        );
        results.shadow = Some(shadow::run(env).await?);
    }
    if let Some(n) = streams.filter(|n| *n > 0) {
        results.streams = Some(streams::run(env, n).await?);
    }
    results.load_after = report::loadavg();
    Ok(results)
}
