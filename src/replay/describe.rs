//! report.json `reproducibility`: what production needs to run the same test again and
//! get the same answer — the exact command line (secrets redacted), goodput's version,
//! SHA-256 of the config, profile and probe files, what the target said about itself
//! (its `/v1/models` answer, `Server` header and version endpoint: vLLM `/version`, TGI
//! `/info`, SGLang `/get_server_info`), and the output of `--describe-cmd` (kept as
//! `describe.txt` in the report directory).
//!
//! All of it is read before the load starts, so it describes the candidate as tested. A
//! target that answers none of it is recorded as such; the run goes on.

use std::{path::Path, time::Duration};

use ring::digest::{Context, SHA256};
use serde::Serialize;
use serde_json::Value;

use crate::fetch::Fetcher;

/// The file `--describe-cmd`'s output is kept in.
pub const DESCRIBE_FILE: &str = "describe.txt";

/// How long `--describe-cmd` may run.
pub const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long each of the target's and the exporters' answers may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Version endpoints tried in order: vLLM, TGI, SGLang, llama.cpp.
pub use crate::identity::VERSION_PATHS;

/// Characters of a non-JSON answer kept.
const TEXT_KEPT: usize = 2000;

#[derive(Debug, Clone, Serialize)]
pub struct Reproducibility {
    /// The command line, shell-quoted, secrets replaced by `***`.
    pub command: String,
    pub goodput_version: String,
    pub config_sha256: Option<String>,
    /// Of the profile files' bytes, in order.
    pub profile_sha256: String,
    pub probes_sha256: Option<String>,
    pub target: TargetSays,
    /// The same read again once the load is over: a target restarted or swapped during
    /// the run (a rollback, a canary that flipped) answers differently, and the run fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_at_end: Option<TargetSays>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub describe: Option<Described>,
}

impl Reproducibility {
    /// `target changed during the run: version 0.31.0 → 0.32.0`, when what the target
    /// said at the end differs from what it said at the start in a field both reads know.
    pub fn target_changed(&self) -> Option<String> {
        let end = self.target_at_end.as_ref()?;
        let changes = self.target.identity().changes(&end.identity());
        (!changes.is_empty())
            .then(|| format!("target changed during the run: {}", changes.join(", ")))
    }
}

/// What the target said about itself.
#[derive(Debug, Clone, Serialize, Default)]
pub struct TargetSays {
    pub models_url: String,
    /// The `/v1/models` answer (JSON, else its first 2000 characters as a string).
    pub models: Option<Value>,
    pub models_error: Option<String>,
    /// The `Server` header of that answer.
    pub server: Option<String>,
    /// The first version endpoint that answered 200, and its answer.
    pub version_endpoint: Option<String>,
    pub version: Option<Value>,
}

impl TargetSays {
    /// What these answers say the target is.
    pub fn identity(&self) -> crate::identity::Identity {
        crate::identity::Identity::from_answers(
            self.models.as_ref(),
            self.version_endpoint.as_deref(),
            self.version.as_ref(),
            self.server.as_deref(),
        )
    }
}

/// `--describe-cmd`: the command (redacted), its exit code and where its output is.
#[derive(Debug, Clone, Serialize)]
pub struct Described {
    pub command: String,
    pub file: &'static str,
    pub exit_code: Option<i32>,
    pub output_sha256: Option<String>,
    pub error: Option<String>,
}

/// SHA-256 of `paths`' bytes in order, as hex.
pub fn sha256_files(paths: &[&Path]) -> std::io::Result<String> {
    let mut ctx = Context::new(&SHA256);
    for p in paths {
        ctx.update(&std::fs::read(p)?);
    }
    Ok(hex(ctx.finish().as_ref()))
}

pub fn sha256(bytes: &[u8]) -> String {
    let mut ctx = Context::new(&SHA256);
    ctx.update(bytes);
    hex(ctx.finish().as_ref())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `text` with credentials replaced by `***`: every value of `secrets`, URL user info,
/// `Bearer`/`Basic` tokens and `KEY=VALUE` / `KEY: VALUE` pairs whose key names a key,
/// token, secret or password.
pub fn redact_text(text: &str, secrets: &[String]) -> String {
    static PATTERNS: std::sync::OnceLock<[regex::Regex; 3]> = std::sync::OnceLock::new();
    let [userinfo, bearer, pair] = PATTERNS.get_or_init(|| {
        [
            re(r"(://)[^/@\s:]+:[^/@\s]+@"),
            re(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"),
            re(r#"(?i)\b([A-Za-z0-9_.-]*(?:key|token|secret|password|passwd|credential)[A-Za-z0-9_.-]*)(\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s&,;'"]+)"#),
        ]
    });
    let mut s = text.to_owned();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        s = s.replace(secret.as_str(), "***");
    }
    let s = userinfo.replace_all(&s, "${1}***@");
    let s = bearer.replace_all(&s, "${1} ***");
    pair.replace_all(&s, "${1}${2}***").into_owned()
}

#[expect(
    clippy::expect_used,
    reason = "the patterns are constants, tested below"
)]
fn re(pattern: &str) -> regex::Regex {
    regex::Regex::new(pattern).expect("a constant pattern compiles")
}

