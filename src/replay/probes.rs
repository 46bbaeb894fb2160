//! Quality probes (`--probes FILE`): requests with a known good answer, mixed into the
//! load so each step says whether the target still answers *correctly* under that load,
//! not only fast.
//!
//! The file is JSON Lines, one probe per line:
//! `{"name": "capital", "api": "chat", "body": {...}, "expect": {"contains": "Paris"}}`;
//! `api` is `chat` (default) or `completions`, `body` the request body as sent (the
//! model of the run is filled in when it names none), and `expect` exactly one of
//! `contains` (a substring), `regex` (Rust `regex` syntax, searched anywhere) or
//! `json_schema` (the answer, trimmed and without a Markdown code fence, must be JSON
//! valid against the schema; drafts 4 to 2020-12, by the `boon` crate).
//!
//! Every `round(1 / --probe-share)`-th request of the run is the next probe, in file
//! order. The answer text (the message content or completion text, from a JSON body or
//! the SSE deltas) is kept for probes only; failures keep an excerpt, which is written to
//! the report directory and nowhere else.

use std::path::Path;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::plan::ReplayApi;

/// Characters of a failed answer kept in the report.
pub const EXCERPT_CHARS: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("--probes {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--probes {path} line {line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("--probes {0}: no probes in the file")]
    Empty(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbeLine {
    name: Option<String>,
    #[serde(default)]
    api: ApiName,
    body: serde_json::Map<String, Value>,
    expect: ExpectLine,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ApiName {
    #[default]
    Chat,
    Completions,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectLine {
    contains: Option<String>,
    regex: Option<String>,
    json_schema: Option<Value>,
}

enum Expect {
    Contains(String),
    Regex(regex::Regex),
    Schema(boon::SchemaIndex),
}

/// One probe, ready to send.
pub struct Probe {
    pub name: String,
    pub api: ReplayApi,
    pub model: Option<String>,
    pub body: Bytes,
    expect: Expect,
}

/// The probes of a run and how often one is sent.
pub struct Probes {
    list: Vec<Probe>,
    schemas: boon::Schemas,
    /// Every `every`-th request is a probe.
    every: u64,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("probes", &self.list.len())
            .field("every", &self.every)
            .finish()
    }
}

impl Probes {
    /// Reads `path`; `model` fills bodies that name none; `share` of the requests are
    /// probes.
    pub fn load(path: &Path, model: Option<&str>, share: f64) -> Result<Probes, ProbeError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProbeError::Io {
            path: p.clone(),
            source,
        })?;
        Probes::parse(&text, &p, model, share)
    }

    fn parse(
        text: &str,
        path: &str,
        model: Option<&str>,
        share: f64,
    ) -> Result<Probes, ProbeError> {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let mut list = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |reason: String| ProbeError::Line {
                path: path.to_owned(),
                line: i + 1,
                reason,
            };
            let l: ProbeLine = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            let expect = match (l.expect.contains, l.expect.regex, l.expect.json_schema) {
                (Some(s), None, None) => Expect::Contains(s),
                (None, Some(r), None) => Expect::Regex(
                    regex::Regex::new(&r).map_err(|e| bad(format!("expect.regex: {e}")))?,
                ),
                (None, None, Some(schema)) => {
                    let url = format!("probe:///line{}.json", i + 1);
                    compiler
                        .add_resource(&url, schema)
                        .map_err(|e| bad(format!("expect.json_schema: {e}")))?;
                    let idx = compiler
                        .compile(&url, &mut schemas)
                        .map_err(|e| bad(format!("expect.json_schema: {e}")))?;
                    Expect::Schema(idx)
                }
                _ => {
                    return Err(bad(
                        "expect needs exactly one of contains, regex, json_schema".into(),
                    ));
                }
            };
            let mut body = l.body;
            if !body.contains_key("model")
                && let Some(m) = model
            {
                body.insert("model".into(), Value::String(m.to_owned()));
            }
            let model = body.get("model").and_then(Value::as_str).map(str::to_owned);
            let bytes = serde_json::to_vec(&body).map_err(|e| bad(e.to_string()))?;
            list.push(Probe {
                name: l.name.unwrap_or_else(|| format!("line {}", i + 1)),
                api: match l.api {
                    ApiName::Chat => ReplayApi::Chat,
                    ApiName::Completions => ReplayApi::Completions,
                },
                model,
                body: Bytes::from(bytes),
                expect,
            });
        }
        if list.is_empty() {
            return Err(ProbeError::Empty(path.to_owned()));
        }
        Ok(Probes {
            list,
            schemas,
            every: (1.0 / share).round().max(1.0) as u64,
        })
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The probe the `seq`-th request of the run is, if any.
    pub fn pick(&self, seq: u64) -> Option<(usize, &Probe)> {
        if !(seq + 1).is_multiple_of(self.every) {
            return None;
        }
        let k = ((seq + 1) / self.every - 1) as usize % self.list.len();
        self.list.get(k).map(|p| (k, p))
    }

    pub fn name(&self, k: usize) -> &str {
        self.list.get(k).map_or("", |p| p.name.as_str())
    }

    /// Whether `text` is what probe `k` expects; the reason when not.
    pub fn check(&self, k: usize, text: &str) -> Result<(), String> {
        let Some(p) = self.list.get(k) else {
            return Err("no such probe".into());
        };
        match &p.expect {
            Expect::Contains(s) if text.contains(s.as_str()) => Ok(()),
            Expect::Contains(s) => Err(format!("does not contain {s:?}")),
            Expect::Regex(r) if r.is_match(text) => Ok(()),
            Expect::Regex(r) => Err(format!("does not match /{}/", r.as_str())),
            Expect::Schema(idx) => {
                let json: Value =
                    serde_json::from_str(unfence(text)).map_err(|e| format!("not JSON: {e}"))?;
                self.schemas
                    .validate(&json, *idx)
                    .map_err(|e| format!("not valid against the schema: {e}"))
            }
        }
    }
}

/// `text` trimmed, without a surrounding Markdown code fence (```json ... ```).
fn unfence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// The answer text of a response body: a JSON completion's message content / text, or
/// the concatenated SSE deltas.
pub fn answer_text(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let piece = |v: &Value| -> Option<String> {
        let c = v.get("choices")?.get(0)?;
        let s = c
            .get("message")
            .and_then(|m| m.get("content"))
            .or_else(|| c.get("delta").and_then(|d| d.get("content")))
            .or_else(|| c.get("text"))?;
        s.as_str().map(str::to_owned)
    };
    if let Ok(v) = serde_json::from_str::<Value>(text.trim()) {
        return piece(&v).unwrap_or_default();
    }
    let mut out = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        if let Ok(v) = serde_json::from_str::<Value>(data.trim())
            && let Some(s) = piece(&v)
        {
            out.push_str(&s);
        }
    }
    out
}

