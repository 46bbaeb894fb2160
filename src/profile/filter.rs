//! `goodput profile filter`: the requests of one profile file that match every given
//! condition (input and output length ranges, models, APIs, tenants), written as a valid
//! profile: the header unchanged, the kept request lines unchanged and in file order, and
//! the `blocks` lines holding keys of the kept requests' `hash_ids`, each written once,
//! just before the first kept request that needs it. So the scenarios of an acceptance
//! (short context at high concurrency, long context at low) come from one capture.
//!
//! Lines are copied byte for byte; the file is streamed (one line in memory, plus the
//! `blocks` lines not yet needed).

use std::{
    collections::HashSet,
    io::{BufRead, Write},
};

use serde::Deserialize;

/// An inclusive length range `MIN..MAX`, either end optional (`..512`, `4096..`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub min: u64,
    pub max: u64,
}

impl Range {
    pub fn parse(s: &str) -> Result<Range, String> {
        let (a, b) = s
            .split_once("..")
            .ok_or_else(|| format!("{s:?} is not a range like 0..2048, 4096.. or ..512"))?;
        let end = |v: &str, default: u64| -> Result<u64, String> {
            let v = v.trim().trim_start_matches('=');
            if v.is_empty() {
                return Ok(default);
            }
            v.parse()
                .map_err(|_| format!("{v:?} is not a whole number"))
        };
        let r = Range {
            min: end(a, 0)?,
            max: end(b, u64::MAX)?,
        };
        if r.min > r.max {
            return Err(format!("{s:?}: the minimum is above the maximum"));
        }
        Ok(r)
    }

    fn holds(self, v: Option<u64>) -> bool {
        v.is_some_and(|v| v >= self.min && v <= self.max)
    }
}

/// What to keep; an empty list keeps any value.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub input_tokens: Option<Range>,
    pub output_tokens: Option<Range>,
    pub models: Vec<String>,
    pub apis: Vec<String>,
    pub tenants: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("the file does not start with a goodput-profile header")]
    NoHeader,
}

/// What `filter` kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FilterReport {
    pub requests: usize,
    pub kept: usize,
    pub blocks_lines: usize,
}

#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: Option<String>,
    format: Option<String>,
}

#[derive(Deserialize)]
struct Blocks {
    first_id: u32,
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct Req {
    model: Option<String>,
    api: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    tenant: Option<String>,
    #[serde(default)]
    hash_ids: Vec<u32>,
}

impl Filter {
    fn keeps(&self, r: &Req) -> bool {
        let listed = |list: &[String], v: &Option<String>| {
            list.is_empty() || v.as_ref().is_some_and(|v| list.iter().any(|l| l == v))
        };
        self.input_tokens.is_none_or(|x| x.holds(r.input_tokens))
            && self.output_tokens.is_none_or(|x| x.holds(r.output_tokens))
            && listed(&self.models, &r.model)
            && listed(&self.apis, &r.api)
            && listed(&self.tenants, &r.tenant)
    }

