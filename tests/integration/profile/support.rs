//! Helpers: synthetic traffic drawn from the simulator's distributions, profile files
//! written from it, and metrics scrapes. (Temporary directories: `common::temp`.)

use std::path::{Path, PathBuf};

use goodput::{
    decode::Api,
    profile::{Anonymizer, Contract, ProfileLine, drift::write_profile, from_unix_ms},
    sim::Dist,
};
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Strings that must never appear in any profile, log or output.
pub const CANARIES: [&str; 4] = [
    "CANARY-PROMPT-7f3a",
    "CANARY-TENANT-91bc",
    "CANARY-REQUEST-ID-55d1",
    "CANARY-COMPLETION-0e2f",
];

pub fn anonymizer(salt: &str) -> Anonymizer {
    Anonymizer::from_salt(salt.as_bytes(), 2048, true, Vec::new())
}

/// `n` chat requests `gap_ms` apart from `start_ms`: input lengths log-normal around 600
/// tokens, outputs around `output_median`; prompts share one of a few long system
/// prompts (so prefix reuse is real) and end with a random question.
pub fn synthetic(
    seed: u64,
    n: usize,
    output_median: f64,
    start_ms: i64,
    gap_ms: i64,
    anon: &Anonymizer,
) -> Vec<ProfileLine> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let input = Dist::LogNormal {
        median: 600.0,
        sigma: 0.6,
    };
    let output = Dist::LogNormal {
        median: output_median,
        sigma: 0.4,
    };
    (0..n)
        .map(|i| {
            let system = format!("system prompt number {} ", rng.random_range(0..4)).repeat(200);
            let body = serde_json::json!({
                "model": "llama",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("question {}", rng.random::<u64>())},
                ],
            })
            .to_string();
            let model = if rng.random_bool(0.8) {
                "llama"
            } else {
                "qwen"
            };
            ProfileLine {
                arrival_ms: start_ms + i as i64 * gap_ms,
                model: Some(model.into()),
                api: "chat_completions".into(),
                stream: true,
                input_tokens: Some(u64::from(input.sample_count(&mut rng).max(1))),
                input_tokens_source: Some("usage"),
                output_tokens: Some(u64::from(output.sample_count(&mut rng).max(1))),
                output_tokens_source: Some("usage"),
                max_tokens: Some(2048),
                outcome: "ok",
                status: Some(200),
                slo_class: "default".into(),
                slo_met: Some(rng.random_bool(0.95)),
                ttft_ms: Some(120.0),
                tpot_ms: Some(20.0),
                e2e_ms: 1500.0,
                tenant: Some(anon.tenant(rng.random_range(0..3))),
                block_hashes: anon.blocks(Api::ChatCompletions, Some(model), body.as_bytes()),
            }
        })
        .collect()
}

/// Writes `lines` as a profile file `dir/name`.
pub fn write_file(dir: &Path, name: &str, lines: &[ProfileLine], anon: &Anonymizer) -> PathBuf {
    let start = lines.iter().map(|l| l.arrival_ms).min().unwrap_or(0);
    let header = anon.header(from_unix_ms(start), &Contract::default());
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    write_profile(&mut file, &header, lines).unwrap();
    path
}

/// The text exposition of a registry, as a scrape would see it.
pub fn scrape(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The value of one sample line in an exposition (0 when absent).
pub fn sample_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A finished record as the aggregator hands it over, with `id` as its request id.
pub fn record(id: &str) -> goodput::measure::RequestRecord {
    use goodput::measure::{Outcome, RequestRecord, TokenSource};
    RequestRecord {
        id: id.into(),
        started_at: goodput::measure::WallClock(std::time::SystemTime::now()),
        model: Some("llama".into()),
        api: "chat_completions",
        stream: true,
        status: Some(200),
        outcome: Outcome::Ok,
        ttft_ms: Some(80.0),
        ttfo_ms: None,
        tpot_ms: Some(12.0),
        e2e_ms: 900.0,
        upload_ms: Some(0.0),
        ttft_after_upload_ms: Some(80.0),
        e2e_after_upload_ms: 900.0,
        itl_ms: None,
        input_tokens: Some(120),
        input_tokens_source: Some(TokenSource::Usage),
        cached_input_tokens: None,
        output_tokens: Some(64),
        output_tokens_source: Some(TokenSource::Usage),
        events: 64,
        bytes_out: 4000,
        terminal_event: false,
        slo_class: "default".into(),
        slo_met: Some(true),
        slo_miss_reason: None,
        slo_miss_component: None,
        engine: Default::default(),
        clock: goodput::measure::Clock::User,
        finished_at: None,
        bytes_in: 3000,
        finish_reason: None,
        decode_failed: false,
        arrival: Default::default(),
        tenant: None,
        slo_overrides: Default::default(),
        slo_header_invalid: 0,
        slo_source: None,
        trace: None,
        pairing: Default::default(),
    }
}
