//! From the file schema plus flag overrides to the runtime [`Config`], collecting every
//! problem rather than stopping at the first.

use std::{net::SocketAddr, path::Path, sync::Arc};

use http::{Uri, uri::Scheme};

use super::{
    Config, ConfigError, Log, LogFormat, Measure, Overrides, Problem, Server, ServerLimits,
    Upstream, admin, calibration, counting, file::FileConfig, otlp, profile_file, slo, tls,
};

/// Reads (if given) and validates a config file, applying the overrides.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    load_with_salt(path, overrides, &random_salt())
}

/// As [`load`], with the tenant salt to use when the file sets none (a reload passes the
/// running one so tenant hashes stay comparable).
pub fn load_with_salt(
    path: Option<&Path>,
    overrides: &Overrides,
    salt: &str,
) -> Result<Config, ConfigError> {
    let file = match path {
        None => FileConfig::default(),
        Some(path) => read(path).map_err(|p| ConfigError(vec![p]))?,
    };
    validate(file, overrides, salt)
}

/// Validates configuration text (e.g. an embedded default); `origin` names it in errors.
pub fn load_str(text: &str, origin: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|source| {
        ConfigError(vec![Problem::Parse {
            path: origin.to_owned(),
            source: Box::new(source),
        }])
    })?;
    validate(file, overrides, &random_salt())
}

fn random_salt() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read(path: &Path) -> Result<FileConfig, Problem> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Problem::Io {
        key: "--config",
        path: shown.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| Problem::Parse {
        path: shown,
        source: Box::new(source),
    })
}

fn socket_addr(key: &str, value: &str, problems: &mut Vec<Problem>) -> Option<SocketAddr> {
    match value.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            problems.push(Problem::invalid(
                key,
                format!("`{value}` is not an address like 127.0.0.1:8080 or [::1]:8080"),
            ));
            None
        }
    }
}

/// The smallest request-head limit: hyper's HTTP/1 server reads with at least 8 KiB.
const MIN_HEADER_BYTES: usize = 8192;

fn positive(key: &str, value: u64, problems: &mut Vec<Problem>) {
    if value == 0 {
        problems.push(Problem::invalid(key, "must be greater than zero"));
    }
}

