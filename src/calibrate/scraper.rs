//! The calibration task: every `interval`, GET the engine's metrics, extract its
//! histograms, read the proxy's totals, compare, and publish gauges and the JSON status.
//! It reads the configuration before each scrape, so every `[calibration]` key applies on
//! reload; a new URL or engine starts over from a fresh baseline.

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{
    Request, StatusCode, Uri,
    header::{ACCEPT, USER_AGENT},
};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use tokio::time::Instant;

use super::{
    CalibrationMetrics, CalibrationView, ProxyTotals, Quantity,
    attribution::{self, Attribution},
    compare::{Status, Tracker, Update},
    engines::{self, EngineKind, ExtractError, Extracted},
};
use crate::{
    config::{Calibration, Config},
    metrics::{
        CalibrationLabels, CalibrationSampleLabels, EngineModel, ModelPhase, ScrapeResultLabel,
    },
};

/// Largest metrics page read; a vLLM page with many LoRA adapters is a few MB at most.
const MAX_BODY: usize = 32 << 20;
/// How often a disabled calibrator looks at the configuration again.
const DISABLED_POLL: Duration = Duration::from_secs(1);
/// What is asked for: the classic text format (OpenMetrics text parses the same way).
const ACCEPT_TEXT: &str =
    "text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5,*/*;q=0.1";

type ScrapeClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// How a scrape ended. A closed set: the `result` label of
/// `goodput_calibration_scrapes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScrapeResult {
    Ok,
    Unreachable,
    Timeout,
    HttpError,
    TransportError,
    TooLarge,
    Invalid,
    NoEngineMetrics,
}