/// A probe's result, kept with its request.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    pub probe: usize,
    pub passed: bool,
    /// The request's id, for the report's list of failures.
    pub request_id: String,
    pub reason: Option<String>,
    pub excerpt: Option<String>,
}

/// One failed probe in the report.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub name: String,
    pub step: String,
    pub request_id: String,
    pub reason: String,
    /// The first characters of the answer.
    pub answer: String,
}

/// `quality` of a step or the run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Quality {
    pub probes: u64,
    pub passed: u64,
    pub pass_rate: Option<f64>,
    pub failures: Vec<Failure>,
    /// Each probe's answers, in file order (report.json shows them in
    /// `gates.quality.by_probe`).
    #[serde(skip)]
    pub by_probe: Vec<ProbeTally>,
}

/// One probe's answers in a step or the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeTally {
    pub name: String,
    /// Answers judged.
    pub probes: u64,
    pub passed: u64,
    pub pass_rate: Option<f64>,
}

impl Quality {
    /// Counts one answer to `name`.
    pub fn count(&mut self, name: &str, passed: bool) {
        self.probes += 1;
        self.passed += u64::from(passed);
        let i = match self.by_probe.iter().position(|t| t.name == name) {
            Some(i) => i,
            None => {
                self.by_probe.push(ProbeTally {
                    name: name.to_owned(),
                    probes: 0,
                    passed: 0,
                    pass_rate: None,
                });
                self.by_probe.len() - 1
            }
        };
        let t = &mut self.by_probe[i];
        t.probes += 1;
        t.passed += u64::from(passed);
        t.pass_rate = Some(t.passed as f64 / t.probes as f64);
        self.pass_rate = Some(self.passed as f64 / self.probes as f64);
    }
}

