//! The prompt text of a request, for counting its input tokens when the upstream reports
//! none. Runs on a tokenizer worker, never on the data path: the body is parsed into a
//! `serde_json::Value` once, and the text is borrowed from it.
//!
//! What is counted, per dialect: message contents (strings, and the `text` of content
//! parts), system prompts and instructions, prompts, tool-call arguments in the history,
//! and each tool definition as its JSON text. A prompt given as token ids is counted as
//! exactly that many tokens. The chat template's own tokens (role markers, separators) are
//! not counted, so the count is a little below what the engine reports.

use std::borrow::Cow;

use serde_json::Value;

use crate::decode::Api;

/// A request's prompt: text pieces to tokenize, plus tokens already given as ids.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Prompt<'v> {
    pub pieces: Vec<Cow<'v, str>>,
    pub token_ids: u64,
}

impl Prompt<'_> {
    pub fn is_empty(&self) -> bool {
        self.token_ids == 0 && self.pieces.iter().all(|p| p.is_empty())
    }
}

/// Parses a request body; `None` when it is not JSON.
pub fn parse(body: &[u8]) -> Option<Value> {
    serde_json::from_slice(body).ok()
}

/// The prompt of a parsed request body in the dialect of `api`.
pub fn extract(api: Api, body: &Value) -> Prompt<'_> {
    let mut p = Prompt::default();
    let field = |name: &str| body.get(name);
    match api {
        Api::ChatCompletions | Api::Unknown => {
            messages(field("messages"), &mut p);
            prompt(field("prompt"), &mut p);
            tools(field("tools"), &mut p);
            tools(field("functions"), &mut p);
        }
        Api::Completions | Api::LlamaCppCompletion => prompt(field("prompt"), &mut p),
        Api::Embeddings => prompt(field("input"), &mut p),
        Api::Responses => {
            text(field("instructions"), &mut p);
            match field("input") {
                Some(Value::Array(items)) => items.iter().for_each(|i| message(i, &mut p)),
                other => text(other, &mut p),
            }
            tools(field("tools"), &mut p);
        }
        Api::Messages => {
            content(field("system"), &mut p);
            messages(field("messages"), &mut p);
            tools(field("tools"), &mut p);
        }
        Api::TgiGenerate { .. } => text(field("inputs"), &mut p),
        Api::OllamaChat => {
            messages(field("messages"), &mut p);
            tools(field("tools"), &mut p);
        }
        Api::OllamaGenerate => {
            text(field("system"), &mut p);
            text(field("prompt"), &mut p);
        }
    }
    p
}

fn text<'v>(v: Option<&'v Value>, p: &mut Prompt<'v>) {
    if let Some(Value::String(s)) = v {
        p.pieces.push(Cow::Borrowed(s));
    }
}

fn messages<'v>(v: Option<&'v Value>, p: &mut Prompt<'v>) {
    if let Some(Value::Array(list)) = v {
        list.iter().for_each(|m| message(m, p));
    }
}

/// One message (or Responses input item): its content and what the model wrote in it.
fn message<'v>(m: &'v Value, p: &mut Prompt<'v>) {
    content(m.get("content"), p);
    // Assistant turns in the history: reasoning, tool calls, legacy function calls.
    text(m.get("reasoning_content"), p);
    text(m.get("thinking"), p);
    if let Some(Value::Array(calls)) = m.get("tool_calls") {
        for call in calls {
            let f = call.get("function").unwrap_or(call);
            text(f.get("name"), p);
            json_text(f.get("arguments"), p);
        }
    }
    if let Some(f) = m.get("function_call") {
        text(f.get("name"), p);
        json_text(f.get("arguments"), p);
    }
    // Responses items: function calls and their outputs.
    text(m.get("arguments"), p);
    text(m.get("output"), p);
}