impl ScrapeResult {
    fn as_str(self) -> &'static str {
        match self {
            ScrapeResult::Ok => "ok",
            ScrapeResult::Unreachable => "unreachable",
            ScrapeResult::Timeout => "timeout",
            ScrapeResult::HttpError => "http_error",
            ScrapeResult::TransportError => "transport_error",
            ScrapeResult::TooLarge => "too_large",
            ScrapeResult::Invalid => "invalid",
            ScrapeResult::NoEngineMetrics => "no_engine_metrics",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("cannot reach the metrics endpoint: {0}")]
    Unreachable(#[source] hyper_util::client::legacy::Error),
    #[error("the request failed: {0}")]
    Transport(#[source] hyper_util::client::legacy::Error),
    #[error("reading the metrics body failed: {0}")]
    Body(#[source] crate::BoxError),
    #[error("no complete answer within the timeout")]
    Timeout,
    #[error("the endpoint answered HTTP {0}")]
    Status(StatusCode),
    #[error("the metrics page is larger than {MAX_BODY} bytes")]
    TooLarge,
    #[error("the metrics page is not UTF-8 text")]
    NotText,
    #[error(transparent)]
    Extract(#[from] ExtractError),
}

impl ScrapeError {
    fn result(&self) -> ScrapeResult {
        match self {
            ScrapeError::Unreachable(_) => ScrapeResult::Unreachable,
            ScrapeError::Transport(_) | ScrapeError::Body(_) => ScrapeResult::TransportError,
            ScrapeError::Timeout => ScrapeResult::Timeout,
            ScrapeError::Status(_) => ScrapeResult::HttpError,
            ScrapeError::TooLarge => ScrapeResult::TooLarge,
            ScrapeError::NotText | ScrapeError::Extract(ExtractError::Invalid { .. }) => {
                ScrapeResult::Invalid
            }
            ScrapeError::Extract(ExtractError::NoEngineMetrics) => ScrapeResult::NoEngineMetrics,
        }
    }
}

/// The calibration task. Spawn [`Calibrator::run`]; it never returns (abort it at shutdown).
pub struct Calibrator {
    config: Arc<ArcSwap<Config>>,
    metrics: CalibrationMetrics,
    proxy: Arc<ProxyTotals>,
    view: CalibrationView,
}

/// What one run keeps between scrapes.
struct State {
    tracker: Tracker,
    /// The URL and engine the baseline belongs to.
    target: Option<(Uri, EngineKind)>,
    /// The client and the upstream TLS settings it was built from.
    client: Option<(ScrapeClient, Arc<rustls::ClientConfig>)>,
    last_result: Option<ScrapeResult>,
    warned_models: bool,
    /// Cumulative preemptions per model at the previous scrape.
    preemptions_total: std::collections::BTreeMap<String, f64>,
    attribution: Vec<Attribution>,
    history: attribution::History,
    /// The GPU exporters at the last scrape.
    gpus: Option<super::dcgm::GpuNow>,
}

impl Calibrator {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        metrics: CalibrationMetrics,
        proxy: Arc<ProxyTotals>,
        view: CalibrationView,
    ) -> Calibrator {
        Calibrator {
            config,
            metrics,
            proxy,
            view,
        }
    }

    pub async fn run(self) {
        let mut state = State {
            tracker: Tracker::default(),
            target: None,
            client: None,
            last_result: None,
            warned_models: false,
            preemptions_total: std::collections::BTreeMap::new(),
            attribution: Vec::new(),
            history: attribution::History::default(),
            gpus: None,
        };
        loop {
            let config = self.config.load_full();
            let c = &config.calibration;
            if !c.enabled {
                if state.target.take().is_some() {
                    self.forget(&mut state);
                    self.metrics.calibration_up.set(0);
                    tracing::info!("calibration disabled");
                }
                self.publish(c, &state, None);
                tokio::time::sleep(DISABLED_POLL).await;
                continue;
            }
            let target = (c.url.clone(), c.engine);
            if state.target.as_ref() != Some(&target) {
                self.forget(&mut state);
                state.target = Some(target);
                state.last_result = None;
            }
            let client = match &state.client {
                Some((client, tls)) if Arc::ptr_eq(tls, &config.upstream.tls) => client.clone(),
                _ => {
                    let client = build_client(&config.upstream.tls);
                    state.client = Some((client.clone(), config.upstream.tls.clone()));
                    client
                }
            };
            // The status names the target before its first scrape has answered.
            self.publish(c, &state, None);
            let started = Instant::now();
            let scraped = scrape(&client, c).await;
            // Right after the engine answered, so both sides cover the same interval.
            let proxy = self.proxy.snapshot();
            let engine = self.settle(c, &mut state, scraped, proxy);
            state.gpus = if c.gpu_metrics.is_empty() {
                None
            } else {
                Some(scrape_gpus(&client, &c.gpu_metrics, c.timeout).await)
            };
            self.publish(c, &state, engine);
            tokio::time::sleep_until(started + c.interval).await;
        }
    }

    /// Applies one scrape to the tracker, the metrics and the logs; returns the engine.
    fn settle(
        &self,
        c: &Calibration,
        state: &mut State,
        scraped: Result<Extracted, ScrapeError>,
        proxy: engines::Series,
    ) -> Option<super::Engine> {
        let result = scraped
            .as_ref()
            .map_or_else(ScrapeError::result, |_| ScrapeResult::Ok);
        let m = &self.metrics;
        m.calibration_scrapes
            .get_or_create(&ScrapeResultLabel {
                result: result.as_str(),
            })
            .inc();
        m.calibration_up.set(i64::from(result == ScrapeResult::Ok));
        if state.last_result != Some(result) {
            match &scraped {
                Ok(e) => tracing::info!(
                    url = %shown(&c.url),
                    engine = e.engine.as_str(),
                    "calibration: scraping the engine's metrics"
                ),
                Err(error) => tracing::warn!(
                    url = %shown(&c.url),
                    result = result.as_str(),
                    %error,
                    "calibration: scrape failed (retrying every interval; logged again on change)"
                ),
            }
            state.last_result = Some(result);
        }
        let extracted = scraped.ok()?;
        if extracted.dropped_models > 0 && !state.warned_models {
            state.warned_models = true;
            tracing::warn!(
                ignored = extracted.dropped_models,
                kept = engines::MAX_MODELS,
                "calibration: the engine exposes more models than are tracked; the rest are ignored"
            );
        }
        let load = extracted.load;
        let now = std::time::Instant::now();
        let update = state.tracker.observe(extracted.series, proxy, now);
        self.apply(&update);
        let mut preempted = std::collections::BTreeMap::new();
        for (model, l) in &load {
            let before = state.preemptions_total.get(model).copied();
            if let Some(n) = attribution::preemptions_between(before, l.preemptions_total) {
                preempted.insert(model.clone(), n);
            }
        }
        state.preemptions_total = load
            .iter()
            .filter_map(|(m, l)| Some((m.clone(), l.preemptions_total?)))
            .collect();
        state.attribution = attribution::attribute(&state.tracker.comparisons(), &load, &preempted);
        // Only what this interval measured, so windows do not count an idle engine's last
        // means again.
        state.history.push(
            now,
            attribution::attribute(&update.changed, &load, &preempted),
        );
        self.export_attribution(&state.attribution);
        Some(extracted.engine)
    }

    /// Replaces the exported attribution and load series with `attribution`'s.
    fn export_attribution(&self, attribution: &[Attribution]) {
        let m = &self.metrics;
        m.attribution.clear();
        m.engine_kv_cache.clear();
        m.engine_waiting.clear();
        m.engine_running.clear();
        m.engine_preemptions.clear();
        for a in attribution {
            for (phase, v) in a.phases() {
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    m.attribution
                        .get_or_create(&ModelPhase {
                            model: a.model.clone(),
                            phase,
                        })
                        .set(v);
                }
            }
            let labels = EngineModel {
                model: a.model.clone(),
            };
            for (family, v) in [
                (&m.engine_kv_cache, a.kv_cache_usage),
                (&m.engine_waiting, a.requests_waiting),
                (&m.engine_running, a.requests_running),
                (&m.engine_preemptions, a.preemptions),
            ] {
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    family.get_or_create(&labels).set(v);
                }
            }
        }
    }

    fn apply(&self, update: &Update) {
        let m = &self.metrics;
        if update.reset {
            m.calibration_resets.inc();
            tracing::info!("calibration: the engine's counters went back (restart); new baseline");
        }
        for key in &update.removed {
            self.remove(key);
        }
        for c in &update.changed {
            let labels = CalibrationLabels {
                model: c.model.clone(),
                metric: c.metric.as_str(),
            };
            let samples = |source| CalibrationSampleLabels {
                model: c.model.clone(),
                metric: c.metric.as_str(),
                source,
            };
            m.calibration_engine
                .get_or_create(&labels)
                .set(c.engine_seconds);
            m.calibration_samples
                .get_or_create(&samples("engine"))
                .set(i64::try_from(c.engine_samples).unwrap_or(i64::MAX));
            if !c.metric.measured_by_proxy() {
                continue;
            }
            m.calibration_samples
                .get_or_create(&samples("proxy"))
                .set(i64::try_from(c.proxy_samples).unwrap_or(i64::MAX));
            match (c.proxy_seconds, c.difference_seconds) {
                (Some(p), Some(d)) => {
                    m.calibration_proxy.get_or_create(&labels).set(p);
                    m.calibration_difference.get_or_create(&labels).set(d);
                }
                _ => {
                    m.calibration_proxy.remove(&labels);
                    m.calibration_difference.remove(&labels);
                }
            }
        }
    }

    /// Removes every exported series of one comparison.
    fn remove(&self, (quantity, model): &(Quantity, String)) {
        let m = &self.metrics;
        let labels = CalibrationLabels {
            model: model.clone(),
            metric: quantity.as_str(),
        };
        m.calibration_engine.remove(&labels);
        m.calibration_proxy.remove(&labels);
        m.calibration_difference.remove(&labels);
        for source in ["engine", "proxy"] {
            m.calibration_samples.remove(&CalibrationSampleLabels {
                model: model.clone(),
                metric: quantity.as_str(),
                source,
            });
        }
    }

    /// Drops the baseline and every exported comparison.
    fn forget(&self, state: &mut State) {
        for key in state.tracker.clear() {
            self.remove(&key);
        }
        state.warned_models = false;
        state.preemptions_total.clear();
        state.attribution.clear();
        state.history.clear();
        self.export_attribution(&[]);
    }

    fn publish(&self, c: &Calibration, state: &State, engine: Option<super::Engine>) {
        let mut view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        let keep_engine = view.engine;
        *view = Status {
            enabled: c.enabled,
            url: c.enabled.then(|| shown(&c.url)),
            engine: if c.enabled {
                engine.or(keep_engine)
            } else {
                None
            },
            up: c.enabled && state.last_result == Some(ScrapeResult::Ok),
            last_result: state
                .last_result
                .filter(|_| c.enabled)
                .map(ScrapeResult::as_str),
            comparisons: state.tracker.comparisons(),
            attribution: state.attribution.clone(),
            gpus: state.gpus.clone().filter(|_| c.enabled),
            history: state.history.clone(),
        };
    }
}

fn build_client(tls: &Arc<rustls::ClientConfig>) -> ScrapeClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(rustls::ClientConfig::clone(tls))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_max_idle_per_host(1);
    builder.build(connector)
}

