//! Log-probabilities on the copies only (`shadow.logprobs`): the candidate's and the
//! secondary's copies ask for each token's top 5 ([`ask`]; never the client's request or
//! the primary's answer), their answers' tokens are read back ([`tokens`]) on the
//! comparer's thread, and vLLM's rule is applied between them ([`close`]): two token
//! sequences are accepted when they are the same, or when at the first differing token
//! each side's token is in the other's top 5 (vLLM's `check_logprobs_close`). The mean
//! top-5 KL divergence is taken over the positions both saw the same prefix.
//!
//! OpenAI's chat (`logprobs.content[]`) and legacy completions (`logprobs.tokens`,
//! `top_logprobs`) are read, streamed or whole; other dialects carry none.

use bytes::Bytes;
use serde_json::Value;

use crate::decode::{Api, StreamKind};

/// Alternatives asked for per token: vLLM's tests use 5.
pub const TOP: u64 = 5;

/// One generated token with its log-probability and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub token: String,
    pub top: Vec<(String, f64)>,
}

impl Token {
    /// Bytes held (for the waiting buffer's bound).
    pub fn weight(&self) -> usize {
        self.token.len() + self.top.iter().map(|(t, _)| t.len() + 8).sum::<usize>()
    }
}

/// The request body asking for the top [`TOP`] log-probabilities, where the dialect has
/// them; `None` leaves the body as it is.
pub fn ask(api: Api, body: &[u8]) -> Option<Bytes> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let obj = value.as_object_mut()?;
    match api {
        Api::ChatCompletions => {
            obj.insert("logprobs".into(), Value::Bool(true));
            obj.insert("top_logprobs".into(), Value::from(TOP));
        }
        Api::Completions => {
            obj.insert("logprobs".into(), Value::from(TOP));
        }
        _ => return None,
    }
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// The tokens of an answer read whole (`chunks`), with their top alternatives; `None`
/// when it carries none.
pub fn tokens(api: Api, kind: StreamKind, chunks: &[Bytes]) -> Option<Vec<Token>> {
    if !matches!(api, Api::ChatCompletions | Api::Completions) {
        return None;
    }
    let mut body = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        body.extend_from_slice(c);
    }
    let mut out = Vec::new();
    if kind == StreamKind::Json {
        let v: Value = serde_json::from_slice(&body).ok()?;
        collect(&v, &mut out);
    } else {
        for line in body.split(|b| *b == b'\n') {
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            if let Ok(v) = serde_json::from_slice::<Value>(data.trim_ascii()) {
                collect(&v, &mut out);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The tokens of one event or body (the first choice's).
fn collect(v: &Value, out: &mut Vec<Token>) {
    let lp = &v["choices"][0]["logprobs"];
    if let Some(content) = lp["content"].as_array() {
        for t in content {
            let Some(token) = t["token"].as_str() else {
                continue;
            };
            let top = t["top_logprobs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|e| {
                            Some((e["token"].as_str()?.to_owned(), e["logprob"].as_f64()?))
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Token {
                token: token.to_owned(),
                top,
            });
        }
    } else if let Some(tokens) = lp["tokens"].as_array() {
        for (i, t) in tokens.iter().enumerate() {
            let Some(token) = t.as_str() else { continue };
            let top = lp["top_logprobs"][i]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                        .collect()
                })
                .unwrap_or_default();
            out.push(Token {
                token: token.to_owned(),
                top,
            });
        }
    }
}

/// vLLM's rule between two copies' tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Close {
    /// The same tokens, or at the first difference each in the other's top 5.
    pub accepted: bool,
    /// Mean top-5 KL divergence (secondary ‖ candidate) over the positions up to and
    /// including the first difference; `None` without top alternatives.
    pub kl: Option<f64>,
}

/// Applies vLLM's rule to `candidate` against `secondary`.
pub fn close(candidate: &[Token], secondary: &[Token]) -> Close {
    let first = candidate
        .iter()
        .zip(secondary)
        .position(|(c, s)| c.token != s.token);
    let accepted = match first {
        None => true,
        Some(i) => {
            let (c, s) = (&candidate[i], &secondary[i]);
            c.top.iter().any(|(t, _)| *t == s.token) && s.top.iter().any(|(t, _)| *t == c.token)
        }
    };
    let upto = first.map_or(candidate.len().min(secondary.len()), |i| i + 1);
    let kls: Vec<f64> = candidate
        .iter()
        .zip(secondary)
        .take(upto)
        .filter_map(|(c, s)| kl(&s.top, &c.top))
        .collect();
    Close {
        accepted,
        kl: (!kls.is_empty()).then(|| kls.iter().sum::<f64>() / kls.len() as f64),
    }
}

/// KL(p ‖ q) over the union of two top-k lists: each side's probabilities renormalised
/// over its own top k, a token missing from a side given half that side's smallest
/// probability, then both renormalised over the union.
fn kl(p: &[(String, f64)], q: &[(String, f64)]) -> Option<f64> {
    if p.is_empty() || q.is_empty() {
        return None;
    }
    let (p, q) = (probs(p), probs(q));
    let mut union: Vec<&str> = p.iter().chain(&q).map(|(t, _)| *t).collect();
    union.sort_unstable();
    union.dedup();
    let over = |side: &[(&str, f64)]| -> Vec<f64> {
        let floor = side.iter().map(|(_, v)| *v).fold(f64::INFINITY, f64::min) / 2.0;
        let v: Vec<f64> = union
            .iter()
            .map(|t| side.iter().find(|(s, _)| s == t).map_or(floor, |(_, v)| *v))
            .collect();
        let sum: f64 = v.iter().sum();
        v.into_iter().map(|x| x / sum).collect()
    };
    let (p, q) = (over(&p), over(&q));
    let d: f64 = p.iter().zip(&q).map(|(a, b)| a * (a / b).ln()).sum();
    d.is_finite().then_some(d.max(0.0))
}

/// A top-k list's probabilities, renormalised over it.
fn probs(side: &[(String, f64)]) -> Vec<(&str, f64)> {
    let sum: f64 = side.iter().map(|(_, lp)| lp.exp()).sum();
    side.iter()
        .map(|(t, lp)| (t.as_str(), lp.exp() / sum))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(token: &str, top: &[&str]) -> Token {
        Token {
            token: token.into(),
            top: top
                .iter()
                .enumerate()
                .map(|(i, t)| ((*t).to_owned(), -(i as f64) - 0.1))
                .collect(),
        }
    }

    #[test]
    fn the_copies_ask_for_the_top_five_where_the_dialect_has_them() {
        let chat = ask(Api::ChatCompletions, br#"{"model":"m","stream":true}"#).unwrap_or_default();
        let v: Value = serde_json::from_slice(&chat).unwrap_or_default();
        assert_eq!(
            (v["logprobs"].as_bool(), v["top_logprobs"].as_u64()),
            (Some(true), Some(5))
        );
        let legacy = ask(Api::Completions, br#"{"prompt":"x"}"#).unwrap_or_default();
        let v: Value = serde_json::from_slice(&legacy).unwrap_or_default();
        assert_eq!(v["logprobs"].as_u64(), Some(5));
        assert!(ask(Api::Messages, br#"{}"#).is_none());
        assert!(ask(Api::ChatCompletions, b"not json").is_none());
    }

    #[test]
    fn tokens_are_read_from_chat_events_and_legacy_bodies() {
        let event = |t: &str| {
            Bytes::from(format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{t}\"}},\"logprobs\":{{\"content\":[{{\"token\":\"{t}\",\"logprob\":-0.1,\"top_logprobs\":[{{\"token\":\"{t}\",\"logprob\":-0.1}},{{\"token\":\"z\",\"logprob\":-2.5}}]}}]}}}}]}}\n\n"
            ))
        };
        let chunks = [
            event("a"),
            event("b"),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ];
        let got = tokens(Api::ChatCompletions, StreamKind::Sse, &chunks).unwrap_or_default();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].token, "b");
        assert_eq!(got[1].top[1], ("z".to_owned(), -2.5));
        let body = Bytes::from_static(
            br#"{"choices":[{"text":"ab","logprobs":{"tokens":["a","b"],"token_logprobs":[-0.1,-0.2],"top_logprobs":[{"a":-0.1,"c":-3.0},{"b":-0.2}]}}]}"#,
        );
        let got = tokens(Api::Completions, StreamKind::Json, &[body]).unwrap_or_default();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].top.len(), 2);
        assert!(tokens(Api::ChatCompletions, StreamKind::Sse, &[]).is_none());
    }

    #[test]
    fn vllms_rule_accepts_a_near_tie_at_the_first_difference_only() {
        let a = [tok("the", &["the", "a"]), tok("cat", &["cat", "dog"])];
        let same = close(&a, &a);
        assert!(same.accepted);
        assert_eq!(same.kl, Some(0.0));
        // "dog" where the other said "cat", each in the other's top: close.
        let b = [tok("the", &["the", "a"]), tok("dog", &["dog", "cat"])];
        let c = close(&a, &b);
        assert!(c.accepted);
        assert!(c.kl.is_some_and(|k| k > 0.0), "{c:?}");
        // "fox" in neither top: not close.
        let d = [tok("the", &["the", "a"]), tok("fox", &["fox", "owl"])];
        assert!(!close(&a, &d).accepted);
        // Without alternatives there is no KL.
        assert_eq!(close(&[tok("x", &[])], &[tok("x", &[])]).kl, None);
    }
}