/// The command line as one shell-quoted string, secrets redacted. `--api-key-env` names
/// a variable (kept); that variable's value is redacted wherever it appears.
pub fn command_line(args: &[String], secrets: &[String]) -> String {
    args.iter()
        .map(|a| {
            let a = if a.starts_with("--api-key-env") {
                a.clone()
            } else {
                redact_text(a, secrets)
            };
            quote(&a)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c));
    if plain {
        a.to_owned()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

fn answer(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| {
        Value::String(
            String::from_utf8_lossy(body)
                .chars()
                .take(TEXT_KEPT)
                .collect(),
        )
    })
}

/// Asks the target at `models_url` (`…/v1/models`) and `origin` + each of
/// [`VERSION_PATHS`] about itself.
pub async fn ask_target(f: &Fetcher, models_url: &str, origin: &str) -> TargetSays {
    let mut says = TargetSays {
        models_url: shown(models_url),
        ..TargetSays::default()
    };
    match f.get(models_url, true).await {
        Ok(got) => {
            says.server = got
                .headers
                .get(http::header::SERVER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if got.status.is_success() {
                says.models = Some(answer(&got.body));
            } else {
                says.models_error = Some(format!("HTTP {}", got.status));
            }
        }
        Err(e) => says.models_error = Some(e.to_string()),
    }
    for path in VERSION_PATHS {
        let Ok(got) = f.get(&format!("{origin}{path}"), true).await else {
            continue;
        };
        if got.status.is_success() {
            if says.server.is_none() {
                says.server = got
                    .headers
                    .get(http::header::SERVER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
            }
            says.version_endpoint = Some(path.to_owned());
            says.version = Some(answer(&got.body));
            break;
        }
    }
    says
}

/// Runs `--describe-cmd` by `sh -c`, its stdout and stderr into `dir`/[`DESCRIBE_FILE`]
/// (credentials redacted as in the command line: a deployment's YAML may hold some).
pub async fn describe(cmd: &str, dir: &Path, secrets: &[String]) -> Described {
    let mut out = Described {
        command: redact_text(cmd, secrets),
        file: DESCRIBE_FILE,
        exit_code: None,
        output_sha256: None,
        error: None,
    };
    let run = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(DESCRIBE_TIMEOUT, run).await {
        Err(_) => out.error = Some(format!("still running after {DESCRIBE_TIMEOUT:?}: killed")),
        Ok(Err(e)) => out.error = Some(format!("cannot run it: {e}")),
        Ok(Ok(o)) => {
            let mut raw = o.stdout;
            raw.extend_from_slice(&o.stderr);
            let text = redact_text(&String::from_utf8_lossy(&raw), secrets).into_bytes();
            out.exit_code = o.status.code();
            out.output_sha256 = Some(sha256(&text));
            if let Err(e) = std::fs::write(dir.join(DESCRIBE_FILE), &text) {
                out.error = Some(format!("cannot write {DESCRIBE_FILE}: {e}"));
            }
        }
    }
    out
}

/// `url` as reports show it: without user info or query (which may hold credentials).
pub fn shown(url: &str) -> String {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return redact_text(url, &[]);
    };
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = uri.host().unwrap_or("?");
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{scheme}://{host}{port}{}", uri.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_the_rest_kept() {
        let secrets = vec!["s3cr3t-value".to_owned()];
        let args: Vec<String> = [
            "goodput",
            "replay",
            "--target",
            "http://user:pw@10.0.0.5:8000",
            "--api-key-env",
            "MY_KEY",
            "--describe-cmd",
            "curl -H 'Authorization: Bearer abc.def' http://h/x?token=zz&a=1",
            "--contract",
            "api_key=xyz",
            "--contract",
            "note=uses s3cr3t-value",
            "--warmup",
            "2s",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let c = command_line(&args, &secrets);
        assert_eq!(
            c,
            "goodput replay --target 'http://***@10.0.0.5:8000' --api-key-env MY_KEY \
             --describe-cmd 'curl -H '\\''Authorization: Bearer ***'\\'' http://h/x?token=***&a=1' \
             --contract 'api_key=***' --contract 'note=uses ***' --warmup 2s"
        );
        for secret in ["pw@", "abc.def", "zz&", "xyz", "s3cr3t"] {
            assert!(!c.contains(secret), "{secret} in {c}");
        }
    }

    #[test]
    fn digests_are_sha256() {
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
