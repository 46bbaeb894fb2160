//! goodput: a transparent, streaming-aware reverse proxy for LLM inference gateways that
//! timestamps every streamed event and reports TTFT, TPOT, inter-token latency, end-to-end
//! latency and outcomes from real traffic. See docs/DESIGN.md for the definitions and
//! `docs/LIFECYCLE.md` for where each timestamp is taken.
//!
//! # Layout
//! Listed from the top of the house down: a module imports only modules listed after it
//! (`scripts/layers-check.py` keeps it so; docs/DESIGN.md "Layers").
//! - [`demo`]: simulator + proxy + synthetic load, with a live summary line.
//! - [`replay`]: `goodput replay`: a profile against a candidate system, acceptance report.
//! - [`run`]: wiring of all of the above into a running server with graceful shutdown:
//!   builds each subsystem from its configuration section, loads the files the
//!   configuration names, registers every subsystem's metrics in one registry.
//! - [`admin`]: `/metrics`, the JSON API, health and readiness, on their own address.
//! - [`shadow`]: a mirrored share of the traffic sent to a candidate, paired and judged.
//! - [`proxy`]: the data path in two wings: the client side (listener, TLS, HTTP/1.1 +
//!   HTTP/2) and the upstream side (pool, relay, hyper's client); forwarding, tunnels.
//! - [`otlp`]: OpenTelemetry export (GenAI metrics, request spans) to a collector.
//! - [`stats`]: the aggregator that finishes records, updates metrics, keeps recent ones,
//!   and hands them to the sinks it is given.
//! - [`calibrate`]: the engine's own latency metrics, scraped, beside the proxy's.
//! - [`profile`]: anonymized traffic profiles: recording, drift detection, exports.
//! - [`tokenize`]: token counts where the upstream reports no usage, on a worker pool.
//! - [`measure`]: the tower layer and body wrappers that time each request into a record.
//! - [`usage_injection`]: asking a streaming upstream for usage, and hiding its answer.
//! - [`telemetry`]: logging set-up.
//! - [`fetch`]: one small GET client (timeouts, body limit) for what goodput reads beside
//!   the traffic: exporters, the target's self-description.
//! - [`identity`]: what the upstream says it is (engine, version, model), read and compared.
//! - [`config`]: plain data: the TOML schema, flag overrides and validation into a runtime
//!   snapshot.
//! - [`slo`]: SLO classes, matching a request to its class, globs, tenant hashes.
//! - [`decode`]: SSE framing and per-dialect token events; request/body inspection.
//! - [`metrics`]: every exported metric's name, help text and unit, and the label sets.
//! - [`quantile`]: the nearest-rank percentile of the exact views.
//! - [`sim`]: an OpenAI-compatible upstream simulator for the demo, tests and benchmarks.

#![forbid(unsafe_code)]

pub mod admin;
pub mod calibrate;
pub mod config;
pub mod decode;
pub mod demo;
pub mod fetch;
pub mod identity;
pub mod measure;
pub mod metrics;
pub mod otlp;
pub mod profile;
pub mod proxy;
pub mod quantile;
pub mod replay;
pub mod run;
pub mod shadow;
pub mod sim;
pub mod slo;
pub mod stats;
pub mod telemetry;
pub mod tokenize;
pub mod usage_injection;

/// The boxed error type bodies carry across the data path.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
