//! What is sent and when: the profile's requests as [`Template`]s (API, model, stream
//! flag, input and output length, prompt blocks), and the schedules that pick them: the
//! profile's own arrival times (trace), uniform draws for closed loops, and Poisson
//! arrivals at a fixed rate (ramp, soak). Everything random is seeded, so a run is
//! repeatable request for request.

use std::{collections::BTreeMap, time::Duration};

use rand::{Rng, SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, Exp};

use crate::profile::{BlockId, BlockUnit, Profile};

/// Prompt text bytes per token when no tokenizer is given: the ratio the profile's byte
/// blocks (2048 bytes ≈ Mooncake's 512 tokens) and the simulator's estimate use.
pub const BYTES_PER_TOKEN: u64 = 4;
/// Input length of a request the profile has no count for (and no blocks).
const DEFAULT_INPUT_TOKENS: u64 = 128;
/// Output length of a request the profile has no count or cap for.
const DEFAULT_OUTPUT_TOKENS: u64 = 128;

/// The two APIs requests are sent as. Profile APIs map onto them: prompt-style APIs
/// (`completions`, `llamacpp_completion`, `ollama_generate`, `tgi_generate`) to
/// completions, everything else (chat, messages, responses, unknown) to chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayApi {
    Chat,
    Completions,
}

impl ReplayApi {
    pub fn from_profile(api: &str) -> ReplayApi {
        match api {
            "completions" | "llamacpp_completion" | "ollama_generate" | "tgi_generate" => {
                ReplayApi::Completions
            }
            _ => ReplayApi::Chat,
        }
    }

    /// The path below the API root (`/v1` unless the target URL names another).
    pub fn path(self) -> &'static str {
        match self {
            ReplayApi::Chat => "/chat/completions",
            ReplayApi::Completions => "/completions",
        }
    }

    pub fn decode_api(self) -> crate::decode::Api {
        match self {
            ReplayApi::Chat => crate::decode::Api::ChatCompletions,
            ReplayApi::Completions => crate::decode::Api::Completions,
        }
    }
}

/// One profile request, as the replay reproduces it.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// Arrival after the profile's first request, ms (unscaled).
    pub at_ms: f64,
    pub api: ReplayApi,
    pub model: Option<String>,
    pub stream: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Seeds of the prompt's blocks, in order: equal profile blocks, equal seeds.
    pub blocks: Vec<u64>,
    /// The profile's salted tenant hash, sent as `[slo] tenant_header` when one is set.
    pub tenant: Option<std::sync::Arc<str>>,
}

/// The requests of a profile and how large one prompt block is.
#[derive(Debug, Clone)]
pub struct Workload {
    pub templates: Vec<Template>,
    /// Bytes of prompt text one profile block stands for.
    pub block_bytes: usize,
    /// Time-averaged concurrency of the recorded traffic (Σ e2e / duration).
    pub concurrency: Option<f64>,
    /// Mean arrival rate of the recorded traffic, requests/s.
    pub rate: Option<f64>,
    /// Trace length (first to last arrival).
    pub span: Duration,
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the profile has no requests to replay")]
    Empty,
}

