//! TLS material: the listener's certificate chain and key (termination), and the trust
//! roots used towards an `https://` upstream. Loading happens once per config build so a
//! bad file is a config error at start, never a failed handshake later.

use std::{fs::File, io::BufReader, sync::Arc};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::Problem;

/// `[server.tls]` and `[admin.tls]`: the certificate chain and key files.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: String,
    pub key: String,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(key: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let file = File::open(path).map_err(|source| Problem::Io {
        key,
        path: path.into(),
        source,
    })?;
    let certs = rustls_pemfile::certs(&mut BufReader::new(file))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Problem::Io {
            key,
            path: path.into(),
            source,
        })?;
    if certs.is_empty() {
        return Err(Problem::invalid(
            key,
            format!("no PEM certificate found in `{path}`"),
        ));
    }
    Ok(certs)
}

fn read_key(key: &'static str, path: &str) -> Result<PrivateKeyDer<'static>, Problem> {
    let file = File::open(path).map_err(|source| Problem::Io {
        key,
        path: path.into(),
        source,
    })?;
    rustls_pemfile::private_key(&mut BufReader::new(file))
        .map_err(|source| Problem::Io {
            key,
            path: path.into(),
            source,
        })?
        .ok_or_else(|| Problem::invalid(key, format!("no PEM private key found in `{path}`")))
}

/// The config keys a listener's TLS section is reported under.
#[derive(Debug, Clone, Copy)]
pub struct TlsKeys {
    pub section: &'static str,
    pub cert: &'static str,
    pub key: &'static str,
}

impl TlsKeys {
    pub const SERVER: TlsKeys = TlsKeys {
        section: "server.tls",
        cert: "server.tls.cert",
        key: "server.tls.key",
    };
    pub const ADMIN: TlsKeys = TlsKeys {
        section: "admin.tls",
        cert: "admin.tls.cert",
        key: "admin.tls.key",
    };
}

/// A listener's TLS configuration; ALPN offers h2 only when HTTP/2 is enabled.
pub fn server_config(
    keys: TlsKeys,
    cert: &str,
    key: &str,
    http2: bool,
) -> Result<Arc<rustls::ServerConfig>, Vec<Problem>> {
    let (certs, key_der) = match (read_certs(keys.cert, cert), read_key(keys.key, key)) {
        (Ok(c), Ok(k)) => (c, k),
        (c, k) => return Err(c.err().into_iter().chain(k.err()).collect()),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| vec![Problem::invalid(keys.section, e.to_string())])?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            vec![Problem::invalid(
                keys.section,
                format!("certificate/key: {e}"),
            )]
        })?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(Arc::new(config))
}

/// Trust roots for the upstream: the public web PKI, plus an operator's CA file for
/// gateways behind a private CA.
pub fn client_config(ca_file: Option<&str>) -> Result<rustls::ClientConfig, Problem> {
    client_config_for("upstream.ca_file", ca_file)
}

/// As [`client_config`], for the TLS client named by `key` (the CA file's config key).
pub fn client_config_for(
    key: &'static str,
    ca_file: Option<&str>,
) -> Result<rustls::ClientConfig, Problem> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        for cert in read_certs(key, path)? {
            roots.add(cert).map_err(|e| {
                Problem::invalid(key, format!("`{path}`: unusable certificate: {e}"))
            })?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Problem::invalid("upstream", e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
