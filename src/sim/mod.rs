//! `goodput sim`: an OpenAI-compatible upstream simulator.
//!
//! It is the demo's upstream and the fixture of the proxy's integration tests and
//! benchmarks, so it is built to be
//! - realistic: `POST /v1/chat/completions` and `POST /v1/completions`, streamed (SSE) or
//!   not, in OpenAI's wire format, with configurable TTFT, inter-token latency, output
//!   length, tokens per event, a throughput–latency knee, HTTP 500s and mid-stream resets;
//!   also `GET /v1/models`, `GET /health`, and `GET /metrics` with vLLM's latency
//!   histograms made from its own ground truth (for self-calibration);
//! - deterministic: every request draws from a generator seeded by [`SimConfig::seed`]
//!   and its sequence number, so a sequential client sees the same run every time;
//! - cheap: a stream is a timer-driven `http_body::Body` polled by hyper's connection
//!   task (no task or channel per stream), so two cores hold thousands of streams;
//! - honest: [`Sim::truth`] exposes what the server actually did for each request
//!   (when each token left, whether the stream completed, whether the client went away),
//!   for tests to compare with what the proxy measured.
//!
//! # Layout
//! - `config`: [`SimConfig`] and the `goodput sim` flags, [`SimArgs`].
//! - `dist`: [`Dist`], the latency and length distributions and their CLI syntax.
//! - `handler`: routing, request parsing, the per-request random plan, responses.
//! - `stream`: the response body, which plays a stream back on an absolute timetable.
//! - `wire`: the OpenAI JSON and SSE encodings.
//! - `truth`: [`Truth`] records and the in-flight guard that writes them.
//! - `metrics`: the engine-side `/metrics` in vLLM's names.
//!
//! # Example
//! ```ignore
//! # async fn demo() -> std::io::Result<()> {
//! use goodput::sim::{Sim, SimConfig};
//! let sim = Sim::new(SimConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let handle = sim.clone();
//! tokio::spawn(async move { handle.serve(listener, std::future::pending()).await });
//! // ... send requests, then compare with `sim.truth()`.
//! # Ok(()) }
//! ```

mod config;
mod dist;
mod handler;
mod metrics;
mod stream;
mod truth;
mod wire;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

pub use config::{DEFAULT_SEED, SimArgs, SimConfig};
pub use dist::{Dist, DistParseError};
pub use stream::SimError;
pub use truth::{TRUTH_CAPACITY, Truth};

/// HTTP/2 streams allowed per connection. hyper's default (200) would cap a proxy that
/// multiplexes a benchmark's thousands of streams over one h2c connection.
const H2_MAX_CONCURRENT_STREAMS: u32 = 16_384;

/// The simulator. Cheap to clone: clones share one server state, so a test can keep a
/// handle for [`Sim::truth`] while [`Sim::serve`] runs in a spawned task.
#[derive(Clone, Debug)]
pub struct Sim {
    shared: Arc<Shared>,
}

/// State shared by every connection and request of one simulator.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) cfg: SimConfig,
    /// Sequence number of the next generation request; seeds its generator.
    pub(crate) requests: AtomicU64,
    /// Deterministic requests so far, for `vary_share`.
    pub(crate) deterministic: AtomicU64,
    /// Requests between head received and body finished or dropped.
    pub(crate) in_flight: AtomicUsize,
    pub(crate) truth: truth::TruthLog,
    /// What `GET /metrics` reports.
    pub(crate) metrics: metrics::EngineMetrics,
}

impl Shared {
    pub(crate) fn new(cfg: SimConfig) -> Self {
        let metrics = metrics::EngineMetrics::serving(&cfg.model);
        Shared {
            cfg,
            requests: AtomicU64::new(0),
            deterministic: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            truth: truth::TruthLog::default(),
            metrics,
        }
    }

    /// Stretches a latency by the current load: `1 + slowdown * (in_flight - knee)` above
    /// the knee. Read on every delay, so a stream slows down as load builds up around it.
    pub(crate) fn scale(&self, d: Duration) -> Duration {
        let Some(knee) = self.cfg.concurrency_knee else {
            return d;
        };
        let over = self
            .in_flight
            .load(Ordering::Relaxed)
            .saturating_sub(knee as usize);
        if over == 0 {
            return d;
        }
        let factor = 1.0 + self.cfg.slowdown_per_request.max(0.0) * over as f64;
        stream::scale_duration(d, factor)
    }
}

impl Sim {
    /// A simulator with this configuration; nothing runs until [`Sim::serve`].
    pub fn new(cfg: SimConfig) -> Sim {
        Sim {
            shared: Arc::new(Shared::new(cfg)),
        }
    }

    /// The configuration this simulator runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.cfg
    }

    /// Serves HTTP/1.1 and h2c (prior knowledge) on `listener` until `shutdown` resolves,
    /// then stops accepting and waits for open responses, streams included, to finish.
    /// Accept errors (e.g. out of file descriptors) are logged and retried, never fatal.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new());
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS);
        let graceful = GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);

        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(error) => {
                        tracing::warn!(%error, "sim: accept failed");
                        // Back off so a persistent error (EMFILE) does not spin a core.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            // Events are small and latency is what is being simulated: no Nagle delay.
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(%error, %peer, "sim: set_nodelay failed");
            }
            let shared = self.shared.clone();
            let service = service_fn(move |req| handler::handle(shared.clone(), req));
            let conn = builder
                .serve_connection(TokioIo::new(tcp), service)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(error) = conn.await {
                    tracing::debug!(%error, %peer, "sim: connection ended with an error");
                }
            });
        }

        drop(listener);
        graceful.shutdown().await;
        Ok(())
    }

    /// Ground truth for the requests that have finished (or been dropped), oldest first,
    /// at most the last [`TRUTH_CAPACITY`].
    pub fn truth(&self) -> Vec<Truth> {
        self.shared.truth.snapshot()
    }

    /// Zeroes the histograms of `GET /metrics`, as an engine restart does.
    pub fn restart_metrics(&self) {
        self.shared.metrics.reset();
    }

    /// Requests currently being answered (`/health` excluded).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }
}

/// Runs `goodput sim` with its flags: binds `--listen`, serves until `shutdown`.
pub async fn run(args: &SimArgs, shutdown: impl Future<Output = ()> + Send) -> std::io::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    let cfg = args.to_config();
    tracing::info!(
        addr = %listener.local_addr()?,
        ttft = %cfg.ttft,
        itl = %cfg.itl,
        seed = cfg.seed,
        model = %cfg.model,
        "sim: listening"
    );
    Sim::new(cfg).serve(listener, shutdown).await
}

#[cfg(test)]
mod tests;
