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
//! With `--tokenizer`, the end of the text is resized until it counts exactly the
//! recorded number of tokens with that tokenizer (a handful of counts per prompt, on the
//! generator's thread: at high rates with long prompts this can show as schedule lag).
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

/// Rounds of proportional resizing, then of one-character steps, before giving up.
const FIT_ROUNDS: usize = 6;
const FINE_STEPS: usize = 24;

/// Resizes the end of `text` until `tok` counts `want` tokens: first proportionally (the
/// text's own bytes per token), then a character or a short word at a time. A handful of
/// counts per prompt; gives up (leaving the closest length found) when the tokenizer
/// fails or will not land exactly.
fn fit_tokens(text: &mut String, tok: &Tokenizer, want: u64, rng: &mut SmallRng) {
    let count = |t: &str| tok.count(t).ok();
    let Some(mut have) = count(text) else { return };
    for _ in 0..FIT_ROUNDS {
        let diff = have.abs_diff(want);
        if diff <= 2 {
            break;
        }
        let per_token = text.len() as f64 / have.max(1) as f64;
        if have > want {
            let keep = (text.len() as f64 * want as f64 / have as f64).floor() as usize;
            text.truncate(keep.min(text.len().saturating_sub(1)));
        } else {
            let target = text.len() + (diff as f64 * per_token).ceil() as usize;
            while text.len() < target {
                push_word(text, rng);
            }
            text.truncate(target);
        }
        let Some(n) = count(text) else { return };
        have = n;
    }
    for _ in 0..FINE_STEPS {
        if have == want {
            return;
        }
        if have > want {
            text.pop();
        } else {
            text.push_str(if text.ends_with(' ') { "a" } else { " a" });
        }
        let Some(n) = count(text) else { return };
        have = n;
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
            tenant: None,
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

    /// One token per letter: the hardest case for word-sized steps.
    fn letter_tokenizer(dir: &std::path::Path) -> Tokenizer {
        use tokenizers::{models::bpe::BPE, pre_tokenizers::whitespace::Whitespace};
        let token = |i: usize| match i {
            0 => "[UNK]".to_owned(),
            i => char::from(b'a' + (i - 1) as u8).to_string(),
        };
        let vocab: [(String, u32); 27] = std::array::from_fn(|i| (token(i), i as u32));
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let mut t = tokenizers::Tokenizer::new(bpe);
        t.with_pre_tokenizer(Some(Whitespace {}));
        let path = dir.join("tokenizer.json");
        t.save(&path, false).unwrap();
        Tokenizer::load(&path).unwrap()
    }

    #[test]
    fn a_tokenizer_makes_lengths_exact() {
        let dir = std::env::temp_dir().join(format!("goodput-prompt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tok = letter_tokenizer(&dir);
        // Loaded into memory: the file and its directory are not needed past this point.
        std::fs::remove_dir_all(&dir).unwrap();
        let p = Prompts::new(3, 64, true, Some(tok.clone()));
        for n in [1, 7, 100, 999] {
            let text = p.text(&template(n, vec![5, 6]), n);
            assert_eq!(tok.count(&text).unwrap(), n, "{n}");
        }
        // The blocks stay the prefix when the text is long enough to hold them.
        let with = p.text(&template(400, vec![5, 6]), 1);
        let without = Prompts::new(3, 64, true, None).text(&template(400, vec![5, 6]), 1);
        assert_eq!(with[..128], without[..128]);
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
