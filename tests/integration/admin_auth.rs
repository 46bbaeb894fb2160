//! Admin access control over real loopback sockets: the bearer token from
//! `[admin] token_file` on the API (health checks always open, `/metrics` only with
//! `metrics_auth`), the token re-read on reload, `check-config`'s warning for an open admin
//! address reachable from other hosts, and the admin listener over TLS (`[admin.tls]`).
#![expect(
    clippy::unwrap_used,
    reason = "tests: a failed set-up must stop the test"
)]

use std::{net::SocketAddr, path::Path, process::Command, sync::Arc};

use crate::common::{harness::*, temp::TempDir};
use bytes::Bytes;
use goodput::{
    config::{self, Overrides},
    run::{self, ConfigSource, ReloadError},
};
use http::{Request, header::AUTHORIZATION};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const TOKEN: &str = "admin-T0KEN-for-tests";

/// A config file in a directory of its own, with the token file beside it.
fn config_dir(admin_extra: &str, rest: &str) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new("admin");
    let token = dir.write("token", &format!("{TOKEN}\n")).unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n{admin_extra}\n\
         [upstream]\nurl = \"http://127.0.0.1:9\"\n[log]\naccess_log = false\n{rest}",
        token.display()
    );
    let path = dir.write("goodput.toml", &text).unwrap();
    (dir, path)
}

async fn start(path: &Path) -> run::Running {
    let overrides = Overrides::default();
    let cfg = config::load(Some(path), &overrides).unwrap();
    run::start_from(
        cfg,
        Some(ConfigSource {
            path: path.to_path_buf(),
            overrides,
        }),
    )
    .await
    .unwrap()
}