impl Workload {
    pub fn from_profile(profile: &Profile, model: Option<&str>) -> Result<Workload, PlanError> {
        // Traffic that is no generation (metrics scrapes, probes, model lists, embeddings
        // recorded by older versions) is not replayed as chat requests.
        let generation =
            |l: &&crate::profile::Loaded| crate::decode::is_generation_label(&l.entry.api);
        let first = profile
            .entries
            .iter()
            .find(generation)
            .ok_or(PlanError::Empty)?
            .at_ms;
        let mut notes = Vec::new();
        let skipped = profile.entries.len() - profile.entries.iter().filter(generation).count();
        if skipped > 0 {
            notes.push(format!(
                "{skipped} request(s) that are no generation (api unknown or embeddings) not replayed"
            ));
        }
        let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
        for f in &profile.files {
            let b = f.header.block;
            let bytes = match b.unit {
                BlockUnit::Bytes => u64::from(b.size),
                BlockUnit::Tokens => u64::from(b.size) * BYTES_PER_TOKEN,
            };
            *sizes
                .entry(usize::try_from(bytes).unwrap_or(2048).max(1))
                .or_insert(0) += 1;
        }
        let block_bytes = sizes.keys().next().copied().unwrap_or(2048);
        if sizes.len() > 1 {
            notes.push(format!(
                "profile files use different block sizes; {block_bytes} bytes used for all"
            ));
        }
        let block_tokens = (block_bytes as u64 / BYTES_PER_TOKEN).max(1);
        let identities = profile.block_identities();
        let templates: Vec<Template> = profile
            .entries
            .iter()
            .zip(identities)
            .filter(|(l, _)| generation(l))
            .map(|(l, ids)| {
                let e = &l.entry;
                let blocks: Vec<u64> = ids.iter().map(block_seed).collect();
                let input_tokens = e
                    .input_tokens
                    .or((!blocks.is_empty()).then(|| blocks.len() as u64 * block_tokens))
                    .unwrap_or(DEFAULT_INPUT_TOKENS)
                    .max(1);
                let output_tokens = e
                    .output_tokens
                    .filter(|n| *n > 0)
                    .or(e.max_tokens)
                    .unwrap_or(DEFAULT_OUTPUT_TOKENS)
                    .max(1);
                Template {
                    at_ms: (l.at_ms - first) as f64,
                    api: ReplayApi::from_profile(&e.api),
                    model: model.map(str::to_owned).or_else(|| e.model.clone()),
                    stream: e.stream,
                    input_tokens,
                    output_tokens,
                    blocks,
                    tenant: e.tenant.as_deref().map(std::sync::Arc::from),
                }
            })
            .collect();
        let mapped = profile
            .entries
            .iter()
            .filter(generation)
            .filter(|l| !matches!(l.entry.api.as_str(), "chat_completions" | "completions"))
            .count();
        if mapped > 0 {
            notes.push(format!(
                "{mapped} request(s) of other APIs sent as OpenAI chat or completions"
            ));
        }
        let shape = crate::profile::Shape::of(&crate::profile::samples_of(profile), None);
        let span_ms = templates.last().map_or(0.0, |t| t.at_ms).max(0.0);
        Ok(Workload {
            templates,
            block_bytes,
            concurrency: shape.concurrency,
            rate: (shape.rate_mean > 0.0).then_some(shape.rate_mean),
            span: Duration::from_secs_f64(span_ms / 1000.0),
            notes,
        })
    }

    /// The template of the `i`-th drawn request (uniform over the profile, seeded).
    pub fn draw(&self, seed: u64, i: u64) -> &Template {
        let n = self.templates.len().max(1);
        let k = (mix(seed ^ mix(i.wrapping_add(0x5eed))) % n as u64) as usize;
        &self.templates[k.min(self.templates.len().saturating_sub(1))]
    }
}

/// A block's text seed from its identity: keyed hashes stay themselves (already
/// uniform), file-local ids are mixed so they cannot collide with them by accident.
fn block_seed(id: &BlockId) -> u64 {
    match *id {
        BlockId::Key(k) => k,
        BlockId::Local(file, id) => mix(((file as u64) << 32 | u64::from(id)) ^ 0x10ca1),
    }
}

/// splitmix64's finalizer: spreads nearby integers over the whole range.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Poisson arrivals at `rate` per second: successive offsets from the start.
pub struct Poisson {
    rng: SmallRng,
    exp: Option<Exp<f64>>,
    at: f64,
}

impl Poisson {
    pub fn new(rate: f64, seed: u64) -> Poisson {
        Poisson {
            rng: SmallRng::seed_from_u64(mix(seed ^ 0xa771_7a15)),
            exp: Exp::new(rate).ok(),
            at: 0.0,
        }
    }

    /// The next arrival's offset from the start of the schedule.
    pub fn next_offset(&mut self) -> Duration {
        let gap = match &self.exp {
            Some(e) => e.sample(&mut self.rng),
            None => self.rng.random::<f64>(),
        };
        self.at += gap;
        Duration::from_secs_f64(self.at.min(1e9))
    }
}