/// The excerpt kept of a failed answer.
pub fn excerpt(text: &str) -> String {
    text.chars().take(EXCERPT_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"name":"capital","body":{"messages":[{"role":"user","content":"Capital of France?"}],"max_tokens":20},"expect":{"contains":"Paris"}}
{"api":"completions","body":{"prompt":"2+2=","model":"m2"},"expect":{"regex":"^\\s*4\\b"}}

{"name":"json","body":{"messages":[]},"expect":{"json_schema":{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}}}
"#;

    fn probes(share: f64) -> Probes {
        Probes::parse(FILE, "p.jsonl", Some("m1"), share).unwrap()
    }

    #[test]
    fn each_kind_of_expectation_passes_and_fails() {
        let p = probes(0.1);
        assert_eq!(p.len(), 3);
        assert_eq!(p.check(0, "It is Paris."), Ok(()));
        assert_eq!(
            p.check(0, "Lyon").unwrap_err(),
            "does not contain \"Paris\""
        );
        assert_eq!(p.check(1, " 4, of course"), Ok(()));
        assert!(p.check(1, "44").is_err());
        assert_eq!(p.check(2, r#"{"city":"Paris"}"#), Ok(()));
        assert_eq!(p.check(2, "```json\n{\"city\": \"Paris\"}\n```"), Ok(()));
        let e = p.check(2, r#"{"city":3}"#).unwrap_err();
        assert!(e.starts_with("not valid against the schema"), "{e}");
        assert!(p.check(2, r#"{}"#).is_err());
        assert!(p.check(2, "Paris").unwrap_err().starts_with("not JSON"));
    }

    #[test]
    fn bodies_get_the_run_model_unless_they_name_one() {
        let p = probes(0.1);
        assert_eq!(p.list[0].model.as_deref(), Some("m1"));
        assert_eq!(p.list[1].model.as_deref(), Some("m2"));
        assert_eq!(p.list[1].api, ReplayApi::Completions);
        assert_eq!(p.name(1), "line 2");
        let body: Value = serde_json::from_slice(&p.list[0].body).unwrap();
        assert_eq!(body["max_tokens"], 20);
    }

    #[test]
    fn every_nth_request_is_the_next_probe() {
        let p = probes(0.25);
        let picked: Vec<(u64, usize)> = (0..16)
            .filter_map(|s| p.pick(s).map(|(k, _)| (s, k)))
            .collect();
        assert_eq!(picked, [(3, 0), (7, 1), (11, 2), (15, 0)]);
        let all = probes(1.0);
        assert!((0..5).all(|s| all.pick(s).is_some()));
    }

    #[test]
    fn bad_files_say_which_line() {
        let err = |text: &str| Probes::parse(text, "p", None, 0.1).unwrap_err().to_string();
        assert_eq!(err(""), "--probes p: no probes in the file");
        assert!(err("{").contains("line 1"));
        let two = r#"{"body":{},"expect":{"contains":"a","regex":"b"}}"#;
        assert!(err(two).contains("exactly one of"), "{}", err(two));
        let bad_re = "\n{\"body\":{},\"expect\":{\"regex\":\"(\"}}";
        assert!(
            err(bad_re).contains("line 2: expect.regex"),
            "{}",
            err(bad_re)
        );
        let bad_schema = r#"{"body":{},"expect":{"json_schema":{"type":"nonsense"}}}"#;
        assert!(
            err(bad_schema).contains("expect.json_schema"),
            "{}",
            err(bad_schema)
        );
        let unknown = r#"{"body":{},"expect":{"contains":"a"},"extra":1}"#;
        assert!(err(unknown).contains("unknown field"), "{}", err(unknown));
    }

    #[test]
    fn answers_come_from_json_bodies_and_sse_deltas() {
        let chat = br#"{"choices":[{"message":{"role":"assistant","content":"Paris"}}]}"#;
        assert_eq!(answer_text(chat), "Paris");
        let completion = br#"{"choices":[{"text":" 4"}]}"#;
        assert_eq!(answer_text(completion), " 4");
        let sse = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"Pa\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ris\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{}}\n\ndata: [DONE]\n\n";
        assert_eq!(answer_text(sse), "Paris");
        assert_eq!(answer_text(b"not json"), "");
        assert_eq!(excerpt(&"é".repeat(300)).chars().count(), EXCERPT_CHARS);
    }
}
