//! Anonymized traffic profiles end to end: recording through the writer (rotation,
//! retention, torn lines, disk errors, canaries), the `goodput profile` commands as a user
//! runs them (the real binary: summarize, diff, export, merge, sample, exit codes), the
//! drift webhook against a local HTTP server, and (ignored; for `scripts/aiperf-check.sh`)
//! a capture of simulator traffic through the proxy.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

mod capture;
mod cli;
mod recording;
mod support;
mod webhook;
