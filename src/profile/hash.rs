//! Prefix-reuse fingerprints and salted identifiers.
//!
//! `hash_ids` are Mooncake-style: the prompt is cut into fixed-size blocks and block `i`
//! is fingerprinted as `h_i = BLAKE3_keyed(key, h_{i-1} || block_i)` (with `h_{-1} = 0`),
//! so two prompts share their leading fingerprints exactly as far as they share whole
//! leading blocks, and a fingerprint says nothing about a block's content without the
//! key: a dictionary of likely prompts cannot be hashed and looked up. The key is derived
//! from the salt (`[profile] salt`, or random per process and kept only in memory) with
//! BLAKE3's key derivation; the salt itself is never written, only [`salt_id`], a one-way
//! id of it. Rotating the salt makes files unlinkable.
//!
//! Without a tokenizer the blocks are bytes of the prompt text ([`prompt_bytes`]):
//! `block_bytes = 2048` approximates Mooncake's 512 tokens at ~4 bytes per token.

use std::sync::Arc;

use crate::decode::Api;

const BLOCK_CONTEXT: &str = "goodput profile 2025 prompt blocks v1";
const TENANT_CONTEXT: &str = "goodput profile 2025 tenant v1";
const ID_CONTEXT: &str = "goodput profile 2025 salt id v1";

/// Separates the prompt's pieces (messages, system prompt, ...) so that `["ab", "c"]` and
/// `["a", "bc"]` differ; a control character that JSON text rarely carries.
const PIECE_SEPARATOR: u8 = 0x1e;

/// A short one-way id of a salt (16 hex digits): equal ids mean equal salts.
pub fn salt_id(salt: &[u8]) -> String {
    hex(&blake3::derive_key(ID_CONTEXT, salt)[..8])
}

/// Chained keyed fingerprints of consecutive `block`-byte blocks of `prompt` (the last
/// one may be shorter): `ceil(len / block)` values. `block = 0` is read as 1.
pub fn block_hashes(salt: &[u8], prompt: &[u8], block: usize) -> Vec<u64> {
    chain(&blake3::derive_key(BLOCK_CONTEXT, salt), prompt, block)
}

/// As [`block_hashes`] over token ids (little-endian u32 each), `block` tokens a block.
pub fn token_block_hashes(salt: &[u8], tokens: &[u32], block: usize) -> Vec<u64> {
    let key = blake3::derive_key(BLOCK_CONTEXT, salt);
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    chain(&key, &bytes, block.max(1).saturating_mul(4))
}

fn chain(key: &[u8; 32], data: &[u8], block: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(data.len().div_ceil(block.max(1)));
    let mut prev = 0u64;
    for chunk in data.chunks(block.max(1)) {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&prev.to_le_bytes());
        h.update(chunk);
        prev = first_u64(h.finalize().as_bytes());
        out.push(prev);
    }
    out
}

fn first_u64(bytes: &[u8; 32]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The prompt text of a request body in the dialect of `api` (messages, system prompt,
/// instructions, prompt, inputs, tool definitions), pieces joined by a separator; `None`
/// when the body is not JSON or carries no text (a prompt of token ids only). Uses the
/// same extraction as token counting ([`crate::tokenize::prompt`]).
pub fn prompt_bytes(api: Api, body: &[u8]) -> Option<Vec<u8>> {
    let value = crate::tokenize::prompt::parse(body)?;
    let prompt = crate::tokenize::prompt::extract(api, &value);
    let mut out = Vec::new();
    for (i, piece) in prompt.pieces.iter().enumerate() {
        if i > 0 {
            out.push(PIECE_SEPARATOR);
        }
        out.extend_from_slice(piece.as_bytes());
    }
    (!out.is_empty()).then_some(out)
}

/// Everything the profile side hashes with, derived once from the salt. Cheap to clone.
/// Only derived keys are kept, never the salt; `Debug` shows the salt id alone.
#[derive(Clone)]
pub struct Anonymizer {
    inner: Arc<Keys>,
}

struct Keys {
    block_key: [u8; 32],
    tenant_key: [u8; 32],
    salt_id: String,
    block_bytes: usize,
    hash_ids: bool,
    skip: Vec<String>,
}

impl std::fmt::Debug for Anonymizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anonymizer")
            .field("salt_id", &self.inner.salt_id)
            .field("block_bytes", &self.inner.block_bytes)
            .finish_non_exhaustive()
    }
}

impl Anonymizer {
    /// From `[profile]`: its salt, or 32 random bytes kept only in this value. Create one
    /// per process and share it (recorder and drift monitor must hash alike).
    pub fn new(cfg: &crate::config::ProfileConfig) -> Anonymizer {
        let random: [u8; 32] = rand::random();
        let salt = cfg.salt.as_deref().map_or(&random[..], str::as_bytes);
        Anonymizer::from_salt(
            salt,
            cfg.block_bytes,
            cfg.hash_ids,
            cfg.hash_ids_skip.clone(),
        )
    }