/// One GET within `timeout`, and the engine's histograms from the answer.
async fn scrape(client: &ScrapeClient, c: &Calibration) -> Result<Extracted, ScrapeError> {
    scrape_url(client, &c.url, c.timeout, c.engine).await
}

async fn scrape_url(
    client: &ScrapeClient,
    url: &Uri,
    timeout: Duration,
    engine: EngineKind,
) -> Result<Extracted, ScrapeError> {
    let text = tokio::time::timeout(timeout, fetch(client, url))
        .await
        .map_err(|_| ScrapeError::Timeout)??;
    Ok(engines::extract(&text, engine)?)
}

/// Every dcgm-exporter of `urls`, each within `timeout`, as the dashboard shows them.
async fn scrape_gpus(
    client: &ScrapeClient,
    urls: &[Uri],
    timeout: Duration,
) -> super::dcgm::GpuNow {
    let mut readings = Vec::new();
    let (mut up, mut error) = (0, None);
    for (node, url) in urls.iter().enumerate() {
        match tokio::time::timeout(timeout, fetch(client, url)).await {
            Ok(Ok(text)) => {
                up += 1;
                readings.extend(super::dcgm::parse(&text, node, 0.0));
            }
            Ok(Err(e)) => error = Some(format!("{}: {e}", shown(url))),
            Err(_) => error = Some(format!("{}: {}", shown(url), ScrapeError::Timeout)),
        }
    }
    super::dcgm::GpuNow::of(&readings, urls.len(), up, error)
}

