//! Request bodies that reproduce a profile request without its content.
//!
//! The prompt is made of common English words. Each profile block (`hash_ids`) becomes
//! `block_bytes` bytes of text generated from the block's identity and the run's seed
//! alone, so requests that shared a prefix in production share exactly that prefix here
//! and prefix caching on the target behaves as it did. What follows the blocks (or a
//! request without blocks) is generated from the request's own sequence number, so it is
//! shared with nobody.
//!
//! Length: without a tokenizer, ~4 bytes of text per recorded input token
//! ([`BYTES_PER_TOKEN`]), the ratio the profile's byte blocks assume; most words in the
//! vocabulary are one token with their leading space in common BPE vocabularies, so the
//! target counts close to the recorded length (chat templates add their own few tokens).
//! With `--tokenizer`, words are added or removed until the text counts exactly the
//! recorded number of tokens with that tokenizer (a few rounds; merges across a word
//! boundary can leave it one off).
//!
//! Output: `max_tokens` = the recorded output length, with `ignore_eos: true` (unless
//! turned off) so the target generates all of it; streams ask for usage
//! (`stream_options.include_usage`) so token counts are the target's own.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::{Value, json};

use super::plan::{BYTES_PER_TOKEN, ReplayApi, Template, mix};
use crate::tokenize::Tokenizer;

/// Short common words: with their separating space they average about 4 bytes.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "use", "an",
    "each", "she", "do", "how", "if", "will", "up", "out", "many", "then", "them", "so", "some",
    "her", "make", "like", "him", "into", "time", "has", "look", "two", "more", "go", "see", "way",
    "who", "may", "down", "side", "been", "now", "find", "any", "new", "work", "part", "take",
    "get", "made", "live", "back", "only", "year", "came", "show", "good", "me", "give", "our",
    "name", "very", "just", "form", "much", "say", "help", "low", "line", "turn", "same", "mean",
    "move", "boy", "old", "too", "does", "tell", "set", "want", "air", "well", "also", "play",
    "end", "put", "home", "read", "hand", "port", "add", "even", "land", "here", "must", "big",
    "high", "such", "act", "why", "ask", "men", "went", "off", "need", "try", "us", "page", "few",
    "day", "own", "far", "sun", "run", "my", "no", "a", "am", "yes", "let", "top", "sea", "eye",
    "car", "dog", "cat", "red", "box", "job", "key", "map", "hot", "fit", "kid", "art", "bed",
    "cut", "lot", "pay",
];

/// How request bodies are made for one run. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Prompts {
    seed: u64,
    block_bytes: usize,
    ignore_eos: bool,
    tokenizer: Option<Tokenizer>,
}

impl Prompts {
    pub fn new(
        seed: u64,
        block_bytes: usize,
        ignore_eos: bool,
        tokenizer: Option<Tokenizer>,
    ) -> Prompts {
        Prompts {
            seed,
            block_bytes: block_bytes.max(1),
            ignore_eos,
            tokenizer,
        }
    }

    /// The prompt text of the `seq`-th request sent, from its template.
    pub fn text(&self, t: &Template, seq: u64) -> String {
        let target = usize::try_from(t.input_tokens.saturating_mul(BYTES_PER_TOKEN))
            .unwrap_or(usize::MAX)
            .min(64 << 20);
        let mut out = String::with_capacity(target + 16);
        for block in &t.blocks {
            if out.len() >= target {
                break;
            }
            block_text(mix(self.seed ^ block), self.block_bytes, &mut out);
        }
        let mut tail = SmallRng::seed_from_u64(mix(self.seed ^ mix(seq ^ 0x7a11)));
        while out.len() < target {
            push_word(&mut out, &mut tail);
        }
        out.truncate(target);
        if let Some(tok) = &self.tokenizer {
            fit_tokens(&mut out, tok, t.input_tokens, &mut tail);
        }
        out
    }

