//! goodput's integration tests, one binary with a module per scenario. Every test talks to
//! goodput over real loopback sockets, with the built-in simulator or a purpose-built fake
//! upstream ([`common`]) and a real HTTP client.

#[macro_use]
mod common;

mod admin_auth;
mod calibration;
mod capture;
mod complete;
mod dashboard;
mod engine_timings;
mod faults;
mod forwarding;
mod hostile;
mod injection;
mod native_histograms;
mod operational;
mod otlp;
mod profile;
mod protocols;
mod reload;
mod replay;
mod reuse_port;
mod shadow;
mod slo;
mod smoke;
mod tokenize;
