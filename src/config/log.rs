//! `[log]`: the log format, level and access log. The file's section, its validation and
//! the runtime value.

use serde::Deserialize;

use super::Problem;
use super::restart::Changed;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    pub format: String,
    pub level: String,
    pub access_log: bool,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: "text".into(),
            level: "info".into(),
            access_log: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct Log {
    pub format: LogFormat,
    pub level: String,
    pub access_log: bool,
}

impl Log {
    /// The subscriber is installed once.
    pub(super) fn restart_only(&self, new: &Log, changed: &mut Changed) {
        changed.check(&self.format, &new.format, "log.format");
        changed.check(&self.level, &new.level, "log.level");
    }
}

/// The runtime `[log]`; `None` when the format is unknown (a problem is pushed).
pub(super) fn validate(l: &LogSection, problems: &mut Vec<Problem>) -> Option<Log> {
    if let Err(e) = l.level.parse::<tracing_subscriber::EnvFilter>() {
        problems.push(Problem::invalid("log.level", format!("`{}`: {e}", l.level)));
    }
    let format = match l.format.as_str() {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            problems.push(Problem::invalid(
                "log.format",
                format!("`{other}` is not one of `text`, `json`"),
            ));
            return None;
        }
    };
    Some(Log {
        format,
        level: l.level.clone(),
        access_log: l.access_log,
    })
}
