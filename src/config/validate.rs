//! From the file schema plus flag overrides to the runtime [`Config`], collecting every
//! problem rather than stopping at the first.

use std::{net::SocketAddr, path::Path};

use super::{
    Config, ConfigError, Overrides, Problem, admin, calibration, cost, drift, file::FileConfig,
    log, measure, metrics, otlp, profile, server, shadow, slo, tokenizer, upstream,
    usage_injection,
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

pub(super) fn positive(key: &str, value: u64, problems: &mut Vec<Problem>) {
    if value == 0 {
        problems.push(Problem::invalid(key, "must be greater than zero"));
    }
}

fn validate(file: FileConfig, overrides: &Overrides, salt: &str) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
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
    let server = server::validate(&file.server, listen, &mut problems);
    let admin_access = admin::validate_admin(&file.admin, &mut problems);
    let upstream = upstream::validate(&file.upstream, overrides.upstream.as_deref(), &mut problems);
    let measure = measure::validate(&file.measure, &mut problems);
    let metrics = metrics::validate_metrics(&file.metrics, &mut problems);
    let log = log::validate(&file.log, &mut problems);
    let slo = slo::validate(&file.slo, salt, &mut problems);
    let cost = file
        .cost
        .as_ref()
        .map(|c| cost::validate_cost(c, &mut problems));
    let tokenizer = tokenizer::validate_tokenizer(&file.tokenizer, &mut problems);
    let usage_injection = usage_injection::validate_injection(&file.usage_injection, &mut problems);
    let profile = profile::validate_profile(&file.profile, &mut problems);
    let drift = drift::validate_drift(&file.drift, &mut problems);
    let calibration =
        calibration::validate_calibration(&file.calibration, upstream.as_ref(), &mut problems);
    let otlp = otlp::validate_otlp(file.otlp.as_ref(), &mut problems);
    let shadow = shadow::validate_shadow(file.shadow.as_ref(), upstream.as_ref(), &mut problems);

    match (server, admin, upstream, log, calibration) {
        (Some(server), Some(admin), Some(upstream), Some(log), Some(calibration))
            if problems.is_empty() =>
        {
            Ok(Config {
                server,
                upstream,
                admin,
                admin_access,
                measure,
                metrics,
                log,
                slo,
                cost,
                tokenizer,
                usage_injection,
                profile,
                drift,
                calibration,
                otlp,
                shadow,
            })
        }
        _ => Err(ConfigError(problems)),
    }
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
        assert_eq!(cfg.upstream.scheme, http::uri::Scheme::HTTPS);
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