/// GETs `path` with an optional `Authorization` value; returns the status, the
/// `WWW-Authenticate` header and the body.
async fn get(admin: SocketAddr, path: &str, auth: Option<&str>) -> (u16, Option<String>, String) {
    let mut req = Request::get(format!("http://{admin}{path}"));
    if let Some(a) = auth {
        req = req.header(AUTHORIZATION, a);
    }
    let client = client();
    let resp = client
        .request(req.body(Default::default()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        challenge,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn the_api_needs_the_token_and_health_checks_never_do() {
    let (_dir, path) = config_dir("", "");
    let running = start(&path).await;
    let admin = running.admin_addr;
    let right = bearer(TOKEN);

    for auth in [None, Some("Bearer wrong-token"), Some("Basic YWRtaW4=")] {
        let (status, challenge, body) = get(admin, "/api/v1/summary", auth).await;
        assert_eq!(status, 401, "{auth:?}: {body}");
        assert!(challenge.unwrap().starts_with("Bearer"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
        assert!(!body.contains(TOKEN));
    }
    let (status, _, body) = get(admin, "/api/v1/summary", Some(&right)).await;
    assert_eq!(status, 200, "{body}");
    // The scheme is case-insensitive; unknown paths are protected too.
    let (status, _, _) = get(admin, "/api/v1/requests", Some(&format!("bearer {TOKEN}"))).await;
    assert_eq!(status, 200);
    assert_eq!(get(admin, "/no-such-page", None).await.0, 401);

    for health in ["/healthz", "/readyz"] {
        assert_eq!(get(admin, health, None).await.0, 200, "{health}");
        assert_eq!(get(admin, health, Some("Bearer wrong")).await.0, 200);
    }

    // /metrics stays open by default, and counts the refusals above.
    let (status, _, text) = get(admin, "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(
        text.contains("goodput_admin_unauthorized_total 4"),
        "{}",
        text.lines()
            .filter(|l| l.contains("unauthorized"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(!text.contains(TOKEN));
    running.shutdown().await;
}

#[tokio::test]
async fn metrics_auth_protects_metrics() {
    let (_dir, path) = config_dir("metrics_auth = true", "");
    let running = start(&path).await;
    let admin = running.admin_addr;
    assert_eq!(get(admin, "/metrics", None).await.0, 401);
    assert_eq!(get(admin, "/metrics", Some("Bearer nope")).await.0, 401);
    let (status, _, text) = get(admin, "/metrics", Some(&bearer(TOKEN))).await;
    assert_eq!(status, 200);
    assert!(text.contains("goodput_admin_unauthorized_total 2"));
    assert_eq!(get(admin, "/healthz", None).await.0, 200);
    running.shutdown().await;
}

#[tokio::test]
async fn a_reload_rereads_the_token_file() {
    let (dir, path) = config_dir("", "");
    let running = start(&path).await;
    let admin = running.admin_addr;
    dir.write("token", "rotated-token\n").unwrap();
    running.reloader.as_ref().unwrap().reload().unwrap();
    assert_eq!(
        get(admin, "/api/v1/summary", Some(&bearer(TOKEN))).await.0,
        401
    );
    let (status, _, _) = get(admin, "/api/v1/summary", Some("Bearer rotated-token")).await;
    assert_eq!(status, 200);
    running.shutdown().await;
}

fn check_config(text: &str) -> (Option<i32>, String) {
    let dir = TempDir::new("check");
    let path = dir.write("goodput.toml", text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["check-config", &path.display().to_string()])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_warns_of_an_open_admin_reachable_from_other_hosts() {
    let upstream = "[upstream]\nurl = \"http://127.0.0.1:8000\"\n";
    let (code, stderr) = check_config(&format!("[admin]\nlisten = \"0.0.0.0:9464\"\n{upstream}"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("warning"), "{stderr}");
    assert!(stderr.contains("admin.token_file"), "{stderr}");

    let dir = TempDir::new("token");
    let token = dir.write("token", "t\n").unwrap();
    let (code, stderr) = check_config(&format!(
        "[admin]\nlisten = \"0.0.0.0:9464\"\ntoken_file = \"{}\"\n{upstream}",
        token.display()
    ));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    let (code, stderr) = check_config(upstream);
    assert_eq!(code, Some(0));
    assert!(!stderr.contains("warning"), "{stderr}");

    // An empty token file is a configuration error naming the file.
    let empty = dir.write("empty", "\n").unwrap();
    let (code, stderr) = check_config(&format!(
        "[admin]\ntoken_file = \"{}\"\n{upstream}",
        empty.display()
    ));
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("admin.token_file"), "{stderr}");
    assert!(stderr.contains(&empty.display().to_string()), "{stderr}");

    // Protecting /metrics without a token would leave it open: refused.
    let (code, stderr) = check_config(&format!("[admin]\nmetrics_auth = true\n{upstream}"));
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("admin.metrics_auth"), "{stderr}");
}

/// A CA, and a certificate for 127.0.0.1 it signed, as PEM files in `dir`.
fn certificates(dir: &TempDir) -> (rcgen::Certificate, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "goodput admin test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let cert = dir.write("admin.crt", &leaf.pem()).unwrap();
    let key = dir.write("admin.key", &leaf_key.serialize_pem()).unwrap();
    let section = format!(
        "[admin.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    (ca, section)
}

/// One HTTPS GET to the admin listener, trusting only `ca`.
async fn https_get(admin: SocketAddr, ca: &rcgen::Certificate, path: &str, auth: &str) -> u16 {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(admin).await.unwrap();
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", admin.to_string())
        .header(AUTHORIZATION, auth)
        .body(Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(req).await.unwrap().status().as_u16()
}

#[tokio::test]
async fn the_admin_listener_serves_https_with_admin_tls() {
    let dir = TempDir::new("tls");
    let (ca, tls_section) = certificates(&dir);
    let (_cfg_dir, path) = config_dir("", &tls_section);
    let running = start(&path).await;
    let admin = running.admin_addr;
    assert_eq!(https_get(admin, &ca, "/healthz", "").await, 200);
    assert_eq!(
        https_get(admin, &ca, "/api/v1/summary", &bearer(TOKEN)).await,
        200
    );
    assert_eq!(
        https_get(admin, &ca, "/api/v1/summary", "Bearer wrong").await,
        401
    );
    // Plain HTTP on the TLS listener gets no answer.
    let plain = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client().get(format!("http://{admin}/healthz").parse().unwrap()),
    )
    .await;
    assert!(!matches!(plain, Ok(Ok(ref r)) if r.status() == 200));

    // Turning admin TLS off needs a restart: the reload is refused, HTTPS keeps serving.
    let (_plain_dir, plain_path) = config_dir("", "");
    std::fs::copy(&plain_path, &path).unwrap();
    let refused = running.reloader.as_ref().unwrap().reload();
    assert!(
        matches!(&refused, Err(ReloadError::RestartRequired(keys)) if keys.contains(&"admin.tls (on/off)")),
        "{refused:?}"
    );
    assert_eq!(https_get(admin, &ca, "/healthz", "").await, 200);
    running.shutdown().await;
}