fn validate(file: FileConfig, overrides: &Overrides, salt: &str) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let slo = slo::validate(&file.slo, salt, &mut problems);
    let cost = file
        .cost
        .as_ref()
        .map(|c| slo::validate_cost(c, &mut problems));
    let tokenizer = counting::validate_tokenizer(&file.tokenizer, &mut problems);
    let usage_injection = counting::validate_injection(&file.usage_injection, &mut problems);
    let profile = profile_file::validate_profile(&file.profile, &mut problems);
    let drift = profile_file::validate_drift(&file.drift, &mut problems);
    let listen_raw = overrides.listen.as_deref().unwrap_or(&file.server.listen);
    let listen = socket_addr("server.listen", listen_raw, &mut problems);
    let admin_raw = overrides.admin.as_deref().unwrap_or(&file.admin.listen);
    let admin = socket_addr("admin.listen", admin_raw, &mut problems);
    if let (Some(l), Some(a)) = (listen, admin)
        && l == a
        && l.port() != 0
    {
        problems.push(Problem::invalid(
            "admin.listen",
            "must differ from server.listen: admin endpoints never share the data port",
        ));
    }

    let admin_access = admin::validate_admin(&file.admin, &mut problems);

    let server_tls = match &file.server.tls {
        None => None,
        Some(t) => {
            match tls::server_config(tls::TlsKeys::SERVER, &t.cert, &t.key, file.server.http2) {
                Ok(cfg) => Some(cfg),
                Err(mut p) => {
                    problems.append(&mut p);
                    None
                }
            }
        }
    };

    let upstream = upstream(&file, overrides, &mut problems);
    let calibration =
        calibration::validate_calibration(&file.calibration, upstream.as_ref(), &mut problems);
    let otlp = otlp::validate_otlp(file.otlp.as_ref(), &mut problems);

    let s = &file.server;
    positive(
        "server.header_read_timeout",
        s.header_read_timeout.as_millis() as u64,
        &mut problems,
    );
    positive(
        "server.max_connections",
        s.max_connections as u64,
        &mut problems,
    );
    positive(
        "server.http2_max_concurrent_streams",
        u64::from(s.http2_max_concurrent_streams),
        &mut problems,
    );
    positive(
        "server.http2_max_control_frames_per_second",
        u64::from(s.http2_max_control_frames_per_second),
        &mut problems,
    );
    positive(
        "server.request_body_timeout",
        s.request_body_timeout.as_millis() as u64,
        &mut problems,
    );
    // hyper's HTTP/1 read buffer cannot be smaller; h2 takes a u32.
    if !(MIN_HEADER_BYTES..=u32::MAX as usize).contains(&s.max_request_header_bytes) {
        problems.push(Problem::invalid(
            "server.max_request_header_bytes",
            format!("must be between {MIN_HEADER_BYTES} and {}", u32::MAX),
        ));
    }
    let u = &file.upstream;
    positive(
        "upstream.max_connections",
        u.max_connections as u64,
        &mut problems,
    );
    positive(
        "upstream.pool_wait_timeout",
        u.pool_wait_timeout.as_millis() as u64,
        &mut problems,
    );
    positive(
        "upstream.connect_timeout",
        u.connect_timeout.as_millis() as u64,
        &mut problems,
    );
    positive(
        "upstream.response_header_timeout",
        u.response_header_timeout.as_millis() as u64,
        &mut problems,
    );
    positive(
        "upstream.idle_timeout",
        u.idle_timeout.as_millis() as u64,
        &mut problems,
    );
    let m = &file.measure;
    positive(
        "measure.channel_capacity",
        m.channel_capacity as u64,
        &mut problems,
    );
    positive(
        "measure.recent_requests",
        m.recent_requests as u64,
        &mut problems,
    );
    positive("measure.max_models", m.max_models as u64, &mut problems);

    let format = match file.log.format.as_str() {
        "text" => Some(LogFormat::Text),
        "json" => Some(LogFormat::Json),
        other => {
            problems.push(Problem::invalid(
                "log.format",
                format!("`{other}` is not one of `text`, `json`"),
            ));
            None
        }
    };
    if let Err(e) = file.log.level.parse::<tracing_subscriber::EnvFilter>() {
        problems.push(Problem::invalid(
            "log.level",
            format!("`{}`: {e}", file.log.level),
        ));
    }

    match (listen, admin, upstream, format, calibration) {
        (Some(listen), Some(admin), Some(upstream), Some(format), Some(calibration))
            if problems.is_empty() =>
        {
            Ok(Config {
                server: Server {
                    listen,
                    tls: server_tls,
                    header_read_timeout: s.header_read_timeout,
                    drain_timeout: s.drain_timeout,
                    http2: s.http2,
                    limits: ServerLimits {
                        max_connections: s.max_connections,
                        http2_max_concurrent_streams: s.http2_max_concurrent_streams,
                        max_request_header_bytes: s.max_request_header_bytes,
                        request_body_timeout: s.request_body_timeout,
                        http2_max_control_frames_per_second: s.http2_max_control_frames_per_second,
                    },
                    http1_half_close: s.http1_half_close,
                },
                upstream,
                admin,
                admin_access,
                measure: Measure {
                    request_inspect_limit: usize::try_from(m.request_inspect_limit)
                        .unwrap_or(usize::MAX),
                    response_inspect_limit: usize::try_from(m.response_inspect_limit)
                        .unwrap_or(usize::MAX),
                    channel_capacity: m.channel_capacity,
                    recent_requests: m.recent_requests,
                    max_models: m.max_models,
                    kernel_timestamps: m.kernel_timestamps,
                },
                log: Log {
                    format,
                    level: file.log.level,
                    access_log: file.log.access_log,
                },
                slo,
                cost,
                tokenizer,
                usage_injection,
                profile,
                drift,
                calibration,
                otlp,
            })
        }
        _ => Err(ConfigError(problems)),
    }
}

