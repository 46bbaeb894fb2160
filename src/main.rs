//! The `goodput` command line: parse flags, load config, build, run, map errors to exit
//! codes (64 for a bad configuration, 1 for a runtime failure).

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};
use goodput::{
    config::{self, LogFormat, Overrides},
    demo, run, sim, telemetry,
};

/// jemalloc, whose background threads hand the memory freed after a burst back to the
/// system (glibc's malloc keeps it); see docs/PERFORMANCE.md.
#[cfg(all(feature = "jemalloc", target_os = "linux"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit code for a configuration that cannot be used (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "goodput",
    version,
    about = "A streaming-aware proxy that times every token"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy in front of an inference gateway.
    Serve(ServeArgs),
    /// Validate a config file, list every problem, exit non-zero if there is one.
    CheckConfig { file: PathBuf },
    /// Run the built-in OpenAI-compatible upstream simulator.
    Sim(sim::SimArgs),
    /// Simulator + proxy + a light synthetic load, with a live summary line.
    Demo(demo::DemoArgs),
    /// Anonymized traffic profiles: summarize, diff, export, merge, sample.
    Profile(goodput::profile::cli::ProfileArgs),
    /// Replay a profile against a candidate system and write the acceptance report.
    Replay(Box<goodput::replay::ReplayArgs>),
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file; flags below override its values.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address the proxy listens on (default 127.0.0.1:8080).
    #[arg(long)]
    listen: Option<String>,
    /// Upstream gateway URL, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    upstream: Option<String>,
    /// Address of the admin server (default 127.0.0.1:9464).
    #[arg(long)]
    admin: Option<String>,
    /// Bind the proxy and admin addresses with SO_REUSEPORT, so that a new goodput can
    /// start beside this one on the same ports while this one drains (docs/RESTART.md).
    #[arg(long)]
    reuse_port: bool,
    /// Validate this config file and exit instead of serving.
    #[arg(long, value_name = "FILE")]
    check_config: Option<PathBuf>,
}

fn check_config(file: &std::path::Path) -> ExitCode {
    match run::check(file) {
        Ok(cfg) => {
            // Warnings never fail the check: the configuration is usable as written.
            for warning in cfg.warnings() {
                eprintln!("{}: warning: {warning}", file.display());
            }
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn serve(args: ServeArgs) -> ExitCode {
    if let Some(file) = &args.check_config {
        return check_config(file);
    }
    let overrides = Overrides {
        listen: args.listen,
        upstream: args.upstream,
        admin: args.admin,
    };
    let source = args.config.clone().map(|path| run::ConfigSource {
        path,
        overrides: overrides.clone(),
    });
    let cfg = match config::load(args.config.as_deref(), &overrides) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("goodput: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(cfg.log.format, &cfg.log.level);
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("goodput: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        // Before the start-up line: a signal sent once it is logged stops the proxy.
        let stop = run::shutdown_signal();
        let running = match run::start_with(
            cfg,
            source,
            run::BindOptions {
                reuse_port: args.reuse_port,
            },
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        if let Some(reloader) = running.reloader.clone() {
            tokio::spawn(reload_on_sighup(reloader));
        }
        stop.await;
        running.shutdown().await;
        ExitCode::SUCCESS
    })
}

/// SIGHUP re-reads the configuration file.
async fn reload_on_sighup(reloader: std::sync::Arc<run::Reloader>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            let _ = reloader.reload();
        }
    }
    #[cfg(not(unix))]
    drop(reloader);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::CheckConfig { file } => check_config(&file),
        Command::Profile(args) => goodput::profile::cli::run(args),
        Command::Replay(args) => goodput::replay::run(*args),
        Command::Sim(args) => {
            telemetry::init(LogFormat::Text, "info");
            match runtime() {
                Ok(rt) => rt.block_on(async {
                    match sim::run(&args, run::shutdown_signal()).await {
                        Ok(()) => ExitCode::SUCCESS,
                        Err(e) => {
                            eprintln!("goodput sim: {e}");
                            ExitCode::FAILURE
                        }
                    }
                }),
                Err(e) => {
                    eprintln!("goodput: cannot start the runtime: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo(args) => {
            telemetry::init(LogFormat::Text, "warn");
            match runtime() {
                Ok(rt) => rt.block_on(demo::run(args)),
                Err(e) => {
                    eprintln!("goodput: cannot start the runtime: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
