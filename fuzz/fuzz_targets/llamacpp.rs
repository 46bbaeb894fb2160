//! The llama.cpp server `/completion` decoder, streamed and as a body: see
//! `goodput_fuzz::check_dialect`.

#![no_main]

use goodput::decode::{Api, StreamKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    goodput_fuzz::check_dialect(Api::LlamaCppCompletion, StreamKind::Sse, data);
});
