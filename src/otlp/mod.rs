//! OpenTelemetry export (`[otlp]`) over OTLP/HTTP with protobuf bodies: the GenAI
//! semantic-convention metrics and goodput's own SLO and goodput figures
//! ([`instruments`]), and one server span per generation request ([`spans`]) that joins the
//! caller's trace when the request carried a `traceparent` ([`traceparent`]).
//!
//! Everything happens off the data path. The aggregator, which already receives every
//! finished record over its bounded channel, records into in-memory SDK instruments and
//! queues spans with `try_send` on a bounded queue; two tasks of their own collect and send
//! (through [`client`], a hyper client). A collector that is down, refuses or hangs costs
//! the proxy nothing: an export waits at most `[otlp] timeout`, spans that do not fit the
//! queue are dropped and counted, failures are counted per signal
//! (`goodput_otlp_export_failures_total`) and logged at most once a minute.

mod client;
pub mod instruments;
mod metrics;
pub mod semconv;
pub mod spans;

use std::time::Duration;

use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{
    ExporterBuildError, MetricExporter, Protocol, SpanExporter, WithExportConfig, WithHttpConfig,
};
use opentelemetry_sdk::{Resource, error::OTelSdkResult};
use prometheus_client::metrics::counter::Counter;
use tokio::{sync::watch, task::JoinHandle, time::Instant};

pub use client::CollectorClient;
pub use metrics::OtlpMetrics;

use crate::{
    config::{Otlp, Upstream},
    measure::RequestRecord,
    metrics::SignalLabel,
    stats::engine::Gauges,
};

/// How often a failing export is logged again (with the number of failures since).
const LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("otlp: cannot build the {signal} exporter: {source}")]
    Build {
        signal: &'static str,
        #[source]
        source: ExporterBuildError,
    },
}

/// The aggregator's handle: records requests into the instruments and queues their spans.
pub struct Exporter {
    instruments: Option<instruments::Instruments>,
    spans: Option<spans::SpanQueue>,
    provider_name: Option<String>,
    server_address: String,
    server_port: i64,
    /// Dropped with the exporter: tells the metric task to export a last time and stop.
    _stop: watch::Sender<()>,
}

/// The export tasks; [`Tasks::finish`] waits for their last export.
pub struct Tasks {
    handles: Vec<JoinHandle<()>>,
    timeout: Duration,
}

impl Tasks {
    /// Waits for the last export (after the [`Exporter`] was dropped), at most the export
    /// timeout and a second: a collector that hangs never holds the shutdown up longer.
    pub async fn finish(self) {
        let all = async {
            for h in self.handles {
                let _ = h.await;
            }
        };
        if tokio::time::timeout(self.timeout + Duration::from_secs(1), all)
            .await
            .is_err()
        {
            tracing::warn!("otlp: the last export did not finish before shutdown");
        }
    }
}