    /// With an explicit salt (tests, tools).
    pub fn from_salt(salt: &[u8], block_bytes: usize, hash_ids: bool, skip: Vec<String>) -> Self {
        Anonymizer {
            inner: Arc::new(Keys {
                block_key: blake3::derive_key(BLOCK_CONTEXT, salt),
                tenant_key: blake3::derive_key(TENANT_CONTEXT, salt),
                salt_id: salt_id(salt),
                block_bytes: block_bytes.max(1),
                hash_ids,
                skip,
            }),
        }
    }

    pub fn salt_id(&self) -> &str {
        &self.inner.salt_id
    }

    pub fn block(&self) -> super::format::Block {
        super::format::Block {
            unit: super::format::BlockUnit::Bytes,
            size: u32::try_from(self.inner.block_bytes).unwrap_or(u32::MAX),
        }
    }

    /// The profile's tenant id: the record's (already salted) tenant hash, hashed again
    /// under this salt, so rotating the profile salt also unlinks tenants.
    pub fn tenant(&self, tenant_hash: u64) -> String {
        let h = blake3::keyed_hash(&self.inner.tenant_key, &tenant_hash.to_le_bytes());
        hex(&h.as_bytes()[..8])
    }

    /// Block fingerprints of a request body; empty when hash_ids are off, the model is in
    /// `hash_ids_skip`, or the body has no prompt text.
    pub fn blocks(&self, api: Api, model: Option<&str>, body: &[u8]) -> Vec<u64> {
        let k = &self.inner;
        let skipped = model.is_some_and(|m| k.skip.iter().any(|g| crate::slo::glob(g, m)));
        if !k.hash_ids || skipped {
            return Vec::new();
        }
        prompt_bytes(api, body).map_or_else(Vec::new, |p| chain(&k.block_key, &p, k.block_bytes))
    }

    /// The header a file (or snapshot) written with these keys starts with.
    pub fn header(
        &self,
        started: std::time::SystemTime,
        contract: &super::format::Contract,
    ) -> super::format::Header {
        super::format::Header::new(started, self.salt_id(), self.block(), contract)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_share_leading_hashes() {
        let a = block_hashes(b"salt-salt-salt-1", b"aaaabbbbccccdddd", 4);
        let b = block_hashes(b"salt-salt-salt-1", b"aaaabbbbXXXXdddd", 4);
        assert_eq!(a.len(), 4);
        assert_eq!(a[..2], b[..2]);
        // Chained: once a block differs, every later one does too.
        assert_ne!(a[2], b[2]);
        assert_ne!(a[3], b[3]);
        // The same block content at a different position hashes differently.
        let c = block_hashes(b"salt-salt-salt-1", b"ddddaaaa", 4);
        assert_ne!(c[0], a[3]);
    }

    #[test]
    fn salts_change_everything() {
        let a = block_hashes(b"salt-salt-salt-1", b"hello world", 4);
        let b = block_hashes(b"salt-salt-salt-2", b"hello world", 4);
        assert_eq!(a.len(), 3);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        assert_ne!(salt_id(b"salt-salt-salt-1"), salt_id(b"salt-salt-salt-2"));
        assert_eq!(salt_id(b"x").len(), 16);
        assert!(block_hashes(b"s", b"", 4).is_empty());
    }

    #[test]
    fn prompts_are_extracted_per_dialect() {
        let chat = br#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}"#;
        assert_eq!(prompt_bytes(Api::ChatCompletions, chat).unwrap(), b"S\x1eU");
        let completion = br#"{"prompt":"P"}"#;
        assert_eq!(prompt_bytes(Api::Completions, completion).unwrap(), b"P");
        assert!(prompt_bytes(Api::Completions, br#"{"prompt":[1,2,3]}"#).is_none());
        assert!(prompt_bytes(Api::ChatCompletions, b"not json").is_none());
    }

    #[test]
    fn anonymizer_honours_skip_and_off() {
        let body = br#"{"messages":[{"role":"user","content":"hello"}]}"#;
        let a = Anonymizer::from_salt(b"0123456789abcdef", 2, true, vec!["secret-*".into()]);
        assert_eq!(a.blocks(Api::ChatCompletions, Some("m"), body).len(), 3);
        assert!(
            a.blocks(Api::ChatCompletions, Some("secret-7"), body)
                .is_empty()
        );
        let off = Anonymizer::from_salt(b"0123456789abcdef", 2, false, Vec::new());
        assert!(off.blocks(Api::ChatCompletions, Some("m"), body).is_empty());
        assert_eq!(a.tenant(7), off.tenant(7));
        assert_ne!(a.tenant(7), a.tenant(8));
        assert!(!format!("{a:?}").contains("0123456789abcdef"));
    }
}