fn upstream(
    file: &FileConfig,
    overrides: &Overrides,
    problems: &mut Vec<Problem>,
) -> Option<Upstream> {
    let u = &file.upstream;
    let Some(raw) = overrides.upstream.as_deref().or(u.url.as_deref()) else {
        problems.push(Problem::invalid(
            "upstream.url",
            "required: set it in the file or pass --upstream http://host:port",
        ));
        return None;
    };
    let uri: Uri = match raw.parse() {
        Ok(uri) => uri,
        Err(e) => {
            problems.push(Problem::invalid("upstream.url", format!("`{raw}`: {e}")));
            return None;
        }
    };
    let scheme = uri.scheme().cloned();
    let https = match scheme.as_ref().map(Scheme::as_str) {
        Some("http") => false,
        Some("https") => true,
        _ => {
            problems.push(Problem::invalid(
                "upstream.url",
                format!("`{raw}` must start with http:// or https://"),
            ));
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        problems.push(Problem::invalid(
            "upstream.url",
            format!("`{raw}` has no host"),
        ));
        return None;
    };
    if uri.query().is_some() {
        problems.push(Problem::invalid(
            "upstream.url",
            format!("`{raw}` must not have a query"),
        ));
    }
    if u.ca_file.is_some() && !https {
        problems.push(Problem::invalid(
            "upstream.ca_file",
            "only used with an https:// upstream",
        ));
    }
    let tls = match tls::client_config(u.ca_file.as_deref()) {
        Ok(cfg) => Arc::new(cfg),
        Err(p) => {
            problems.push(p);
            return None;
        }
    };
    Some(Upstream {
        scheme: scheme.unwrap_or(Scheme::HTTP),
        authority,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        tls,
        http2: u.http2,
        preserve_host: u.preserve_host,
        connect_timeout: u.connect_timeout,
        response_header_timeout: u.response_header_timeout,
        idle_timeout: u.idle_timeout,
        pool_idle_timeout: u.pool_idle_timeout,
        pool_max_idle_per_host: u.pool_max_idle_per_host,
        max_connections: u.max_connections,
        pool_wait_timeout: u.pool_wait_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|source| {
            ConfigError(vec![Problem::Parse {
                path: "test".into(),
                source: Box::new(source),
            }])
        })?;
        validate(file, overrides, "test-salt")
    }

    #[test]
    fn flags_alone_are_enough() {
        let o = Overrides {
            upstream: Some("http://127.0.0.1:8000/base/".into()),
            ..Default::default()
        };
        let cfg = parse("", &o).unwrap();
        assert_eq!(cfg.upstream.authority.as_str(), "127.0.0.1:8000");
        assert_eq!(cfg.upstream.base_path, "/base");
        assert_eq!(cfg.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(cfg.admin.to_string(), "127.0.0.1:9464");
        assert_eq!(cfg.upstream.response_header_timeout.as_secs(), 300);
    }

    #[test]
    fn flags_override_the_file() {
        let o = Overrides {
            listen: Some("127.0.0.1:1".into()),
            ..Default::default()
        };
        let cfg = parse("[upstream]\nurl = \"https://gw.example\"\n", &o).unwrap();
        assert_eq!(cfg.server.listen.port(), 1);
        assert_eq!(cfg.upstream.scheme, Scheme::HTTPS);
        assert_eq!(cfg.upstream.base_path, "");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = r#"
            [server]
            listen = "nope"
            [admin]
            listen = "also nope"
            [upstream]
            url = "ftp://x"
            idle_timeout = "0s"
            [log]
            format = "xml"
        "#;
        let err = parse(text, &Overrides::default()).unwrap_err();
        let msg = err.to_string();
        for key in [
            "server.listen",
            "admin.listen",
            "upstream.url",
            "idle_timeout",
            "log.format",
        ] {
            assert!(msg.contains(key), "{key} missing from:\n{msg}");
        }
        assert_eq!(err.0.len(), 5, "{msg}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = parse(
            "[upstream]\nurl = \"http://a\"\ntimeout = \"1s\"\n",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `timeout`"), "{err}");
    }

    #[test]
    fn missing_upstream_says_how_to_fix_it() {
        let err = parse("", &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("--upstream"), "{err}");
    }

    #[test]
    fn missing_tls_files_are_named() {
        let text = "[server.tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\n";
        let o = Overrides {
            upstream: Some("http://a".into()),
            ..Default::default()
        };
        let err = parse(text, &o).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/c.pem") && msg.contains("/nonexistent/k.pem"),
            "{msg}"
        );
    }

    #[test]
    fn limits_have_defaults_and_are_checked() {
        let o = Overrides {
            upstream: Some("http://a".into()),
            ..Default::default()
        };
        let cfg = parse("", &o).unwrap();
        let l = cfg.server.limits;
        assert_eq!(l.max_connections, 10_000);
        assert_eq!(l.http2_max_concurrent_streams, 128);
        assert_eq!(l.max_request_header_bytes, 65_536);
        assert_eq!(l.request_body_timeout.as_secs(), 60);
        assert_eq!(cfg.upstream.max_connections, 1024);
        assert_eq!(cfg.upstream.pool_wait_timeout.as_secs(), 10);
        let text = r#"
            [server]
            max_connections = 0
            http2_max_concurrent_streams = 0
            max_request_header_bytes = 4096
            request_body_timeout = "0s"
            [upstream]
            max_connections = 0
            pool_wait_timeout = "0s"
        "#;
        let msg = parse(text, &o).unwrap_err().to_string();
        for key in [
            "server.max_connections",
            "server.http2_max_concurrent_streams",
            "server.max_request_header_bytes",
            "server.request_body_timeout",
            "upstream.max_connections",
            "upstream.pool_wait_timeout",
        ] {
            assert!(msg.contains(key), "{key} missing from:\n{msg}");
        }
    }

    #[test]
    fn admin_must_not_share_the_data_port() {
        let o = Overrides {
            upstream: Some("http://a".into()),
            listen: Some("127.0.0.1:7000".into()),
            admin: Some("127.0.0.1:7000".into()),
        };
        assert!(parse("", &o).is_err());
    }
}
