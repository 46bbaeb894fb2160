//! [`ProfileLine`]: one finished request on its way into a profile file or the live drift
//! window. Built on the aggregator from a [`RequestRecord`]; it carries the arrival as a
//! wall-clock time (the writer turns it into the file-relative `t_ms`) and the raw block
//! fingerprints (the writer turns them into per-file small integers).
//!
//! [`LineEncoder`] is that turning, in one place: the recorder's files and the drift
//! snapshots write requests through it, so both hold the same `blocks` lines.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use super::format::{BlocksLine, Entry, round_ms, unix_ms};
use crate::measure::RequestRecord;

/// One finished request, anonymized. Holds only what `docs/PROFILE.md` lists.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileLine {
    /// Arrival, Unix milliseconds.
    pub arrival_ms: i64,
    pub model: Option<String>,
    pub api: String,
    pub stream: bool,
    pub input_tokens: Option<u64>,
    pub input_tokens_source: Option<&'static str>,
    pub output_tokens: Option<u64>,
    pub output_tokens_source: Option<&'static str>,
    pub max_tokens: Option<u64>,
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub slo_class: String,
    pub slo_met: Option<bool>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// Salted tenant id ([`super::Anonymizer::tenant`]).
    pub tenant: Option<String>,
    /// Chained keyed block fingerprints ([`super::Anonymizer::blocks`]).
    pub block_hashes: Vec<u64>,
}

impl ProfileLine {
    /// From a finished (and SLO-judged) record. `max_tokens` is the request's output cap
    /// (`RequestInfo::max_tokens`); `tenant` and `block_hashes` come from the
    /// [`super::Anonymizer`]. The arrival is the record's `started_at`.
    pub fn from_record(
        record: &RequestRecord,
        max_tokens: Option<u64>,
        tenant: Option<String>,
        block_hashes: Vec<u64>,
    ) -> ProfileLine {
        // To the millisecond, as the record's `started_at` reads.
        let since = record
            .started_at
            .0
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let arrival = SystemTime::UNIX_EPOCH
            + Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
        ProfileLine {
            arrival_ms: unix_ms(arrival),
            model: record.model.clone(),
            api: record.api.to_owned(),
            stream: record.stream,
            input_tokens: record.input_tokens,
            input_tokens_source: record.input_tokens_source.map(|s| s.as_str()),
            output_tokens: record.output_tokens,
            output_tokens_source: record.output_tokens_source.map(|s| s.as_str()),
            max_tokens,
            outcome: record.outcome.as_str(),
            status: record.status,
            slo_class: record.slo_class.to_string(),
            slo_met: record.slo_met,
            ttft_ms: record.ttft_ms,
            tpot_ms: record.tpot_ms,
            e2e_ms: record.e2e_ms,
            tenant,
            block_hashes,
        }
    }

    /// The line as written in a file that started at `start_ms`, with its `hash_ids`.
    pub fn to_entry(&self, start_ms: i64, hash_ids: Option<Vec<u32>>) -> Entry {
        Entry {
            t_ms: self.arrival_ms.saturating_sub(start_ms),
            model: self.model.clone(),
            api: self.api.clone(),
            stream: self.stream,
            input_tokens: self.input_tokens,
            input_tokens_source: self.input_tokens_source.map(str::to_owned),
            output_tokens: self.output_tokens,
            output_tokens_source: self.output_tokens_source.map(str::to_owned),
            max_tokens: self.max_tokens,
            outcome: self.outcome.to_owned(),
            status: self.status,
            slo_class: self.slo_class.clone(),
            slo_met: self.slo_met,
            ttft_ms: self.ttft_ms.map(round_ms),
            tpot_ms: self.tpot_ms.map(round_ms),
            e2e_ms: round_ms(self.e2e_ms),
            tenant: self.tenant.clone(),
            hash_ids,
            extra: Default::default(),
        }
    }
}