    /// The JSON body of the `seq`-th request.
    pub fn body(&self, t: &Template, seq: u64) -> Vec<u8> {
        let text = self.text(t, seq);
        let mut body = match t.api {
            ReplayApi::Chat => json!({ "messages": [{ "role": "user", "content": text }] }),
            ReplayApi::Completions => json!({ "prompt": text }),
        };
        if let Value::Object(m) = &mut body {
            if let Some(model) = &t.model {
                m.insert("model".into(), json!(model));
            }
            m.insert("max_tokens".into(), json!(t.output_tokens));
            m.insert("stream".into(), json!(t.stream));
            if t.stream {
                m.insert("stream_options".into(), json!({ "include_usage": true }));
            }
            if self.ignore_eos {
                m.insert("ignore_eos".into(), json!(true));
            }
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// Appends exactly `bytes` bytes of the block whose text seed is `seed`; the text does not
/// depend on what precedes it.
fn block_text(seed: u64, bytes: usize, out: &mut String) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut block = String::with_capacity(bytes + 8);
    while block.len() < bytes {
        push_word(&mut block, &mut rng);
    }
    block.truncate(bytes);
    out.push_str(&block);
}

fn push_word(out: &mut String, rng: &mut SmallRng) {
    if !out.is_empty() && !out.ends_with(' ') {
        out.push(' ');
    }
    out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
}

/// Adds or removes words at the end until `tok` counts `want` tokens (a few rounds).
fn fit_tokens(text: &mut String, tok: &Tokenizer, want: u64, rng: &mut SmallRng) {
    for _ in 0..8 {
        let Ok(have) = tok.count(text) else { return };
        if have == want {
            return;
        }
        if have < want {
            for _ in 0..want - have {
                push_word(text, rng);
            }
        } else {
            for _ in 0..have - want {
                let cut = text.trim_end().rfind(' ').unwrap_or(0);
                text.truncate(cut);
                if text.is_empty() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(input_tokens: u64, blocks: Vec<u64>) -> Template {
        Template {
            at_ms: 0.0,
            api: ReplayApi::Chat,
            model: Some("m".into()),
            stream: true,
            input_tokens,
            output_tokens: 7,
            blocks,
        }
    }

    #[test]
    fn identical_hash_ids_give_identical_prefixes() {
        let p = Prompts::new(42, 64, true, None);
        let a = p.text(&template(100, vec![11, 22, 33]), 1);
        let b = p.text(&template(100, vec![11, 22, 44]), 2);
        let c = p.text(&template(40, vec![11, 22]), 3);
        assert_eq!(a.len(), 400);
        assert_eq!(a[..128], b[..128], "the two shared blocks");
        assert_ne!(a[128..192], b[128..192], "the third block differs");
        assert_eq!(a[..128], c[..128]);
        assert_ne!(a[192..], b[192..], "tails are per request");
        // Another seed gives other text for the same ids.
        let other = Prompts::new(43, 64, true, None).text(&template(100, vec![11, 22]), 1);
        assert_ne!(a[..64], other[..64]);
        // A block's text is the same wherever it is asked for (deterministic).
        assert_eq!(a, p.text(&template(100, vec![11, 22, 33]), 1));
    }

    #[test]
    fn length_follows_input_tokens() {
        let p = Prompts::new(1, 2048, true, None);
        for n in [1, 10, 513, 4000] {
            let text = p.text(&template(n, Vec::new()), n);
            assert_eq!(text.len() as u64, n * BYTES_PER_TOKEN);
            let words = text.split(' ').count() as f64;
            assert!(
                n < 10 || (words / n as f64 - 1.0).abs() < 0.35,
                "{n}: {words} words"
            );
        }
        let avg = WORDS.iter().map(|w| w.len() + 1).sum::<usize>() as f64 / WORDS.len() as f64;
        assert!((3.5..4.5).contains(&avg), "{avg}");
    }

    #[test]
    fn bodies_ask_for_the_recorded_output() {
        let p = Prompts::new(1, 64, true, None);
        let v: Value = serde_json::from_slice(&p.body(&template(5, vec![]), 0)).unwrap();
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        assert_eq!(v["messages"][0]["content"].as_str().unwrap().len(), 20);
        let mut t = template(5, vec![]);
        (t.api, t.stream, t.model) = (ReplayApi::Completions, false, None);
        let q = Prompts::new(1, 64, false, None);
        let v: Value = serde_json::from_slice(&q.body(&t, 0)).unwrap();
        assert!(v.get("ignore_eos").is_none() && v.get("model").is_none());
        assert!(v.get("stream_options").is_none() && v["prompt"].is_string());
    }
}