/// A content value: a string, or an array of parts (`text` parts, Anthropic tool uses and
/// results); images and audio are not text and are skipped.
fn content<'v>(v: Option<&'v Value>, p: &mut Prompt<'v>) {
    match v {
        Some(Value::String(s)) => p.pieces.push(Cow::Borrowed(s)),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part {
                    Value::String(s) => p.pieces.push(Cow::Borrowed(s)),
                    Value::Object(_) => {
                        text(part.get("text"), p);
                        text(part.get("thinking"), p);
                        json_text(part.get("input"), p);
                        content(part.get("content"), p);
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// A completions prompt: text, texts, token ids, or lists of token ids.
fn prompt<'v>(v: Option<&'v Value>, p: &mut Prompt<'v>) {
    match v {
        Some(Value::String(s)) => p.pieces.push(Cow::Borrowed(s)),
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => p.pieces.push(Cow::Borrowed(s)),
                    Value::Number(_) => p.token_ids += 1,
                    Value::Array(ids) => p.token_ids += ids.len() as u64,
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// A value the model sees as JSON text: a string as is, anything else serialized.
fn json_text<'v>(v: Option<&'v Value>, p: &mut Prompt<'v>) {
    match v {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => p.pieces.push(Cow::Borrowed(s)),
        Some(other) => p.pieces.push(Cow::Owned(other.to_string())),
    }
}

/// Tool definitions, each as its JSON text (templates render them as JSON or close to it).
fn tools<'v>(v: Option<&'v Value>, p: &mut Prompt<'v>) {
    if let Some(Value::Array(list)) = v {
        p.pieces
            .extend(list.iter().map(|t| Cow::Owned(t.to_string())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(api: Api, body: &str) -> (Vec<String>, u64) {
        let v = parse(body.as_bytes()).unwrap();
        let p = extract(api, &v);
        (
            p.pieces.iter().map(|c| c.to_string()).collect(),
            p.token_ids,
        )
    }

    #[test]
    fn chat_messages_parts_and_tools() {
        let body = r#"{"model":"m","messages":[
            {"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
            {"role":"tool","tool_call_id":"1","content":"42"}],
            "tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let (p, ids) = pieces(Api::ChatCompletions, body);
        assert_eq!(
            p,
            [
                "Be brief.",
                "Hi",
                "f",
                "{\"a\":1}",
                "42",
                r#"{"function":{"name":"f"},"type":"function"}"#
            ]
        );
        assert_eq!(ids, 0);
    }

    #[test]
    fn completions_prompts_of_every_shape() {
        assert_eq!(
            pieces(Api::Completions, r#"{"prompt":"once"}"#),
            (vec!["once".into()], 0)
        );
        assert_eq!(
            pieces(Api::Completions, r#"{"prompt":["a","b"]}"#).0,
            ["a", "b"]
        );
        assert_eq!(
            pieces(Api::Completions, r#"{"prompt":[1,2,3]}"#),
            (vec![], 3)
        );
        assert_eq!(
            pieces(Api::Completions, r#"{"prompt":[[1,2],[3]]}"#),
            (vec![], 3)
        );
    }

    #[test]
    fn other_dialects() {
        let anthropic = r#"{"system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":"U"},
            {"role":"assistant","content":[{"type":"tool_use","name":"t","input":{"q":1}}]},
            {"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"R"}]}]}]}"#;
        assert_eq!(
            pieces(Api::Messages, anthropic).0,
            ["S", "U", "{\"q\":1}", "R"]
        );
        let responses = r#"{"instructions":"I","input":[{"role":"user","content":[{"type":"input_text","text":"Q"}]},
            {"type":"function_call_output","output":"O"}]}"#;
        assert_eq!(pieces(Api::Responses, responses).0, ["I", "Q", "O"]);
        assert_eq!(pieces(Api::Responses, r#"{"input":"plain"}"#).0, ["plain"]);
        let tgi = Api::TgiGenerate {
            stream_endpoint: true,
        };
        assert_eq!(pieces(tgi, r#"{"inputs":"X"}"#).0, ["X"]);
        assert_eq!(
            pieces(Api::OllamaGenerate, r#"{"system":"S","prompt":"P"}"#).0,
            ["S", "P"]
        );
        assert_eq!(
            pieces(
                Api::OllamaChat,
                r#"{"messages":[{"role":"user","content":"C"}]}"#
            )
            .0,
            ["C"]
        );
        assert_eq!(
            pieces(Api::LlamaCppCompletion, r#"{"prompt":"L"}"#).0,
            ["L"]
        );
        assert!(extract(Api::ChatCompletions, &Value::Null).is_empty());
    }
}
