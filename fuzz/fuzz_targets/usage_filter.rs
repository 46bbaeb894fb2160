//! Usage injection's response filter: the same output bytes whatever the chunking, and a
//! stream that cannot hold a usage chunk passes through byte for byte.

#![no_main]

use bytes::Bytes;
use goodput::usage_injection::UsageFilter;
use goodput_fuzz::Input;
use libfuzzer_sys::fuzz_target;

fn filter(chunks: &[&[u8]]) -> Vec<u8> {
    let mut filter = UsageFilter::new();
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend_from_slice(&filter.push(Bytes::copy_from_slice(chunk)));
    }
    out.extend_from_slice(&filter.finish());
    assert!(!filter.holds());
    out
}

fuzz_target!(|data: &[u8]| {
    let input = Input::new(data);
    let whole = filter(&[input.payload]);
    assert_eq!(
        whole,
        filter(&input.chunks()),
        "chunking changed the output"
    );
    assert!(whole.len() <= input.payload.len());
    if !input.payload.windows(5).any(|w| w == b"usage") {
        assert_eq!(whole, input.payload, "a stream without usage was changed");
    }
});