/// Builds the exporters and spawns their tasks (call from within the runtime).
/// `latest`: also export the GenAI conventions' latest client-inference instruments
/// ([`semconv::latest_genai`]); `precision`: the latency histograms' (`[metrics]`).
pub fn start(
    cfg: &Otlp,
    upstream: &Upstream,
    counters: &OtlpMetrics,
    latest: bool,
    precision: instruments::Precision,
) -> Result<(Exporter, Tasks), OtlpError> {
    let resource = Resource::builder()
        .with_service_name(cfg.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let scope = InstrumentationScope::builder(semconv::SCOPE)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let client = CollectorClient::new(cfg);
    let (metrics_client, traces_client) = (client.for_signal(), client.for_signal());
    let (stop, stopped) = watch::channel(());
    let mut handles = Vec::new();

    let instruments = if cfg.metrics {
        let exporter = MetricExporter::builder()
            .with_http()
            .with_http_client(metrics_client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(cfg.metrics_url.to_string())
            .with_timeout(cfg.timeout)
            .build()
            .map_err(|source| OtlpError::Build {
                signal: "metrics",
                source,
            })?;
        let (instruments, collection) =
            instruments::build(resource.clone(), scope.clone(), latest, precision);
        handles.push(tokio::spawn(instruments::run(
            collection,
            exporter,
            cfg.interval,
            cfg.timeout,
            Health::new("metrics", counters).with_cause(metrics_client),
            stopped,
        )));
        Some(instruments)
    } else {
        None
    };

    let spans = if cfg.traces {
        let mut exporter = SpanExporter::builder()
            .with_http()
            .with_http_client(traces_client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(cfg.traces_url.to_string())
            .with_timeout(cfg.timeout)
            .build()
            .map_err(|source| OtlpError::Build {
                signal: "traces",
                source,
            })?;
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let (queue, rx) =
            spans::SpanQueue::new(cfg.queue_size, scope, counters.spans_dropped.clone());
        handles.push(tokio::spawn(spans::run(
            rx,
            exporter,
            cfg.batch_size,
            cfg.timeout,
            Health::new("traces", counters).with_cause(traces_client),
            counters.spans_dropped.clone(),
        )));
        Some(queue)
    } else {
        None
    };

    let server_port =
        upstream
            .authority
            .port_u16()
            .unwrap_or(if upstream.scheme.as_str() == "https" {
                443
            } else {
                80
            });
    tracing::info!(
        endpoint = %cfg.endpoint,
        metrics = cfg.metrics,
        traces = cfg.traces,
        interval = ?cfg.interval,
        "otlp export on"
    );
    Ok((
        Exporter {
            instruments,
            spans,
            provider_name: cfg.provider_name.clone(),
            server_address: upstream.authority.host().to_owned(),
            server_port: i64::from(server_port),
            _stop: stop,
        },
        Tasks {
            handles,
            timeout: cfg.timeout,
        },
    ))
}

impl Exporter {
    /// Whether requests should carry their trace context to the record.
    pub fn traces(&self) -> bool {
        self.spans.is_some()
    }

    /// One judged generation request; `model` is the bounded metric label, `gaps` the
    /// inter-token gaps in microseconds.
    pub fn observe(&self, r: &RequestRecord, model: &str, gaps: &[u32]) {
        let verdict = match r.slo_met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "excluded",
        };
        let provider = self
            .provider_name
            .clone()
            .unwrap_or_else(|| semconv::provider_name(r.api).to_owned());
        let mut common = vec![
            KeyValue::new(semconv::OPERATION_NAME, semconv::operation_name(r.api)),
            KeyValue::new(semconv::PROVIDER_NAME, provider),
            KeyValue::new(semconv::SERVER_ADDRESS, self.server_address.clone()),
            KeyValue::new(semconv::SERVER_PORT, self.server_port),
        ];
        if r.model.is_some() {
            common.push(KeyValue::new(semconv::REQUEST_MODEL, model.to_owned()));
        }
        if let Some(i) = &self.instruments {
            i.record(r, &common, verdict, gaps);
        }
        if let Some(s) = &self.spans {
            s.push(r, &common, verdict);
        }
    }

    /// The windowed SLO and goodput gauges, refreshed with `/metrics`'.
    pub fn refresh(&self, g: &Gauges<'_>) {
        if let Some(i) = &self.instruments {
            i.refresh(g);
        }
    }

    pub fn exports_metrics(&self) -> bool {
        self.instruments.is_some()
    }
}

/// The aggregator hands the exporter every judged record and, when metrics are exported,
/// the windowed gauges.
impl crate::stats::Sink for Exporter {
    fn observe(&self, record: &RequestRecord, model: &str, gaps: &[u32]) {
        Exporter::observe(self, record, model, gaps);
    }

    fn wants_gauges(&self) -> bool {
        self.exports_metrics()
    }

    fn refresh(&self, gauges: &Gauges<'_>) {
        Exporter::refresh(self, gauges);
    }
}

/// Counts one signal's export results and logs failures without flooding: the first
/// failure at once, then at most once per [`LOG_EVERY`] with the count since, and the
/// recovery.
pub struct Health {
    signal: &'static str,
    ok: Counter,
    failed: Counter,
    failing_since_log: u64,
    last_log: Option<Instant>,
    failing: bool,
    /// Where the transport failure behind an export error can be read.
    client: Option<CollectorClient>,
}

impl Health {
    pub fn new(signal: &'static str, m: &OtlpMetrics) -> Health {
        let label = SignalLabel { signal };
        Health {
            signal,
            ok: m.exports.get_or_create(&label).clone(),
            failed: m.export_failures.get_or_create(&label).clone(),
            failing_since_log: 0,
            last_log: None,
            failing: false,
            client: None,
        }
    }

    fn with_cause(mut self, client: CollectorClient) -> Health {
        self.client = Some(client);
        self
    }

    pub fn report(&mut self, result: OTelSdkResult) {
        let now = Instant::now();
        match result {
            Ok(()) => {
                if let Some(c) = &self.client {
                    c.take_error();
                }
                self.ok.inc();
                if self.failing {
                    self.failing = false;
                    tracing::info!(signal = self.signal, "otlp: export succeeds again");
                }
            }
            Err(e) => {
                self.failed.inc();
                self.failing = true;
                self.failing_since_log += 1;
                let due = self
                    .last_log
                    .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
                let cause = self.client.as_ref().and_then(CollectorClient::take_error);
                if due {
                    tracing::warn!(
                        signal = self.signal,
                        error = %e,
                        cause = cause.as_deref().unwrap_or("-"),
                        failures = self.failing_since_log,
                        "otlp: export failed (logged at most once a minute; see goodput_otlp_export_failures_total)"
                    );
                    self.failing_since_log = 0;
                    self.last_log = Some(now);
                }
            }
        }
    }

    #[cfg(test)]
    fn logged_failures_pending(&self) -> u64 {
        self.failing_since_log
    }
}

/// For tests: counters of a family by label value.
#[cfg(test)]
fn count(
    f: &prometheus_client::metrics::family::Family<SignalLabel, Counter>,
    signal: &'static str,
) -> u64 {
    f.get_or_create(&SignalLabel { signal }).get()
}

#[cfg(test)]
mod tests {
    use opentelemetry_sdk::error::OTelSdkError;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_are_counted_every_time_and_logged_once_a_minute() {
        let m = OtlpMetrics::default();
        let mut h = Health::new("traces", &m);
        let fail = || Err(OTelSdkError::InternalFailure("refused".into()));
        h.report(fail());
        assert_eq!(
            h.logged_failures_pending(),
            0,
            "the first failure is logged"
        );
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(5)).await;
            h.report(fail());
        }
        assert_eq!(
            h.logged_failures_pending(),
            5,
            "held back within the minute"
        );
        tokio::time::advance(Duration::from_secs(40)).await;
        h.report(fail());
        assert_eq!(
            h.logged_failures_pending(),
            0,
            "logged again after a minute"
        );
        h.report(Ok(()));
        assert_eq!(count(&m.export_failures, "traces"), 7);
        assert_eq!(count(&m.exports, "traces"), 1);
        assert_eq!(count(&m.exports, "metrics"), 0);
    }
}
