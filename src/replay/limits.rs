//! `--mode limits`: the deployment's limits found, not assumed. Before the steps run,
//! single requests probe the largest input the target accepts (doubling from
//! [`START_TOKENS`] until one is refused, then halving the gap to [`PRECISION`]) and the
//! longest output it gives; the steps that follow give the concurrency ceiling at the SLO
//! (the max stable concurrency).
//!
//! A probe is accepted when its answer is a 2xx that ended well; refused otherwise (a
//! 400, 413 or 422 for a context too long, an error in the stream, a timeout), and the
//! refusal is noted with its status. Probes run one at a time, never beside the load.

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::watch;

use super::{
    client::{Client, Outgoing},
    plan::{ReplayApi, Template},
    prompt::Prompts,
};
use crate::measure::{Outcome, TokenSource};

/// The first input length tried.
pub const START_TOKENS: u64 = 1024;
/// Inputs are not tried past this (2 Mi tokens): a target that takes it is reported as
/// taking at least that much.
pub const MAX_TOKENS: u64 = 2 << 20;
/// The search stops when the refused and accepted lengths are this close (relative).
pub const PRECISION: f64 = 0.01;
/// At most this many input probes.
pub const MAX_INPUT_PROBES: u32 = 15;
/// Input length of the output probe.
const OUTPUT_PROBE_INPUT: u64 = 16;
/// Output probes, each asking half as much as the one refused before it.
const MAX_OUTPUT_PROBES: u32 = 4;

/// report.json `limits`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct LimitsOut {
    /// The largest input accepted (tokens, as the prompts are sized: see `tokenizer`).
    pub max_input_tokens: Option<u64>,
    /// The same request as the target counted it (its `usage`), chat template and all:
    /// what its context limit is measured in.
    pub max_input_tokens_by_target: Option<u64>,
    /// The smallest input refused, and what the refusal was.
    pub refused_input_tokens: Option<u64>,
    pub refused_with: Option<String>,
    /// The longest output given to one request asking for `output_asked` tokens (with
    /// `ignore_eos`): below the ask when the target caps it.
    pub max_output_tokens: Option<u64>,
    pub output_asked: Option<u64>,
    /// How the output ended (`length`: capped or as asked).
    pub output_finish_reason: Option<String>,
    /// The max stable concurrency of the steps that followed.
    pub ceiling_concurrency: Option<u32>,
    /// How prompt lengths were counted: the tokenizer's path, or 4 bytes a token.
    pub tokenizer: String,
    pub probes: u32,
}

/// What one probe got.
struct Answer {
    accepted: bool,
    /// `HTTP 400`, `timeout`, ...
    why: String,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    finish: Option<String>,
}

/// Sends single requests through `client`.
pub struct Prober<'a> {
    pub client: &'a Client,
    pub prompts: &'a Prompts,
    pub model: Option<&'a str>,
    pub api: ReplayApi,
    /// Each probe's own deadline: past it the probe counts as refused (`timeout`).
    pub timeout: Duration,
}

impl Prober<'_> {
    async fn probe(&self, seq: u64, input_tokens: u64, max_tokens: u64) -> Answer {
        let t = Template {
            at_ms: 0.0,
            api: self.api,
            model: self.model.map(str::to_owned),
            stream: true,
            input_tokens,
            output_tokens: max_tokens,
            blocks: Vec::new(),
            tenant: None,
        };
        let out = Outgoing {
            api: self.api,
            model: self.model.map(str::to_owned),
            body: Bytes::from(self.prompts.body(&t, u64::MAX - seq)),
            id: format!("limits-{seq}"),
            concurrency: 1,
            probe: None,
            inject: None,
            tenant: None,
        };
        let (_stop_tx, stop) = watch::channel(false);
        match tokio::time::timeout(self.timeout, self.client.send(out, stop)).await {
            Err(_) => Answer {
                accepted: false,
                why: "timeout".into(),
                input_tokens: None,
                output_tokens: None,
                finish: None,
            },
            Ok(m) => {
                let r = &m.record;
                let ok = r.outcome == Outcome::Ok && r.status.is_some_and(|s| s < 300);
                Answer {
                    accepted: ok,
                    why: match r.status {
                        Some(s) if s >= 300 => format!("HTTP {s}"),
                        _ => r.outcome.as_str().to_owned(),
                    },
                    // Only the target's own count.
                    input_tokens: r
                        .input_tokens
                        .filter(|_| r.input_tokens_source == Some(TokenSource::Usage)),
                    output_tokens: r.output_tokens,
                    finish: r.finish_reason.and_then(|f| {
                        serde_json::to_value(f)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                    }),
                }
            }
        }
    }

    /// Finds the limits; `tokenizer` says how prompt lengths are counted.
    pub async fn find(&self, tokenizer: String) -> LimitsOut {
        let mut out = LimitsOut {
            tokenizer,
            ..LimitsOut::default()
        };
        let mut seq = 0u64;
        let (mut lo, mut hi): (Option<u64>, Option<u64>) = (None, None);
        let mut size = START_TOKENS;
        // Doubling until a refusal (or the ceiling), then halving the gap.
        while out.probes < MAX_INPUT_PROBES {
            out.probes += 1;
            seq += 1;
            let a = self.probe(seq, size, 1).await;
            if a.accepted {
                lo = Some(size);
                out.max_input_tokens_by_target = a.input_tokens;
            } else {
                hi = Some(size);
                out.refused_with = Some(a.why);
            }
            size = match (lo, hi) {
                (Some(l), None) if l >= MAX_TOKENS => break,
                (_, None) => (size * 2).min(MAX_TOKENS),
                // Refused from the first: try smaller.
                (None, Some(h)) if h <= 1 => break,
                (None, Some(h)) => h / 2,
                (Some(l), Some(h)) => {
                    if (h - l) as f64 <= (l as f64 * PRECISION).max(1.0) {
                        break;
                    }
                    l + (h - l) / 2
                }
            };
        }
        out.max_input_tokens = lo;
        out.refused_input_tokens = hi;
        // The output: a short prompt asking for as much as the context allows.
        let mut ask = lo
            .unwrap_or(START_TOKENS)
            .saturating_sub(OUTPUT_PROBE_INPUT * 2)
            .max(1);
        for _ in 0..MAX_OUTPUT_PROBES {
            out.probes += 1;
            seq += 1;
            let a = self.probe(seq, OUTPUT_PROBE_INPUT, ask).await;
            if a.accepted {
                out.max_output_tokens = a.output_tokens;
                out.output_asked = Some(ask);
                out.output_finish_reason = a.finish;
                break;
            }
            ask = (ask / 2).max(1);
        }
        out
    }
}
