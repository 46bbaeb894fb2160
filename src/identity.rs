//! What the upstream says it is: engine, version, model, weights' revision, read from the
//! endpoints engines serve about themselves, and compared between two reads.
//!
//! | source | gives |
//! |---|---|
//! | `/v1/models` | `model` (the first id), `revision` (vLLM's `root`), `max_model_len`, `engine` from `owned_by` |
//! | vLLM `/version` | `version` |
//! | TGI `/info` | `engine` `tgi`, `version`, `model` (`model_id`), `revision` (`model_sha`) |
//! | SGLang `/get_server_info` | `engine` `sglang`, `version`, `model` (`model_path`) |
//! | llama.cpp `/props` | `engine` `llama.cpp`, `version` (`build_info`), `model` (`model_path`) |
//! | the `Server` header | `server` |
//!
//! A field nobody answered is `None`, and only fields both reads know are compared: an
//! identity that cannot be read is unknown, never a change.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::fetch::Fetcher;

/// Endpoints asked after `/v1/models`, in order; the first that answers 200 with JSON is
/// used.
pub const VERSION_PATHS: [&str; 4] = ["/version", "/info", "/get_server_info", "/props"];

/// How long each identity answer may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest label value kept as is; a longer one is shown by a hash of it.
const LABEL_MAX: usize = 64;

/// What the upstream said about itself. Every field is optional: engines serve different
/// endpoints, and a read may fail.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Identity {
    pub engine: Option<String>,
    pub version: Option<String>,
    pub model: Option<String>,
    pub revision: Option<String>,
    pub max_model_len: Option<u64>,
    pub server: Option<String>,
}

impl Identity {
    /// Nothing was read.
    pub fn is_unknown(&self) -> bool {
        *self == Identity::default()
    }

    /// What differs between `self` (before) and `now`, as `field old → new` phrases, over
    /// the fields both know; empty when nothing known changed.
    pub fn changes(&self, now: &Identity) -> Vec<String> {
        let mut out = Vec::new();
        let mut field = |name: &str, a: &Option<String>, b: &Option<String>| {
            if let (Some(a), Some(b)) = (a, b)
                && a != b
            {
                out.push(format!("{name} {a} → {b}"));
            }
        };
        field("engine", &self.engine, &now.engine);
        field("version", &self.version, &now.version);
        field("model", &self.model, &now.model);
        field("revision", &self.revision, &now.revision);
        field("server", &self.server, &now.server);
        if let (Some(a), Some(b)) = (self.max_model_len, now.max_model_len)
            && a != b
        {
            out.push(format!("max_model_len {a} → {b}"));
        }
        out
    }

    /// Label values for `goodput_upstream_info`: `unknown` where nothing was read, a hash
    /// where a value is longer than [`LABEL_MAX`] (a path, say).
    pub fn labels(&self) -> [String; 4] {
        let label = |v: &Option<String>| match v {
            None => "unknown".to_owned(),
            Some(v) if v.len() <= LABEL_MAX => v.clone(),
            Some(v) => {
                let digest = ring::digest::digest(&ring::digest::SHA256, v.as_bytes());
                let hex: String = digest.as_ref()[..6]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                format!("sha256:{hex}")
            }
        };
        [
            label(&self.engine),
            label(&self.version),
            label(&self.model),
            label(&self.revision),
        ]
    }

    /// Reads what `/v1/models` and a version endpoint answered (either may be missing).
    pub fn from_answers(
        models: Option<&Value>,
        version_path: Option<&str>,
        version: Option<&Value>,
        server: Option<&str>,
    ) -> Identity {
        let mut id = Identity {
            server: server.map(str::to_owned),
            ..Identity::default()
        };
        if let Some(first) = models
            .and_then(|m| m.get("data"))
            .and_then(Value::as_array)
            .and_then(|d| d.first())
        {
            id.model = text(first.get("id"));
            id.revision = text(first.get("root")).filter(|r| Some(r) != id.model.as_ref());
            id.max_model_len = first.get("max_model_len").and_then(Value::as_u64);
            id.engine = text(first.get("owned_by")).filter(|o| o == "vllm");
        }
        let (Some(path), Some(v)) = (version_path, version) else {
            return id;
        };
        match path {
            "/version" => {
                id.version = text(v.get("version"));
            }
            "/info" => {
                id.engine = Some("tgi".to_owned());
                id.version = text(v.get("version"));
                id.model = text(v.get("model_id")).or(id.model);
                id.revision = text(v.get("model_sha")).or(id.revision);
            }
            "/get_server_info" => {
                id.engine = Some("sglang".to_owned());
                id.version = text(v.get("version"));
                id.model = text(v.get("model_path")).or(id.model);
            }
            "/props" => {
                id.engine = Some("llama.cpp".to_owned());
                id.version = text(v.get("build_info"));
                id.model = text(v.get("model_path")).or(id.model);
            }
            _ => {}
        }
        id
    }

