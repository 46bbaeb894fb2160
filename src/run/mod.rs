//! Wiring: one registry, one recorder channel, the aggregator, the proxy and the admin
//! server, started on given listeners and stopped gracefully. Integration tests use
//! [`start`] with `127.0.0.1:0` addresses exactly as `goodput serve` does. [`reload`]
//! re-reads the configuration file and swaps what can change live.

mod metrics;
mod reload;
mod resources;

pub use metrics::{Metrics, ReloadMetrics};
pub use reload::{ConfigSource, ReloadError, Reloader};
pub use resources::{Resources, check};

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{
    admin::{self, Admin},
    calibrate::{CalibrationView, Calibrator, ProxyTotals},
    config::Config,
    measure::{MeasureLayer, Recorder, Settings},
    profile::drift::IdentityWatch,
    proxy::{self, FileBudget, Forward, Proxy},
    shadow::{Book, Shadow, ShadowMetrics, Stage as ShadowStage},
    stats::{Aggregator, AggregatorMetrics, DriftView, InferenceMetrics, Live, Profiling, Recent},
    tokenize::{Stage, Tokenizers},
};

/// How long to wait, after the last connection closed, for the last records to be
/// aggregated (tunnels still open at exit may hold their record back).
const FLUSH_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Otlp(#[from] crate::otlp::OtlpError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// A running proxy with its admin server.
pub struct Running {
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub recent: Arc<Recent>,
    /// Present when the configuration came from a file.
    pub reloader: Option<Arc<Reloader>>,
    /// The windowed SLO, goodput, cost and capacity view.
    pub live: Live,
    /// The latest self-calibration status, with the attribution of where time goes.
    pub calibration: CalibrationView,
    /// The shadow's counters (as on `/metrics`), still readable once the proxy stopped:
    /// what its shutdown dropped is counted by then.
    pub shadow: ShadowMetrics,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    /// Starts draining; returns when everything has stopped and records are flushed.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// Signals shutdown without waiting.
    pub fn begin_shutdown(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until the server stopped.
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// How the listeners are bound.
#[derive(Debug, Clone, Copy, Default)]
pub struct BindOptions {
    /// `SO_REUSEPORT` on the proxy and admin listeners (`serve --reuse-port`): a new
    /// process can bind the same addresses while the old one drains (docs/RESTART.md).
    pub reuse_port: bool,
}

/// The accept backlog: what `TcpListener::bind` uses (and the usual `somaxconn`).
const BACKLOG: u32 = 1024;

fn bind(
    what: &'static str,
    addr: SocketAddr,
    options: BindOptions,
) -> Result<TcpListener, StartError> {
    let err = |source| StartError::Bind { what, addr, source };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(err)?;
    // As `TcpListener::bind` does: a restarted process can bind while old connections
    // linger in TIME_WAIT.
    socket.set_reuseaddr(true).map_err(err)?;
    #[cfg(unix)]
    if options.reuse_port {
        socket.set_reuseport(true).map_err(err)?;
    }
    socket.bind(addr).map_err(err)?;
    socket.listen(BACKLOG).map_err(err)
}

/// Whether the kernel hands a closing listener's queued connections to the other
/// listeners of its `SO_REUSEPORT` group (Linux 5.14+, `net.ipv4.tcp_migrate_req`).
/// `None` where that cannot be read (other systems, older kernels).
pub fn tcp_migrate_req() -> Option<bool> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req")
        .ok()
        .map(|v| v.trim() != "0")
}

/// How often the config file's modification time is checked for changes.
const RELOAD_POLL: Duration = Duration::from_secs(2);

/// Binds the configured addresses and starts serving.
pub async fn start(cfg: Config) -> Result<Running, StartError> {
    start_from(cfg, None).await
}

/// As [`start`]; with a source, the configuration can be reloaded (and the file is watched).
pub async fn start_from(cfg: Config, source: Option<ConfigSource>) -> Result<Running, StartError> {
    start_with(cfg, source, BindOptions::default()).await
}

/// As [`start_from`], binding the listeners with `options`.
pub async fn start_with(
    cfg: Config,
    source: Option<ConfigSource>,
    options: BindOptions,
) -> Result<Running, StartError> {
    let listener = bind("proxy", cfg.server.listen, options)?;
    let admin = bind("admin", cfg.admin, options)?;
    if options.reuse_port && tcp_migrate_req() != Some(true) {
        tracing::warn!(
            "--reuse-port without net.ipv4.tcp_migrate_req = 1: connections the kernel has \
             queued on this process's listeners when it stops are reset instead of handed to \
             the new process (docs/RESTART.md)"
        );
    }
    start_on_from(cfg, listener, admin, source)
}

/// Starts serving on already-bound listeners.
pub fn start_on(
    cfg: Config,
    listener: TcpListener,
    admin_listener: TcpListener,
) -> Result<Running, StartError> {
    start_on_from(cfg, listener, admin_listener, None)
}

fn start_on_from(
    cfg: Config,
    listener: TcpListener,
    admin_listener: TcpListener,
    source: Option<ConfigSource>,
) -> Result<Running, StartError> {
    let proxy_addr = local_addr("proxy", &listener, cfg.server.listen)?;
    let admin_addr = local_addr("admin", &admin_listener, cfg.admin)?;
    let resources = Resources::load(&cfg)?;
    let mut registry = Registry::default();
    let histograms = metrics::histogram_options(&cfg);
    let metrics = Metrics::register(&mut registry, &histograms);
    let files = FileBudget::raise_open_files_limit();
    let division = files.divide(
        cfg.server.limits.max_connections,
        cfg.upstream.max_connections,
    );
    division.publish(
        cfg.server.limits.max_connections,
        cfg.upstream.max_connections,
        &metrics.limits,
    );
    crate::proxy::kernel_timestamps(cfg.measure.kernel_timestamps);
    let path = MeasurementPath::start(&cfg, resources, &metrics, &mut registry)?;
    let settings = Arc::new(ArcSwap::from_pointee(Settings::from_config(&cfg)));
    let layer = MeasureLayer::new(path.recorder.clone(), settings.clone())
        .with_mirror(Arc::new(path.shadow.clone()));
    let limits = metrics.limits.clone();
    let forward = Forward::new(
        &cfg.upstream,
        cfg.server.limits.request_body_timeout,
        limits.clone(),
        files,
        division,
    );
    let proxy = Proxy::new(
        &cfg.server,
        forward.clone(),
        layer,
        path.recorder.clone(),
        limits,
        division.clients,
    );
    let reloader = source.map(|source| {
        Arc::new(Reloader {
            source,
            live: path.config.clone(),
            tokenizers: path.tokenizers.clone(),
            settings: settings.clone(),
            forward,
            shadow: path.shadow.clone(),
            tls: proxy.tls_handle(),
            metrics: metrics.reload.clone(),
        })
    });
    let ready = Arc::new(AtomicBool::new(true));
    let admin = path.admin(registry, &metrics, ready.clone());
    let (stop, stopped) = watch::channel(false);
    log_start(&cfg, proxy_addr, admin_addr);
    let watcher = reloader.clone().map(|r| tokio::spawn(r.watch(RELOAD_POLL)));
    let (recent, live, calibration) = (
        path.recent.clone(),
        path.slo_view.clone(),
        path.calibration_view.clone(),
    );
    let serving = Serving {
        listener,
        proxy,
        admin_listener,
        admin,
        ready,
        stopped,
        watcher,
    };
    Ok(Running {
        proxy_addr,
        admin_addr,
        recent,
        reloader,
        live,
        calibration,
        shadow: metrics.shadow.clone(),
        stop,
        task: tokio::spawn(serve(serving, path)),
    })
}

/// The measurement path behind the data path: the recorder's channel, the tokenize stage,
/// the aggregator with what it feeds (profiles, drift, calibration totals, the OTLP sink),
/// the calibrator, and the views the admin server reads.
struct MeasurementPath {
    recorder: Recorder,
    config: Arc<ArcSwap<Config>>,
    tokenizers: Arc<ArcSwap<Tokenizers>>,
    aggregator: Aggregator,
    calibrator: Calibrator,
    otlp_tasks: Option<crate::otlp::Tasks>,
    recent: Arc<Recent>,
    slo_view: Live,
    drift_view: DriftView,
    calibration_view: CalibrationView,
    /// The mirror to a candidate (`[shadow]`), its records' stage, and the book pairing
    /// its answers.
    shadow: Shadow,
    shadow_stage: ShadowStage,
    comparer: crate::shadow::Comparer,
    book: Book,
}

impl MeasurementPath {
    /// Builds each part from its section, with the loaded files and its metrics.
    /// `registry`: where the sinks registered only under an opt-in register (the latest
    /// GenAI names, with `OTEL_SEMCONV_STABILITY_OPT_IN`).
    fn start(
        cfg: &Config,
        resources: Resources,
        metrics: &Metrics,
        registry: &mut Registry,
    ) -> Result<MeasurementPath, StartError> {
        let m = &cfg.measure;
        let (recorder, rx) = Recorder::new(
            m.channel_capacity,
            metrics.requests.dropped.clone(),
            metrics.requests.in_flight.clone(),
        );
        let config = Arc::new(ArcSwap::from_pointee(cfg.clone()));
        let tokenizers = Arc::new(ArcSwap::from_pointee(resources.tokenizers));
        // Token counting sits on the aggregator's way in (see `tokenize`).
        let (counting, counted) = Stage::new(
            config.clone(),
            tokenizers.clone(),
            metrics.tokenizer_fallback.clone(),
        );
        let drift_view = DriftView::default();
        // The shadow's records take a way of their own to the aggregator (see `shadow`).
        let (shadow, shadow_queue) = Shadow::new(config.clone(), metrics.shadow.clone());
        let (shadow_stage, shadow_rx) = ShadowStage::new(
            shadow_queue,
            config.clone(),
            tokenizers.clone(),
            metrics.tokenizer_fallback.clone(),
        );
        let book = Book::default();
        let (comparer, answers) = crate::shadow::Comparer::new(
            book.clone(),
            metrics.shadow.clone(),
            shadow.stopping(),
            crate::shadow::QUEUE_ANSWERS,
        );
        let profiling = Profiling::start(
            cfg,
            resources.baseline.as_ref(),
            &metrics.profile,
            drift_view.clone(),
        )
        .with_shadow(crate::shadow::View {
            shadow: shadow.clone(),
            book: book.clone(),
        })
        .with_identity(IdentityWatch::of_config(cfg, &metrics.profile));
        let proxy_totals = Arc::new(ProxyTotals::default());
        let calibration_view = CalibrationView::default();
        let calibrator = Calibrator::new(
            config.clone(),
            metrics.calibration.clone(),
            proxy_totals.clone(),
            calibration_view.clone(),
        );
        let recent = Arc::new(Recent::new(m.recent_requests));
        let slo_view = Live::new(cfg);
        let aggregator = Aggregator::new(
            rx,
            config.clone(),
            AggregatorMetrics {
                requests: metrics.requests.clone(),
                windows: metrics.windows.clone(),
            },
            recent.clone(),
            m.max_models,
            slo_view.clone(),
            profiling,
        )
        .with_counting(counting, counted)
        .with_filling(recorder.filling())
        .with_calibration(proxy_totals)
        .with_sink(Box::new(metrics.phases.clone()));
        let latest = crate::otlp::semconv::latest_genai(
            std::env::var("OTEL_SEMCONV_STABILITY_OPT_IN")
                .ok()
                .as_deref(),
        );
        let aggregator = if latest {
            aggregator.with_sink(Box::new(InferenceMetrics::register(registry)))
        } else {
            aggregator
        };
        let (aggregator, otlp_tasks) = match &cfg.otlp {
            Some(o) => {
                let precision = crate::otlp::instruments::Precision {
                    max_scale: cfg.metrics.native_histogram_schema,
                    max_size: cfg.metrics.native_histogram_max_buckets,
                };
                let (exporter, tasks) =
                    crate::otlp::start(o, &cfg.upstream, &metrics.otlp, latest, precision)?;
                (aggregator.with_sink(Box::new(exporter)), Some(tasks))
            }
            None => (aggregator, None),
        };
        let aggregator =
            aggregator.with_shadow(book.clone(), metrics.shadow.clone(), shadow_rx, answers);
        Ok(MeasurementPath {
            shadow,
            shadow_stage,
            comparer,
            book,
            recorder,
            config,
            tokenizers,
            aggregator,
            calibrator,
            otlp_tasks,
            recent,
            slo_view,
            drift_view,
            calibration_view,
        })
    }
}

impl MeasurementPath {
    /// The admin server over this path's views, exposing `registry`.
    fn admin(&self, registry: Registry, metrics: &Metrics, ready: Arc<AtomicBool>) -> Admin {
        Admin {
            registry: Arc::new(registry),
            recent: self.recent.clone(),
            ready,
            live: self.slo_view.clone(),
            drift: self.drift_view.clone(),
            calibration: self.calibration_view.clone(),
            config: self.config.clone(),
            unauthorized: metrics.admin.unauthorized.clone(),
            shadow: crate::shadow::View {
                shadow: self.shadow.clone(),
                book: self.book.clone(),
            },
        }
    }
}

/// The configuration's warnings, then the start-up line (tests and scripts read the bound
/// addresses from it).
fn log_start(cfg: &Config, proxy_addr: SocketAddr, admin_addr: SocketAddr) {
    for warning in cfg.warnings() {
        tracing::warn!(%warning, "configuration");
    }
    tracing::info!(
        proxy = %proxy_addr,
        admin = %admin_addr,
        dashboard = %crate::admin::dashboard_url(admin_addr, cfg.admin_access.tls.is_some()),
        upstream = %format!("{}://{}{}", cfg.upstream.scheme, cfg.upstream.authority, cfg.upstream.base_path),
        tls = cfg.server.tls.is_some(),
        admin_tls = cfg.admin_access.tls.is_some(),
        admin_token = cfg.admin_access.token.is_some(),
        "goodput serving"
    );
}

/// The servers, ready to run.
struct Serving {
    listener: TcpListener,
    proxy: Proxy,
    admin_listener: TcpListener,
    admin: Admin,
    ready: Arc<AtomicBool>,
    stopped: watch::Receiver<bool>,
    watcher: Option<JoinHandle<()>>,
}

/// Runs everything until a stop is signalled, then drains: the proxy first, then the
/// aggregator's last records (bounded by [`FLUSH_DEADLINE`]), the exports, and the admin
/// server last (so `/readyz` says 503 while streams finish).
async fn serve(s: Serving, path: MeasurementPath) {
    tokio::spawn(path.shadow_stage.run());
    tokio::spawn(path.comparer.run());
    // Off the data path; idles while `[calibration]` is disabled (it can be enabled by a
    // reload).
    let calibrating = tokio::spawn(path.calibrator.run());
    let aggregating = tokio::spawn(path.aggregator.run());
    let (admin_stop, admin_stopped) = watch::channel(false);
    let admin_task = tokio::spawn(admin::serve(
        s.admin_listener,
        s.admin,
        until(admin_stopped),
    ));
    let draining = {
        let ready = s.ready.clone();
        let stopped = s.stopped.clone();
        async move {
            until(stopped).await;
            ready.store(false, Ordering::Relaxed);
        }
    };
    if let Err(e) = proxy::serve(s.listener, s.proxy, draining).await {
        tracing::error!(error = %e, "proxy stopped with an error");
    }
    // Copies still under way end here, and records still waiting in the shadow's queue
    // are dropped: they would only hold the flush up. Each is counted (`shutdown`).
    if tokio::time::timeout(FLUSH_DEADLINE, path.shadow.stop())
        .await
        .is_err()
    {
        tracing::warn!("the shadow's thread did not end in time");
    }
    let flushed = tokio::time::timeout(FLUSH_DEADLINE, aggregating)
        .await
        .is_ok();
    if !flushed {
        tracing::warn!("some records were still open at exit (tunnels) and were not flushed");
    }
    // Once the aggregator is done, the exporters send what is left (bounded by their
    // timeout); while it still holds the exporter, they are not waited for.
    if let Some(tasks) = path.otlp_tasks.filter(|_| flushed) {
        tasks.finish().await;
    }
    if let Some(w) = s.watcher {
        w.abort();
    }
    calibrating.abort();
    let _ = admin_stop.send(true);
    let _ = admin_task.await;
    tracing::info!("goodput stopped");
}

fn local_addr(
    what: &'static str,
    l: &TcpListener,
    addr: SocketAddr,
) -> Result<SocketAddr, StartError> {
    l.local_addr()
        .map_err(|source| StartError::Bind { what, addr, source })
}

async fn until(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not
/// when the future is first polled: a signal sent any time after the call is seen.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let int = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        async move {
            let recv = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = recv(int) => tracing::info!("SIGINT received"),
                () = recv(term) => tracing::info!("SIGTERM received"),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!("SIGINT received");
        } else {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reuse_port_lets_a_second_listener_bind_the_same_address() {
        let shared = BindOptions { reuse_port: true };
        let first = bind("proxy", "127.0.0.1:0".parse().unwrap(), shared).unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind("proxy", addr, shared).unwrap();
        assert_eq!(second.local_addr().unwrap(), addr);
    }

    #[tokio::test]
    async fn without_reuse_port_the_address_is_in_use() {
        let first = bind(
            "proxy",
            "127.0.0.1:0".parse().unwrap(),
            BindOptions::default(),
        )
        .unwrap();
        let addr = first.local_addr().unwrap();
        let err = bind("admin", addr, BindOptions::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot listen on {addr} (admin)")),
            "{err}"
        );
        // Reuse on one side only is refused too: both processes must opt in.
        let err = bind("proxy", addr, BindOptions { reuse_port: true }).unwrap_err();
        assert!(matches!(err, StartError::Bind { .. }), "{err}");
    }
}