    /// Copies the header, the kept requests and the `blocks` lines they need from `input`
    /// to `out`.
    pub fn run(
        &self,
        input: impl BufRead,
        out: &mut impl Write,
    ) -> Result<FilterReport, FilterError> {
        let mut report = FilterReport::default();
        // Blocks lines not written yet: their id range and the line.
        let mut pending: Vec<(u32, u32, String)> = Vec::new();
        let mut written_ids: HashSet<u32> = HashSet::new();
        let mut lines = input.lines().enumerate();
        match lines.next() {
            Some((_, line)) => {
                let line = line?;
                let head: Head = serde_json::from_str(&line).map_err(|_| FilterError::NoHeader)?;
                if head.kind.as_deref() != Some("header")
                    || head.format.as_deref() != Some("goodput-profile")
                {
                    return Err(FilterError::NoHeader);
                }
                writeln!(out, "{line}")?;
            }
            None => return Err(FilterError::NoHeader),
        }
        for (i, line) in lines {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |e: serde_json::Error| FilterError::Line {
                line: i + 1,
                reason: e.to_string(),
            };
            let head: Head = serde_json::from_str(&line).map_err(bad)?;
            match head.kind.as_deref() {
                Some("blocks") => {
                    let b: Blocks = serde_json::from_str(&line).map_err(bad)?;
                    let end = b.first_id.saturating_add(b.keys.len() as u32);
                    pending.push((b.first_id, end, line));
                }
                Some(_) => {} // other line types of later versions: not requests
                None => {
                    report.requests += 1;
                    let r: Req = serde_json::from_str(&line).map_err(bad)?;
                    if !self.keeps(&r) {
                        continue;
                    }
                    report.kept += 1;
                    let needed: Vec<u32> = r
                        .hash_ids
                        .iter()
                        .copied()
                        .filter(|id| !written_ids.contains(id))
                        .collect();
                    if !needed.is_empty() {
                        let mut k = 0;
                        while k < pending.len() {
                            let (a, b) = (pending[k].0, pending[k].1);
                            if needed.iter().any(|id| (a..b).contains(id)) {
                                let (_, _, l) = pending.remove(k);
                                writeln!(out, "{l}")?;
                                written_ids.extend(a..b);
                                report.blocks_lines += 1;
                            } else {
                                k += 1;
                            }
                        }
                    }
                    writeln!(out, "{line}")?;
                }
            }
        }
        out.flush()?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"5a1700000000beef","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},"contract":{}}"#;

    fn req(t: i64, model: &str, api: &str, input: u64, output: u64, ids: &str) -> String {
        format!(
            r#"{{"t_ms":{t},"model":"{model}","api":"{api}","stream":true,"input_tokens":{input},"input_tokens_source":"usage","output_tokens":{output},"output_tokens_source":"usage","max_tokens":null,"outcome":"ok","status":200,"slo_class":"default","slo_met":true,"ttft_ms":20.0,"tpot_ms":2.0,"e2e_ms":40.0,"tenant":"t{t}","hash_ids":{ids}}}"#
        )
    }

    fn file() -> String {
        [
            HEADER.to_owned(),
            r#"{"type":"blocks","first_id":0,"keys":["00000000000000aa","00000000000000bb"]}"#
                .into(),
            req(0, "a", "chat_completions", 100, 10, "[0,1]"),
            r#"{"type":"blocks","first_id":2,"keys":["00000000000000cc"]}"#.into(),
            req(5, "b", "completions", 9000, 300, "[0,2]"),
            r#"{"type":"blocks","first_id":3,"keys":["00000000000000dd"]}"#.into(),
            req(9, "a", "chat_completions", 5000, 20, "[3]"),
            req(12, "a", "chat_completions", 50, 5, "[]"),
        ]
        .join("\n")
            + "\n"
    }

    fn run(f: &Filter) -> (FilterReport, Vec<String>) {
        let mut out = Vec::new();
        let r = f.run(file().as_bytes(), &mut out).unwrap();
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        (r, lines)
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(Range::parse("0..2048"), Ok(Range { min: 0, max: 2048 }));
        assert_eq!(
            Range::parse("4096.."),
            Ok(Range {
                min: 4096,
                max: u64::MAX
            })
        );
        assert_eq!(Range::parse("..=512"), Ok(Range { min: 0, max: 512 }));
        assert!(Range::parse("512").is_err());
        assert!(Range::parse("9..1").is_err());
        assert!(Range::parse("a..1").is_err());
    }

    #[test]
    fn long_inputs_keep_only_the_blocks_they_use() {
        let f = Filter {
            input_tokens: Some(Range::parse("4096..").unwrap()),
            ..Filter::default()
        };
        let (r, lines) = run(&f);
        assert_eq!((r.requests, r.kept, r.blocks_lines), (4, 2, 3));
        assert!(lines[0].contains("\"header\""));
        // ids 0 and 2 for the first kept request, 3 for the second, each before its use.
        assert!(lines[1].contains("\"first_id\":0"));
        assert!(lines[2].contains("\"first_id\":2"));
        assert!(lines[3].contains("\"t_ms\":5"));
        assert!(lines[4].contains("\"first_id\":3"));
        assert!(lines[5].contains("\"t_ms\":9"));
        assert_eq!(lines.len(), 6);
    }

    #[test]
    fn model_api_tenant_and_output_filters_combine() {
        let f = Filter {
            models: vec!["a".into()],
            apis: vec!["chat_completions".into()],
            output_tokens: Some(Range::parse("..10").unwrap()),
            ..Filter::default()
        };
        let (r, lines) = run(&f);
        assert_eq!(r.kept, 2);
        assert!(lines.iter().any(|l| l.contains("\"t_ms\":0")));
        assert!(lines.iter().any(|l| l.contains("\"t_ms\":12")));
        // A block line used by nothing kept is left out.
        assert!(!lines.iter().any(|l| l.contains("\"first_id\":3")));
        let f = Filter {
            tenants: vec!["t9".into()],
            ..Filter::default()
        };
        assert_eq!(run(&f).0.kept, 1);
        let none = Filter {
            models: vec!["zzz".into()],
            ..Filter::default()
        };
        let (r, lines) = run(&none);
        assert_eq!((r.kept, lines.len()), (0, 1));
    }

    #[test]
    fn not_a_profile_is_refused() {
        let mut out = Vec::new();
        let e = Filter::default().run(&b"{\"t_ms\":1}\n"[..], &mut out);
        assert!(matches!(e, Err(FilterError::NoHeader)));
        let bad = format!("{HEADER}\n{{\"t_ms\":\n");
        let e = Filter::default().run(bad.as_bytes(), &mut out).unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        assert!(matches!(
            Filter::default().run(&b""[..], &mut out),
            Err(FilterError::NoHeader)
        ));
    }
}