    /// One line for logs and reports: `engine vllm, version 0.32.0, model m`.
    pub fn describe(&self) -> String {
        if self.is_unknown() {
            return "unknown".to_owned();
        }
        let mut parts = Vec::new();
        for (name, v) in [
            ("engine", &self.engine),
            ("version", &self.version),
            ("model", &self.model),
            ("revision", &self.revision),
            ("server", &self.server),
        ] {
            if let Some(v) = v {
                parts.push(format!("{name} {v}"));
            }
        }
        if let Some(n) = self.max_model_len {
            parts.push(format!("max_model_len {n}"));
        }
        parts.join(", ")
    }
}

/// A string field, or a number shown as text; empty strings count as absent.
fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn server_of(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(http::header::SERVER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Asks the upstream at `origin` (scheme, host and port, no trailing slash) what it is:
/// `/v1/models`, then [`VERSION_PATHS`] until one answers 200 with JSON.
pub async fn read(f: &Fetcher, origin: &str) -> Identity {
    let mut server = None;
    let models = match f.get(&format!("{origin}/v1/models"), true).await {
        Ok(got) => {
            server = server_of(&got.headers);
            got.status
                .is_success()
                .then(|| serde_json::from_slice::<Value>(&got.body).ok())
                .flatten()
        }
        Err(_) => None,
    };
    let mut version = None;
    for path in VERSION_PATHS {
        let Ok(got) = f.get(&format!("{origin}{path}"), true).await else {
            continue;
        };
        if !got.status.is_success() {
            continue;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&got.body)
            && v.is_object()
        {
            server = server.or_else(|| server_of(&got.headers));
            version = Some((path, v));
            break;
        }
    }
    Identity::from_answers(
        models.as_ref(),
        version.as_ref().map(|(p, _)| *p),
        version.as_ref().map(|(_, v)| v),
        server.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn vllm_tgi_sglang_and_llama_cpp_answers_are_read() {
        let models = json!({"data": [{"id": "m", "root": "/w/m", "owned_by": "vllm",
            "max_model_len": 4096}]});
        let v = Identity::from_answers(
            Some(&models),
            Some("/version"),
            Some(&json!({"version": "0.32.0"})),
            Some("uvicorn"),
        );
        assert_eq!(v.engine.as_deref(), Some("vllm"));
        assert_eq!(v.version.as_deref(), Some("0.32.0"));
        assert_eq!(v.model.as_deref(), Some("m"));
        assert_eq!(v.revision.as_deref(), Some("/w/m"));
        assert_eq!(v.max_model_len, Some(4096));
        let tgi = Identity::from_answers(
            None,
            Some("/info"),
            Some(&json!({"model_id": "org/m", "model_sha": "abc", "version": "3.0.1"})),
            None,
        );
        assert_eq!(
            tgi.describe(),
            "engine tgi, version 3.0.1, model org/m, revision abc"
        );
        let llama = Identity::from_answers(
            None,
            Some("/props"),
            Some(&json!({"model_path": "/m.gguf", "build_info": "b4000-abc"})),
            None,
        );
        assert_eq!(llama.engine.as_deref(), Some("llama.cpp"));
        assert_eq!(llama.version.as_deref(), Some("b4000-abc"));
        let sglang = Identity::from_answers(
            None,
            Some("/get_server_info"),
            Some(&json!({"model_path": "m", "version": "0.4"})),
            None,
        );
        assert_eq!(sglang.engine.as_deref(), Some("sglang"));
    }

    #[test]
    fn only_what_both_reads_know_can_change() {
        let before = Identity {
            version: Some("0.31.0".into()),
            model: Some("m".into()),
            ..Identity::default()
        };
        let after = Identity {
            version: Some("0.32.0".into()),
            model: None,
            server: Some("uvicorn".into()),
            ..Identity::default()
        };
        assert_eq!(before.changes(&after), ["version 0.31.0 → 0.32.0"]);
        assert!(before.changes(&Identity::default()).is_empty());
        assert!(Identity::default().is_unknown());
        assert_eq!(Identity::default().describe(), "unknown");
    }

    #[test]
    fn long_label_values_are_hashed_and_missing_ones_unknown() {
        let id = Identity {
            model: Some("x".repeat(200)),
            ..Identity::default()
        };
        let [engine, _, model, _] = id.labels();
        assert_eq!(engine, "unknown");
        assert!(model.starts_with("sha256:") && model.len() == 19, "{model}");
    }
}