/// Writes requests as a profile file holds them: block fingerprints numbered 0.. in order
/// of first appearance in the file, a `blocks` line with the keys of the ids a request
/// introduces just before it, then the request line with `t_ms` counted from the file's
/// start. One per file.
#[derive(Debug, Default)]
pub struct LineEncoder {
    start_ms: i64,
    ids: HashMap<u64, u32>,
}

impl LineEncoder {
    /// For a file whose header's `started_at` is `start_ms` (Unix ms).
    pub fn new(start_ms: i64) -> LineEncoder {
        LineEncoder {
            start_ms,
            ids: HashMap::new(),
        }
    }

    /// Distinct blocks numbered so far (what the id map holds).
    pub fn distinct_blocks(&self) -> usize {
        self.ids.len()
    }

    /// Appends `line` to `out`: its `blocks` line when it introduces ids, then the request,
    /// each ending in a newline. On an error nothing is appended.
    pub fn encode(&mut self, line: &ProfileLine, out: &mut String) -> serde_json::Result<()> {
        let mut keys = Vec::new();
        let first_id = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
        let hash_ids = (!line.block_hashes.is_empty()).then(|| {
            line.block_hashes
                .iter()
                .map(|h| {
                    let next = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
                    *self.ids.entry(*h).or_insert_with(|| {
                        keys.push(format!("{h:016x}"));
                        next
                    })
                })
                .collect::<Vec<u32>>()
        });
        let blocks = (!keys.is_empty()).then(|| BlocksLine {
            kind: "blocks".into(),
            first_id,
            keys,
        });
        let entry = line.to_entry(self.start_ms, hash_ids);
        let blocks = blocks.as_ref().map(serde_json::to_string).transpose()?;
        let entry = serde_json::to_string(&entry)?;
        for text in blocks.iter().chain([&entry]) {
            out.push_str(text);
            out.push('\n');
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) use crate::measure::record::example::record;

    #[test]
    fn maps_only_the_listed_fields() {
        let line = ProfileLine::from_record(&record(), Some(64), None, vec![1, 2]);
        assert_eq!(line.arrival_ms, 1_767_323_045_678);
        let e = line.to_entry(1_767_323_045_000, Some(vec![0, 1]));
        assert_eq!(e.t_ms, 678);
        assert_eq!(e.ttft_ms, Some(12.3));
        assert_eq!(e.e2e_ms, 100.1);
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"t_ms":678,"model":"llama","api":"chat_completions","stream":true,"input_tokens":40,"input_tokens_source":"usage","output_tokens":9,"output_tokens_source":"events","max_tokens":64,"outcome":"ok","status":200,"slo_class":"interactive","slo_met":true,"ttft_ms":12.3,"tpot_ms":3.2,"e2e_ms":100.1,"hash_ids":[0,1]}"#
        );
        assert!(!json.contains("CANARY"));
    }

    #[test]
    fn the_encoder_numbers_blocks_per_file_and_writes_their_keys_first() {
        let mut enc = LineEncoder::new(1_767_323_045_000);
        let mut out = String::new();
        let line = ProfileLine::from_record(&record(), None, None, vec![0xaa, 0xbb]);
        enc.encode(&line, &mut out).unwrap();
        let again = ProfileLine::from_record(&record(), None, None, vec![0xaa, 0xcc, 0xcc]);
        enc.encode(&again, &mut out).unwrap();
        let bare = ProfileLine::from_record(&record(), None, None, Vec::new());
        enc.encode(&bare, &mut out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 5, "{out}");
        assert_eq!(
            lines[0],
            r#"{"type":"blocks","first_id":0,"keys":["00000000000000aa","00000000000000bb"]}"#
        );
        assert!(
            lines[1].starts_with(r#"{"t_ms":678,"#) && lines[1].ends_with(r#""hash_ids":[0,1]}"#)
        );
        assert_eq!(
            lines[2],
            r#"{"type":"blocks","first_id":2,"keys":["00000000000000cc"]}"#
        );
        assert!(lines[3].ends_with(r#""hash_ids":[0,2,2]}"#), "{}", lines[3]);
        assert!(!lines[4].contains("hash_ids"), "{}", lines[4]);
        assert_eq!(enc.distinct_blocks(), 3);
    }
}
