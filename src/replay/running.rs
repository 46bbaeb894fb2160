//! Running the load: its watchers (engine metrics, GPU and node exporters, the fault
//! command, the target's identity at every step boundary), the reproducibility record
//! read before it, and `--mode limits`' probes.

use std::{
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::{Instant, SystemTime},
};

use super::{
    Prepared, ReplayArgs, ReplayError, attribution, describe, gpu, host, limits, plan, recovery,
    session,
};
use super::{client::Client, load::Runner, prompt::Prompts};

/// What the load left besides the runner's requests: the steps, the engine's and the
/// GPUs' metrics, and the fault.
pub(super) struct Ran {
    pub(super) driven: session::Driven,
    pub(super) scrapes: Option<attribution::Scrapes>,
    pub(super) telemetry: Option<gpu::Telemetry>,
    pub(super) hosts: Option<gpu::Telemetry<host::HostReading>>,
    pub(super) fault: Option<recovery::FaultRun>,
    /// What the target said about itself during the load, every `--step-duration`.
    pub(super) identities: Vec<describe::IdentityRead>,
    pub(super) started_at: SystemTime,
    pub(super) t0: Instant,
}

/// Runs the load with its watchers (engine metrics, GPU exporters, the fault command)
/// until it is done or `shutdown` resolves.
pub(super) async fn run_load(
    runner: &Runner,
    args: &ReplayArgs,
    p: &Prepared,
    fetcher: &crate::fetch::Fetcher,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Ran {
    let abort = runner.abort_handle();
    let watcher = tokio::spawn(async move {
        shutdown.await;
        abort.abort();
    });
    let started_at = SystemTime::now();
    let t0: Instant = runner.started();
    let fault = match (&args.fault_cmd, args.fault_at) {
        (Some(cmd), Some(at)) => {
            let log = args.out.join(recovery::LOG_FILE);
            Some((
                recovery::Fault::schedule(cmd, at, t0, log, runner.abort_signal()),
                cmd,
                at,
            ))
        }
        _ => None,
    };
    let watch = p
        .scraper
        .clone()
        .map(|s| attribution::Watch::start(s, args.engine_metrics_interval, t0));
    let gpus = (!args.gpu_metrics.is_empty())
        .then(|| gpu::GpuWatch::start(args.gpu_metrics.clone(), fetcher.clone(), t0));
    let hosts = (!args.node_metrics.is_empty()).then(|| {
        gpu::GpuWatch::start_with(args.node_metrics.clone(), fetcher.clone(), t0, host::parse)
    });
    // The target's identity, read at every step boundary (each --step-duration) while
    // the load runs: a swap that is rolled back before the end is still seen.
    let reads: Arc<std::sync::Mutex<Vec<describe::IdentityRead>>> = Arc::default();
    let reading = {
        let (f, models, origin) = (fetcher.clone(), p.target.models_url(), p.target.origin());
        let every = args.step_duration.max(std::time::Duration::from_secs(1));
        let reads = reads.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            // Bounded: a day of 10 s steps.
            for _ in 0..10_000 {
                ticks.tick().await;
                let says = describe::ask_target(&f, &models, &origin).await;
                reads
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(describe::IdentityRead {
                        at_s: t0.elapsed().as_secs_f64(),
                        identity: says.identity(),
                    });
            }
        })
    };
    let ticker = runner.progress().start();
    let driven = session::drive(runner, args, &p.workload).await;
    drop(ticker);
    reading.abort();
    let identities = std::mem::take(
        &mut *reads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let scrapes = match watch {
        Some(w) => Some(w.finish().await),
        None => None,
    };
    let telemetry = match gpus {
        Some(g) => Some(g.finish().await),
        None => None,
    };
    let hosts = match hosts {
        Some(h) => Some(h.finish().await),
        None => None,
    };
    let fault = match fault {
        Some((f, cmd, at)) => Some(f.finish(cmd, at).await),
        None => None,
    };
    watcher.abort();
    Ran {
        driven,
        scrapes,
        telemetry,
        hosts,
        fault,
        identities,
        started_at,
        t0,
    }
}

/// What the run is reproduced from: the command line, digests of its files, what the
/// target says about itself and `--describe-cmd`'s output.
pub(super) async fn reproducibility(
    args: &ReplayArgs,
    p: &Prepared,
    fetcher: &crate::fetch::Fetcher,
) -> Result<describe::Reproducibility, ReplayError> {
    let command: Vec<String> = if args.command_line.is_empty() {
        std::env::args().collect()
    } else {
        args.command_line.clone()
    };
    let digest = |path: &std::path::Path| {
        describe::sha256_files(&[path]).map_err(|source| ReplayError::Digest {
            path: path.display().to_string(),
            source,
        })
    };
    let profiles: Vec<&std::path::Path> = args.profile.iter().map(PathBuf::as_path).collect();
    let profile_sha256 =
        describe::sha256_files(&profiles).map_err(|source| ReplayError::Digest {
            path: args
                .profile
                .first()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            source,
        })?;
    let target = describe::ask_target(fetcher, &p.target.models_url(), &p.target.origin()).await;
    let described = match &args.describe_cmd {
        Some(cmd) => Some(describe::describe(cmd, &args.out, &p.secrets).await),
        None => None,
    };
    Ok(describe::Reproducibility {
        command: describe::command_line(&command, &p.secrets),
        goodput_version: env!("CARGO_PKG_VERSION").into(),
        config_sha256: args.config.as_deref().map(digest).transpose()?,
        profile_sha256,
        probes_sha256: args.probes.as_deref().map(digest).transpose()?,
        target,
        target_at_end: None,
        target_changes_during: Vec::new(),
        describe: described,
    })
}

/// `--mode limits`' probes: single requests of the profile's first API and model, before
/// any load.
pub(super) async fn find_limits_of(args: &ReplayArgs, p: &Prepared) -> limits::LimitsOut {
    let client = Client::new(p.target.clone(), 1, args.idle_timeout)
        .with_tenant_header(p.config.slo.tenant_header.clone());
    let prompts = Prompts::new(
        args.seed,
        p.workload.block_bytes,
        args.ignore_eos,
        p.tokenizer.clone(),
    );
    let first = p.workload.templates.first();
    let prober = limits::Prober {
        client: &client,
        prompts: &prompts,
        model: first.and_then(|t| t.model.as_deref()),
        api: first.map_or(plan::ReplayApi::Chat, |t| t.api),
        // The client's --idle-timeout bounds every wait for a byte; this bounds a whole
        // probe (the output probe streams a long answer).
        timeout: std::time::Duration::from_secs(600),
    };
    prober.find(p.prompt_lengths()).await
}
