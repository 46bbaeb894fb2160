//! Raw HTTP/1 bytes (a client's, then the upstream's answer) through the real proxy with
//! hyper's HTTP/1 server in front of the clients; the invariants are
//! `goodput_fuzz::exchange`'s (no panic, every measurement ends, every request the upstream
//! saw has its record, well-framed responses, the upstream's body passed on unchanged).

#![no_main]

use goodput_fuzz::exchange::{Server, run};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(data, Server::Hyper));