/// Scrapes for callers other than the calibration task (a replay watching its target's
/// engine): the same client, request, limits and extraction.
#[derive(Clone)]
pub struct Scraper {
    client: ScrapeClient,
    url: Uri,
    timeout: Duration,
    engine: EngineKind,
}

impl Scraper {
    pub fn new(
        url: Uri,
        timeout: Duration,
        engine: EngineKind,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Scraper {
        Scraper {
            client: build_client(tls),
            url,
            timeout,
            engine,
        }
    }

    /// The URL without credentials.
    pub fn shown_url(&self) -> String {
        shown(&self.url)
    }

    pub async fn scrape(&self) -> Result<Extracted, ScrapeError> {
        scrape_url(&self.client, &self.url, self.timeout, self.engine).await
    }
}

impl ScrapeError {
    /// The closed name of the failure (`unreachable`, `timeout`, `http_error`, ...).
    pub fn kind(&self) -> &'static str {
        self.result().as_str()
    }
}

async fn fetch(client: &ScrapeClient, url: &Uri) -> Result<String, ScrapeError> {
    let mut req = Request::get(url.clone());
    if let Some(h) = req.headers_mut() {
        h.insert(ACCEPT, http::HeaderValue::from_static(ACCEPT_TEXT));
        h.insert(
            USER_AGENT,
            http::HeaderValue::from_static(concat!("goodput/", env!("CARGO_PKG_VERSION"))),
        );
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| ScrapeError::Body(Box::new(e)))?;
    let resp = client.request(req).await.map_err(|e| {
        if e.is_connect() {
            ScrapeError::Unreachable(e)
        } else {
            ScrapeError::Transport(e)
        }
    })?;
    if !resp.status().is_success() {
        return Err(ScrapeError::Status(resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<LengthLimitError>() {
                ScrapeError::TooLarge
            } else {
                ScrapeError::Body(e)
            }
        })?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::NotText)
}

/// The URL as logs and the API show it: no user info, no query.
fn shown(url: &Uri) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let host = url.host().unwrap_or("?");
    match url.port_u16() {
        Some(port) => format!("{scheme}://{host}:{port}{}", url.path()),
        None => format!("{scheme}://{host}{}", url.path()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_credentials() {
        let u: Uri = "https://user:secret@engine.internal:8443/metrics?token=x"
            .parse()
            .unwrap();
        assert_eq!(shown(&u), "https://engine.internal:8443/metrics");
        let u: Uri = "http://10.0.0.1/metrics".parse().unwrap();
        assert_eq!(shown(&u), "http://10.0.0.1/metrics");
    }

    #[test]
    fn results_are_distinct_labels() {
        let all = [
            ScrapeResult::Ok,
            ScrapeResult::Unreachable,
            ScrapeResult::Timeout,
            ScrapeResult::HttpError,
            ScrapeResult::TransportError,
            ScrapeResult::TooLarge,
            ScrapeResult::Invalid,
            ScrapeResult::NoEngineMetrics,
        ];
        let mut names: Vec<_> = all.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}
