//! The profile file format, version 1 (see `docs/PROFILE.md`, which is normative).
//!
//! JSONL: one [`Header`] line, then one [`Entry`] per finished request, plus `blocks`
//! lines that give the keyed hash behind newly assigned `hash_ids` (so files recorded
//! with the same salt can be merged with their prefix reuse intact). Nothing here holds
//! text from a request or response, a header value or a client address.
//!
//! Compatibility: fields may be added within version 1 (readers ignore and report
//! unknown ones); a change that alters the meaning of an existing field bumps `version`,
//! and readers refuse versions they do not know.

use std::{collections::BTreeMap, time::SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `format` of every profile header.
pub const FORMAT: &str = "goodput-profile";
/// The major version this build writes and reads.
pub const VERSION: u32 = 1;
/// Tokens per block in Mooncake traces and in exports.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;

pub use crate::config::profile::Contract;

/// What one `hash_ids` block covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockUnit {
    Tokens,
    Bytes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub unit: BlockUnit,
    pub size: u32,
}

/// How a profile was coarsened by `goodput profile sample` (absent on recorded files).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anonymized {
    pub k: u64,
    /// Length buckets are powers of this factor (√2 = finest).
    pub length_bucket_factor: f64,
    pub time_bucket_ms: i64,
    pub dropped: u64,
}

/// The first line of every profile file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    #[serde(rename = "type")]
    pub kind: String,
    pub format: String,
    pub version: u32,
    /// RFC 3339; every `t_ms` is an offset from it.
    pub started_at: String,
    /// A one-way id of the salt (never the salt): files with equal ids share hash keys.
    pub salt_id: String,
    pub goodput_version: String,
    pub block: Block,
    pub contract: Contract,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymized: Option<Anonymized>,
    /// Only in drift snapshots: the shadow verdict per SLO class when the snapshot was
    /// written (`{"window_s", "classes": {CLASS: VERDICT}}`), when a `[shadow]` is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Value>,
    /// Only in drift snapshots written for a system change: the upstream's identity
    /// before and after (`{"from", "to", "explanation"}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_change: Option<Value>,
    /// Fields this build does not know (a newer writer); ignored, reported by readers.
    #[serde(flatten, skip_serializing)]
    pub extra: BTreeMap<String, Value>,
}

impl Header {
    pub fn new(started: SystemTime, salt_id: &str, block: Block, contract: &Contract) -> Header {
        Header {
            kind: "header".into(),
            format: FORMAT.into(),
            version: VERSION,
            started_at: humantime::format_rfc3339_millis(started).to_string(),
            salt_id: salt_id.into(),
            goodput_version: env!("CARGO_PKG_VERSION").into(),
            block,
            contract: contract.clone(),
            anonymized: None,
            shadow: None,
            system_change: None,
            extra: BTreeMap::new(),
        }
    }

    /// `started_at` as Unix milliseconds.
    pub fn started_ms(&self) -> Option<i64> {
        humantime::parse_rfc3339_weak(&self.started_at)
            .ok()
            .map(unix_ms)
    }
}

/// One finished request as written. Field names are a contract (`docs/PROFILE.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Arrival, in ms after the header's `started_at` (negative for a request that arrived
    /// before the file was opened and finished after).
    pub t_ms: i64,
    #[serde(default)]
    pub model: Option<String>,
    pub api: String,
    pub stream: bool,
    #[serde(default)]
    pub input_tokens: Option<u64>,
    #[serde(default)]
    pub input_tokens_source: Option<String>,
    #[serde(default)]
    pub output_tokens: Option<u64>,
    #[serde(default)]
    pub output_tokens_source: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    pub outcome: String,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub slo_class: String,
    #[serde(default)]
    pub slo_met: Option<bool>,
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// Salted hash of the tenant, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Prompt blocks, chained and keyed, as small integers that restart in every file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_ids: Option<Vec<u32>>,
    #[serde(flatten, skip_serializing)]
    pub extra: BTreeMap<String, Value>,
}

/// The keys behind `hash_ids` `first_id ..`, written just before the first request that
/// uses them. Keys are 64-bit keyed hashes (hex): equal across files only when the salt
/// is (equal `salt_id`), and as unrecoverable without the salt as the ids themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlocksLine {
    #[serde(rename = "type")]
    pub kind: String,
    pub first_id: u32,
    pub keys: Vec<String>,
}

/// Milliseconds rounded to 0.1: finer is noise, and it keeps lines short.
pub(crate) fn round_ms(ms: f64) -> f64 {
    if ms.is_finite() {
        (ms * 10.0).round() / 10.0
    } else {
        0.0
    }
}

/// Unix milliseconds of a wall-clock instant (negative before 1970).
pub fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// The wall-clock instant of Unix milliseconds (clamped at the epoch).
pub fn from_unix_ms(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_names_no_salt() {
        let contract = Contract {
            engine: Some("vllm".into()),
            ..Default::default()
        };
        let block = Block {
            unit: BlockUnit::Bytes,
            size: 2048,
        };
        let t = from_unix_ms(1_700_000_000_123);
        let h = Header::new(t, "0123456789abcdef", block, &contract);
        let json = serde_json::to_string(&h).unwrap();
        assert!(json.starts_with(r#"{"type":"header","format":"goodput-profile","version":1,"#));
        assert!(
            json.contains(r#""block":{"unit":"bytes","size":2048}"#),
            "{json}"
        );
        assert!(json.contains(r#""contract":{"engine":"vllm"}"#), "{json}");
        let back: Header = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.started_ms(), Some(1_700_000_000_123));
    }

    #[test]
    fn unknown_entry_fields_are_kept_aside() {
        let line = r#"{"t_ms":5,"model":"m","api":"chat_completions","stream":true,"input_tokens":3,
            "input_tokens_source":"usage","output_tokens":2,"output_tokens_source":"usage",
            "max_tokens":null,"outcome":"ok","status":200,"slo_class":"default","slo_met":true,
            "ttft_ms":1.5,"tpot_ms":null,"e2e_ms":9.0,"future":1}"#;
        let e: Entry = serde_json::from_str(line).unwrap();
        assert_eq!(e.extra.keys().collect::<Vec<_>>(), ["future"]);
        let out = serde_json::to_string(&e).unwrap();
        assert!(
            !out.contains("future") && !out.contains("hash_ids"),
            "{out}"
        );
        assert!(out.contains(r#""max_tokens":null"#), "{out}");
    }

    #[test]
    fn ms_conversions() {
        assert_eq!(round_ms(1.234), 1.2);
        assert_eq!(round_ms(f64::NAN), 0.0);
        assert_eq!(unix_ms(from_unix_ms(42)), 42);
    }
}