/// The rates of a ramp: `start × factor^k` for k = 0 ..< steps.
pub fn ramp_rates(start: f64, factor: f64, steps: u32) -> Vec<f64> {
    (0..steps.max(1))
        .map(|k| start * factor.powi(i32::try_from(k).unwrap_or(i32::MAX)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const HEADER: &str = r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"00","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#;

    fn profile(lines: &[&str]) -> Profile {
        let mut text = format!("{HEADER}\n");
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        let mut p = Profile::default();
        p.add(Path::new("t.jsonl"), text.as_bytes()).unwrap();
        p
    }

    #[test]
    fn templates_follow_the_profile() {
        let p = profile(&[
            r#"{"t_ms":100,"model":"m","api":"chat_completions","stream":true,"input_tokens":700,"output_tokens":20,"outcome":"ok","e2e_ms":50,"hash_ids":[0,1]}"#,
            r#"{"t_ms":300,"model":"m","api":"tgi_generate","stream":false,"output_tokens":0,"max_tokens":64,"outcome":"ok","e2e_ms":50,"hash_ids":[0,2]}"#,
        ]);
        let w = Workload::from_profile(&p, None).unwrap();
        assert_eq!(w.block_bytes, 2048);
        let (a, b) = (&w.templates[0], &w.templates[1]);
        assert_eq!((a.at_ms, b.at_ms), (0.0, 200.0));
        assert_eq!((a.api, b.api), (ReplayApi::Chat, ReplayApi::Completions));
        assert_eq!((a.input_tokens, b.input_tokens), (700, 1024));
        assert_eq!((a.output_tokens, b.output_tokens), (20, 64));
        assert_eq!(a.blocks[0], b.blocks[0]);
        assert_ne!(a.blocks[1], b.blocks[1]);
        assert!(w.notes[0].contains("1 request"), "{:?}", w.notes);
        let forced = Workload::from_profile(&p, Some("cand")).unwrap();
        assert_eq!(forced.templates[1].model.as_deref(), Some("cand"));
        assert!(Workload::from_profile(&profile(&[]), None).is_err());
    }

    #[test]
    fn traffic_that_is_no_generation_is_not_replayed() {
        let p = profile(&[
            r#"{"t_ms":50,"api":"unknown","stream":false,"outcome":"ok","e2e_ms":1}"#,
            r#"{"t_ms":100,"model":"m","api":"chat_completions","stream":true,"output_tokens":20,"outcome":"ok","e2e_ms":50}"#,
            r#"{"t_ms":150,"model":"m","api":"embeddings","stream":false,"input_tokens":9,"outcome":"ok","e2e_ms":5}"#,
            r#"{"t_ms":300,"model":"m","api":"chat_completions","stream":true,"output_tokens":30,"outcome":"ok","e2e_ms":50}"#,
        ]);
        let w = Workload::from_profile(&p, None).unwrap();
        let got: Vec<(f64, u64)> = w
            .templates
            .iter()
            .map(|t| (t.at_ms, t.output_tokens))
            .collect();
        assert_eq!(got, [(0.0, 20), (200.0, 30)]);
        // Nor counted in the profile's shape (rates, mix, drift baselines).
        assert_eq!(crate::profile::samples_of(&p).len(), 2);
        assert!(
            w.notes.iter().any(|n| n.contains("2 request(s)")),
            "{:?}",
            w.notes
        );
        let only_probes =
            profile(&[r#"{"t_ms":50,"api":"unknown","stream":false,"outcome":"ok","e2e_ms":1}"#]);
        assert!(Workload::from_profile(&only_probes, None).is_err());
    }

    #[test]
    fn draws_and_arrivals_are_seeded() {
        let p = profile(&[
            r#"{"t_ms":0,"api":"chat_completions","stream":true,"output_tokens":1,"outcome":"ok","e2e_ms":1}"#,
            r#"{"t_ms":1,"api":"chat_completions","stream":true,"output_tokens":2,"outcome":"ok","e2e_ms":1}"#,
        ]);
        let w = Workload::from_profile(&p, None).unwrap();
        let seq = |seed| {
            (0..64)
                .map(|i| w.draw(seed, i).output_tokens)
                .collect::<Vec<_>>()
        };
        assert_eq!(seq(1), seq(1));
        assert!(seq(1).contains(&1) && seq(1).contains(&2));
        let mut a = Poisson::new(100.0, 7);
        let last = (0..1000).map(|_| a.next_offset()).last().unwrap();
        assert!((8.0..12.0).contains(&last.as_secs_f64()), "{last:?}");
        assert_eq!(ramp_rates(2.0, 1.5, 3), [2.0, 3.0, 4.5]);
    }
}
