//! [`ProfileLine`]: one finished request on its way into a profile file or the live drift
//! window. Built on the aggregator from a [`RequestRecord`]; it carries the arrival as a
//! wall-clock time (the writer turns it into the file-relative `t_ms`) and the raw block
//! fingerprints (the writer turns them into per-file small integers).

use std::time::{Duration, SystemTime};

use super::format::{Entry, round_ms, unix_ms};
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
        let arrival = humantime::parse_rfc3339_weak(&record.started_at).unwrap_or_else(|_| {
            SystemTime::now()
                .checked_sub(Duration::from_secs_f64(record.e2e_ms.max(0.0) / 1000.0))
                .unwrap_or(SystemTime::UNIX_EPOCH)
        });
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
            slo_class: record.slo_class.clone(),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::measure::{Outcome, TokenSource};

    /// A record as the aggregator would hand it over.
    pub(crate) fn record() -> RequestRecord {
        RequestRecord {
            id: "req-CANARY-ID".into(),
            started_at: "2026-01-02T03:04:05.678Z".into(),
            model: Some("llama".into()),
            api: "chat_completions",
            stream: true,
            status: Some(200),
            outcome: Outcome::Ok,
            ttft_ms: Some(12.345),
            ttfo_ms: None,
            tpot_ms: Some(3.21),
            e2e_ms: 100.06,
            itl_ms: None,
            input_tokens: Some(40),
            input_tokens_source: Some(TokenSource::Usage),
            cached_input_tokens: None,
            output_tokens: Some(9),
            output_tokens_source: Some(TokenSource::Events),
            events: 9,
            bytes_out: 1000,
            terminal_event: false,
            slo_class: "interactive".into(),
            slo_met: Some(true),
            slo_miss_reason: None,
            clock: crate::measure::Clock::User,
            finished_at: None,
            bytes_in: 10,
            finish_reason: None,
            decode_failed: false,
            arrival: Default::default(),
            tenant: Some(5),
            slo_overrides: Default::default(),
            trace: None,
        }
    }

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
}
