//! The metric side of the export: OpenTelemetry SDK instruments that the aggregator records
//! each finished request into (in memory, no I/O), and the task that collects them every
//! `interval` and sends them to the collector. Temporality is cumulative, as Prometheus-
//! style backends expect.
//!
//! The latency instruments (TTFT, TPOT, ITL, the request and inference durations, the
//! engine's phases) are base-2 exponential histograms at the precision of the native
//! histograms on `/metrics` ([`Precision`], from `[metrics]`): a collector that sums
//! replicas, or converts them to Prometheus native histograms, gets the same bounded
//! relative error as a Prometheus scraping goodput. ITL is recorded once per gap, so a
//! long stream costs the aggregator one histogram update per token while OTLP is on.

use std::{sync::Arc, time::Duration};

use opentelemetry::{
    InstrumentationScope, KeyValue,
    metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _},
};
use opentelemetry_otlp::MetricExporter;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    metrics::{
        Aggregation, Instrument, InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Stream,
        Temporality, data::ResourceMetrics, exporter::PushMetricExporter, reader::MetricReader,
    },
};
use tokio::sync::watch;

use super::{
    Health,
    semconv::{self as sc},
};
use crate::{measure::RequestRecord, stats::engine::Gauges};

/// The instruments, recorded into by the aggregator.
pub struct Instruments {
    client_duration: Histogram<f64>,
    server_duration: Histogram<f64>,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    /// Every inter-token gap, as `goodput_inter_token_latency_seconds` on `/metrics`.
    itl: Histogram<f64>,
    /// The engine's own timings per part (`goodput.phase`), as `goodput_request_phase_seconds`.
    phases: Histogram<f64>,
    token_usage: Histogram<u64>,
    requests: Counter<u64>,
    output_tokens: Counter<u64>,
    attainment: Gauge<f64>,
    effective_tps: Gauge<f64>,
    raw_tps: Gauge<f64>,
    request_goodput: Gauge<f64>,
    /// The latest GenAI client-inference instruments, when opted in.
    latest: Option<Latest>,
}

/// `gen_ai.client.inference.*` (OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental).
struct Latest {
    duration: Histogram<f64>,
    time_to_first_chunk: Histogram<f64>,
    time_per_output_chunk: Histogram<f64>,
    input_tokens: Counter<u64>,
    output_tokens: Counter<u64>,
    cache_read_input_tokens: Counter<u64>,
    /// Cost per request: its output tokens at the shortest window's cost per raw token.
    cost: Histogram<f64>,
    /// That cost per million raw tokens (f64 bits; NaN until a window has one) and its
    /// currency, from the latest refresh.
    cost_per_million: std::sync::atomic::AtomicU64,
    currency: std::sync::Mutex<Option<String>>,
}

/// What the export task owns: the provider (the instruments record into its pipeline while
/// it lives) and the reader it collects through.
pub struct Collection {
    provider: SdkMeterProvider,
    reader: SharedReader,
}

/// A [`ManualReader`] the provider and the export task share.
#[derive(Debug, Clone)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// The latency instruments, exported as exponential histograms.
const EXPONENTIAL: [&str; 9] = [
    sc::CLIENT_OPERATION_DURATION,
    sc::SERVER_REQUEST_DURATION,
    sc::SERVER_TTFT,
    sc::SERVER_TPOT,
    sc::ITL,
    sc::REQUEST_PHASE,
    sc::INFERENCE_DURATION,
    sc::INFERENCE_TTFC,
    sc::INFERENCE_TPOC,
];

/// The exponential histograms' precision: the native histograms' on `/metrics`. An OTLP
/// scale is a Prometheus schema (bucket boundaries grow by `2^(2^-scale)`: scale 6 is
/// ±0.54 %), and past `max_size` buckets a data point halves its resolution, as a native
/// histogram past its bucket cap does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precision {
    pub max_scale: i8,
    pub max_size: u32,
}

