//! Logging via `tracing`, as text or JSON lines. `RUST_LOG` overrides the configured level.
//! Nothing in goodput logs header values or content; the access log carries numbers only.

use tracing_subscriber::{EnvFilter, fmt};

use crate::config::LogFormat;

/// Installs the global subscriber once; later calls (tests) are ignored.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: escape codes in a file or a log shipper break
    // `grep id=...` and show up as garbage in journald and `docker logs`.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
