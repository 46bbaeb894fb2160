//! goodput: a transparent, streaming-aware reverse proxy for LLM inference gateways that
//! timestamps every streamed event and reports TTFT, TPOT, inter-token latency, end-to-end
//! latency and outcomes from real traffic. See docs/DESIGN.md for the definitions and
//! `docs/LIFECYCLE.md` for where each timestamp is taken.
//!
//! # Layout
//! - [`config`]: the TOML schema, flag overrides and validation into a runtime snapshot.
//! - [`proxy`]: the data path: listener, TLS, HTTP/1.1 + HTTP/2, forwarding, tunnels.
//! - [`decode`]: SSE framing and per-dialect token events; request/body inspection.
//! - [`measure`]: the tower layer and body wrappers that time each request into a record.
//! - [`tokenize`]: token counts where the upstream reports no usage, on a worker pool.
//! - [`profile`]: anonymized traffic profiles: recording, drift detection, exports.
//! - [`replay`]: `goodput replay`: a profile against a candidate system, acceptance report.
//! - [`stats`]: the aggregator that finishes records, updates metrics, keeps recent ones.
//! - [`admin`]: `/metrics`, the JSON API, health and readiness, on their own address.
//! - [`calibrate`]: the engine's own latency metrics, scraped, beside the proxy's.
//! - [`otlp`]: OpenTelemetry export (GenAI metrics, request spans) to a collector.
//! - [`sim`]: an OpenAI-compatible upstream simulator for the demo, tests and benchmarks.
//! - [`run`]: wiring of all of the above into a running server with graceful shutdown.
//! - [`demo`]: simulator + proxy + synthetic load, with a live summary line.
//! - [`telemetry`]: logging set-up.

#![forbid(unsafe_code)]

pub mod admin;
pub mod calibrate;
pub mod config;
pub mod decode;
pub mod demo;
pub mod measure;
pub mod metrics;
pub mod otlp;
pub mod profile;
pub mod proxy;
pub mod quantile;
pub mod replay;
pub mod run;
pub mod sim;
pub mod slo;
pub mod stats;
pub mod telemetry;
pub mod tokenize;
pub mod usage_injection;

/// The boxed error type bodies carry across the data path.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