pub fn build(
    resource: Resource,
    scope: InstrumentationScope,
    latest: bool,
    precision: Precision,
) -> (Instruments, Collection) {
    let reader = SharedReader(Arc::new(
        ManualReader::builder()
            .with_temporality(Temporality::Cumulative)
            .build(),
    ));
    let exponential = move |i: &Instrument| {
        if !EXPONENTIAL.contains(&i.name()) {
            return None;
        }
        let aggregation = Aggregation::Base2ExponentialHistogram {
            max_size: precision.max_size,
            max_scale: precision.max_scale,
            record_min_max: true,
        };
        // An invalid stream (a scale outside -10..=20; `[metrics]` allows -4..=8) would
        // leave the instrument its explicit buckets.
        Stream::builder().with_aggregation(aggregation).build().ok()
    };
    let provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader.clone())
        .with_view(exponential)
        .build();
    let meter = provider.meter_with_scope(scope);
    let instruments = Instruments::new(&meter, latest);
    (instruments, Collection { provider, reader })
}

impl Instruments {
    fn new(m: &Meter, latest: bool) -> Instruments {
        // Exponential buckets (the view in `build`): no boundaries to advise.
        let seconds = |name: &'static str, what: &'static str| {
            m.f64_histogram(name)
                .with_unit("s")
                .with_description(what)
                .build()
        };
        let gauge = |name: &'static str, unit: &'static str, what: &'static str| {
            m.f64_gauge(name)
                .with_unit(unit)
                .with_description(what)
                .build()
        };
        Instruments {
            client_duration: seconds(
                sc::CLIENT_OPERATION_DURATION,
                "GenAI operation duration, as the proxy saw it (arrival to the end of the response)",
            ),
            server_duration: seconds(
                sc::SERVER_REQUEST_DURATION,
                "Generative AI server request duration (arrival to the end of the response)",
            ),
            ttft: seconds(
                sc::SERVER_TTFT,
                "Time to generate first token for successful responses",
            ),
            tpot: seconds(
                sc::SERVER_TPOT,
                "Time per output token generated after the first token for successful responses",
            ),
            itl: seconds(
                sc::ITL,
                "Time between consecutive streamed output tokens, every gap of every request",
            ),
            phases: seconds(
                sc::REQUEST_PHASE,
                "The engine's own timing of a part of the request (goodput.phase: queue, prefill, decode, inference, outside_engine)",
            ),
            token_usage: m
                .u64_histogram(sc::CLIENT_TOKEN_USAGE)
                .with_unit("{token}")
                .with_description("Number of input and output tokens used")
                .with_boundaries(sc::TOKEN_BUCKETS.to_vec())
                .build(),
            requests: m
                .u64_counter(sc::REQUESTS)
                .with_unit("{request}")
                .with_description("Finished generation requests by outcome and SLO verdict")
                .build(),
            output_tokens: m
                .u64_counter(sc::OUTPUT_TOKENS)
                .with_unit("{token}")
                .with_description(
                    "Output tokens by SLO verdict; verdict=met are the effective (goodput) tokens",
                )
                .build(),
            attainment: gauge(
                sc::ATTAINMENT,
                "1",
                "SLO attainment over the window: met / (met + missed)",
            ),
            effective_tps: gauge(
                sc::EFFECTIVE_TPS,
                "{token}/s",
                "Effective goodput: output tokens of requests that met their SLO, per second",
            ),
            raw_tps: gauge(
                sc::RAW_TPS,
                "{token}/s",
                "Raw throughput: all output tokens per second",
            ),
            request_goodput: gauge(
                sc::REQUEST_GOODPUT,
                "{request}/s",
                "Requests that met their SLO, per second",
            ),
            latest: latest.then(|| Latest::new(m)),
        }
    }

    /// Records one judged generation request. `common` holds the attributes every GenAI
    /// metric carries (operation, provider, model, server address and port).
    /// `gaps`: the inter-token gaps in microseconds.
    pub fn record(
        &self,
        r: &RequestRecord,
        common: &[KeyValue],
        verdict: &'static str,
        gaps: &[u32],
    ) {
        let mut attrs = Vec::with_capacity(common.len() + 2);
        attrs.extend_from_slice(common);
        attrs.push(KeyValue::new(sc::G_CLASS, r.slo_class.clone()));
        let ok = r.outcome == crate::measure::Outcome::Ok;
        if ok {
            if let Some(ttft) = r.ttft_ms {
                self.ttft.record(ttft / 1000.0, &attrs);
            }
            if let Some(tpot) = r.tpot_ms {
                self.tpot.record(tpot / 1000.0, &attrs);
            }
        }
        for &gap in gaps {
            self.itl.record(f64::from(gap) / 1e6, &attrs);
        }
        for (part, ms) in r.engine.parts() {
            if let Some(ms) = ms {
                attrs.push(KeyValue::new(sc::G_PHASE, part.as_str()));
                // Negative parts (the engine's clock ahead) count as 0, as on `/metrics`.
                self.phases.record(ms.max(0.0) / 1000.0, &attrs);
                attrs.pop();
            }
        }
        for (kind, n) in [("input", r.input_tokens), ("output", r.output_tokens)] {
            if let Some(n) = n {
                attrs.push(KeyValue::new(sc::TOKEN_TYPE, kind));
                self.token_usage.record(n, &attrs);
                attrs.pop();
            }
        }
        if !ok {
            attrs.push(KeyValue::new(sc::ERROR_TYPE, r.outcome.as_str()));
        }
        let e2e = r.e2e_ms / 1000.0;
        self.server_duration.record(e2e, &attrs);
        self.client_duration.record(e2e, &attrs);

        let class = KeyValue::new(sc::G_CLASS, r.slo_class.clone());
        let verdict = KeyValue::new(sc::G_VERDICT, verdict);
        let model = common
            .iter()
            .find(|kv| kv.key.as_str() == sc::REQUEST_MODEL);
        let mut counted = vec![
            KeyValue::new(sc::G_API, r.api),
            KeyValue::new(sc::G_OUTCOME, r.outcome.as_str()),
            class.clone(),
            verdict.clone(),
        ];
        counted.extend(model.cloned());
        self.requests.add(1, &counted);
        if let Some(n) = r.output_tokens {
            self.output_tokens.add(n, &[class, verdict]);
        }
        if let Some(latest) = &self.latest {
            latest.record(r, &attrs);
        }
    }

    /// The windowed SLO and goodput figures, as `/metrics` has them.
    pub fn refresh(&self, g: &Gauges<'_>) {
        for w in &g.windows {
            for c in w.classes.iter().chain(std::iter::once(&w.overall)) {
                let attrs = [
                    KeyValue::new(sc::G_CLASS, c.class.to_owned()),
                    KeyValue::new(sc::G_WINDOW, w.window.to_owned()),
                ];
                // No samples: no attainment (a gauge keeps its last value; 0 would lie).
                if let Some(a) = c.attainment {
                    self.attainment.record(a, &attrs);
                }
                self.effective_tps.record(c.effective_tokens_per_s, &attrs);
                self.raw_tps.record(c.raw_tokens_per_s, &attrs);
                self.request_goodput.record(c.request_goodput_per_s, &attrs);
            }
        }
        if let Some(latest) = &self.latest {
            latest.refresh(g);
        }
    }
}

