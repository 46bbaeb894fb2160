//! The OpenAI chunk scanner against serde's derive: wherever the scanner answers, both
//! must agree. The input is checked whole and line by line (`data:` stripped), so the
//! SSE fixtures seed it with real chunks; the lines also go through a chunk template in
//! order, which must agree with the classifier on each.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    assert!(
        goodput::decode::openai::scan_agrees(data),
        "scanner and serde disagree on the whole input"
    );
    assert!(
        goodput::decode::openai::template_agrees(data),
        "the chunk template disagrees"
    );
    for line in data.split(|&b| b == b'\n') {
        let chunk = line.strip_prefix(b"data:").unwrap_or(line);
        assert!(
            goodput::decode::openai::scan_agrees(chunk),
            "scanner and serde disagree on {:?}",
            String::from_utf8_lossy(chunk)
        );
    }
});
