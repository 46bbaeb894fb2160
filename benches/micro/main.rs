//! Micro-benchmarks of what goodput does per streamed event: SSE framing, each dialect's
//! stream decoder, the per-request measurement and record path, and histogram recording.
//!
//! `cargo bench --bench micro` runs divan's statistics (with bytes/s and events/s), then
//! prints one summary table of nanoseconds per event (median of repeated batches).
//! `cargo bench --bench micro -- sse` filters by name as divan does (the summary is
//! skipped when a filter is given). See docs/PERFORMANCE.md for the method, and `main` for
//! running one case under a profiler.

mod cases;
mod corpus;
mod decode;
mod record;

use divan::{
    Bencher,
    counter::{BytesCount, ItemsCount},
};

use cases::Case;

fn main() {
    // For profilers: `GOODPUT_MICRO_PROFILE=<case> valgrind --tool=callgrind <micro binary>`
    // runs that one case (`GOODPUT_MICRO_CALLS` times, default 200) and nothing else.
    if let Ok(name) = std::env::var("GOODPUT_MICRO_PROFILE") {
        let calls = std::env::var("GOODPUT_MICRO_CALLS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(200);
        cases::profile(all_cases(), &name, calls);
        return;
    }
    divan::main();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test --benches` passes neither it nor a filter
    // worth a summary, and divan has then run each benchmark once.
    let filtered = args.iter().any(|a| !a.starts_with('-') || a == "--list");
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test") && !filtered {
        cases::print_summary(all_cases());
    }
}

fn all_cases() -> Vec<Case> {
    let mut cases = decode::cases();
    cases.extend(record::cases());
    cases
}

fn case_names() -> Vec<&'static str> {
    all_cases().iter().map(|c| c.name).collect()
}

/// One divan benchmark per case; an iteration is one pass over the case's events.
#[divan::bench(args = case_names())]
fn per_event(bencher: Bencher, name: &str) {
    let Some(mut case) = all_cases().into_iter().find(|c| c.name == name) else {
        return;
    };
    let events = case.events;
    let bytes = case.bytes;
    let mut bencher = bencher.counter(ItemsCount::new(events));
    if bytes > 0 {
        bencher = bencher.counter(BytesCount::new(bytes));
    }
    bencher.bench_local(|| (case.run)());
}