impl Latest {
    fn new(m: &Meter) -> Latest {
        let seconds = |name: &'static str, what: &'static str| {
            m.f64_histogram(name)
                .with_unit("s")
                .with_description(what)
                .build()
        };
        let tokens = |name: &'static str, what: &'static str| {
            m.u64_counter(name)
                .with_unit("{token}")
                .with_description(what)
                .build()
        };
        Latest {
            duration: seconds(
                sc::INFERENCE_DURATION,
                "GenAI client inference duration (arrival to the end of the response)",
            ),
            time_to_first_chunk: seconds(
                sc::INFERENCE_TTFC,
                "Time to the first output chunk of a streamed, successful response",
            ),
            time_per_output_chunk: seconds(
                sc::INFERENCE_TPOC,
                "Time per output chunk after the first, of a streamed, successful response",
            ),
            input_tokens: tokens(sc::INFERENCE_INPUT_TOKENS, "Input tokens"),
            output_tokens: tokens(sc::INFERENCE_OUTPUT_TOKENS, "Output tokens"),
            cache_read_input_tokens: tokens(
                sc::INFERENCE_CACHE_READ_TOKENS,
                "Input tokens served from the engine's prefix cache",
            ),
            cost: m
                .f64_histogram(sc::OPERATION_COST)
                .with_unit("{currency}")
                .with_description(
                    "Cost of a request: its output tokens at the serving system's configured cost per raw output token over the shortest window ([cost])",
                )
                .build(),
            cost_per_million: std::sync::atomic::AtomicU64::new(f64::NAN.to_bits()),
            currency: std::sync::Mutex::new(None),
        }
    }

