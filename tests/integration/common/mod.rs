//! Shared support for goodput's integration tests.
//!
//! It holds test doubles that run on `127.0.0.1:0` inside the test's own tokio runtime:
//!
//! - [`harness`]: goodput and the simulator started in-process, a real HTTP client, and
//!   readers for the admin API and `/metrics`.
//! - [`fake`]: a purpose-built, misbehaving upstream HTTP/1.1 server written over raw tokio
//!   TCP, so a test controls every byte and the socket itself (dribbled chunks, slow first
//!   token, reset or close mid-stream, stalls, wrong framing) and can see what the proxy sent
//!   upstream and when it hung up.
//!
//! [`temp`] gives a test a scratch directory of its own, removed when the test ends;
//! [`wait`] polls, bounded, for work that finishes off the data path.

#[macro_use]
pub mod wait;

pub mod binary;
pub mod fake;
pub mod harness;
pub mod temp;

/// Timing-sensitive tests (replay's load generators, simulators and child processes) run
/// one at a time: on two cores they would measure each other.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
