//! The TGI `generate_stream` decoder (and the `/generate` body reader): see
//! `goodput_fuzz::check_dialect`.

#![no_main]

use goodput::decode::{Api, StreamKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    goodput_fuzz::check_dialect(
        Api::TgiGenerate {
            stream_endpoint: true,
        },
        StreamKind::Sse,
        data,
    );
});