    /// Keeps the shortest window's cost per million raw tokens for the requests to come.
    fn refresh(&self, g: &Gauges<'_>) {
        let per_million = g
            .windows
            .first()
            .and_then(|w| w.cost_per_million_raw_tokens)
            .filter(|c| c.is_finite());
        self.cost_per_million.store(
            per_million.unwrap_or(f64::NAN).to_bits(),
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Ok(mut c) = self.currency.lock() {
            *c = g.currency.map(str::to_owned);
        }
    }

    /// `attrs`: the common GenAI attributes, the class, and `error.type` for a failure.
    fn record(&self, r: &RequestRecord, attrs: &[KeyValue]) {
        self.duration.record(r.e2e_ms / 1000.0, attrs);
        if r.outcome == crate::measure::Outcome::Ok {
            if let Some(ttft) = r.ttft_ms {
                self.time_to_first_chunk.record(ttft / 1000.0, attrs);
            }
            if let Some(chunk) = r.per_output_chunk_ms() {
                self.time_per_output_chunk.record(chunk / 1000.0, attrs);
            }
        }
        for (counter, n) in [
            (&self.input_tokens, r.input_tokens),
            (&self.output_tokens, r.output_tokens),
            (&self.cache_read_input_tokens, r.cached_input_tokens),
        ] {
            if let Some(n) = n {
                counter.add(n, attrs);
            }
        }
        let per_million = f64::from_bits(
            self.cost_per_million
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        if let (Some(n), true) = (r.output_tokens, per_million.is_finite()) {
            let mut with = attrs.to_vec();
            with.push(KeyValue::new(sc::USAGE_COST_SOURCE, "local"));
            if let Ok(c) = self.currency.lock()
                && let Some(c) = c.as_ref()
            {
                with.push(KeyValue::new(sc::G_COST_CURRENCY, c.clone()));
            }
            self.cost.record(n as f64 * per_million / 1e6, &with);
        }
    }
}

/// Collects and exports every `interval` until `stop`'s sender is gone, then once more so
/// the last requests are not lost.
pub async fn run(
    collection: Collection,
    exporter: MetricExporter,
    interval: Duration,
    timeout: Duration,
    mut health: Health,
    mut stop: watch::Receiver<()>,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            changed = stop.changed() => changed.is_err(),
        };
        let mut rm = ResourceMetrics::default();
        match collection.reader.collect(&mut rm) {
            Ok(()) => {
                let result = tokio::time::timeout(timeout, exporter.export(&rm)).await;
                health.report(result.map_err(|_| timed_out(timeout)).and_then(|r| r));
            }
            Err(e) => tracing::error!(error = %e, "otlp: collecting metrics failed"),
        }
        if last {
            break;
        }
    }
    let _ = collection.provider.shutdown();
}

fn timed_out(after: Duration) -> opentelemetry_sdk::error::OTelSdkError {
    opentelemetry_sdk::error::OTelSdkError::Timeout(after)
}
