//! Access to the admin listener (`[admin]`): the bearer token read from `token_file`,
//! whether `/metrics` needs it, and optional TLS (`[admin.tls]`). The token is read at
//! every config build, so a reload picks up a rotated file; it never appears in `Debug`
//! output, logs or config errors.

use std::{fmt, net::SocketAddr, sync::Arc};

use subtle::ConstantTimeEq;

use serde::Deserialize;

use super::restart::Changed;
use super::{
    Problem,
    tls::{self, TlsKeys, TlsSection},
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    pub listen: String,
    /// A file holding the bearer token the admin endpoints require (none: open).
    pub token_file: Option<String>,
    /// Whether `/metrics` needs the token too (off: scrapers need no credentials).
    pub metrics_auth: bool,
    /// `[admin.tls]`: serve the admin endpoints over HTTPS.
    pub tls: Option<TlsSection>,
}

impl Default for AdminSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".into(),
            token_file: None,
            metrics_auth: false,
            tls: None,
        }
    }
}

/// Who may use the admin endpoints, and over what.
#[derive(Debug, Clone, Default)]
pub struct AdminAccess {
    /// Required as `Authorization: Bearer <token>` on everything but the health endpoints
    /// (and `/metrics` unless `metrics_auth`); `None` leaves the admin endpoints open.
    pub token: Option<AdminToken>,
    pub metrics_auth: bool,
    /// The admin listener's TLS configuration (`[admin.tls]`); HTTP/1.1 only.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl AdminAccess {
    /// The admin listener's TLS can rotate certificates but not be switched on or off.
    pub(super) fn restart_only(&self, new: &AdminAccess, changed: &mut Changed) {
        changed.check(
            &self.tls.is_some(),
            &new.tls.is_some(),
            "admin.tls (on/off)",
        );
    }
}

/// The admin bearer token. Compared in constant time; `Debug` shows no part of it.
#[derive(Clone)]
pub struct AdminToken(Arc<[u8]>);

impl AdminToken {
    /// Whether `presented` is the token. The time taken depends on the lengths only.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_ref().ct_eq(presented))
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

pub(super) fn validate_admin(section: &AdminSection, problems: &mut Vec<Problem>) -> AdminAccess {
    let token = section
        .token_file
        .as_deref()
        .and_then(|path| match read_token(path) {
            Ok(t) => Some(t),
            Err(p) => {
                problems.push(p);
                None
            }
        });
    // Asking for protection that cannot be given must not silently leave /metrics open.
    if section.metrics_auth && section.token_file.is_none() {
        problems.push(Problem::invalid(
            "admin.metrics_auth",
            "needs admin.token_file (the token /metrics would require)",
        ));
    }
    let tls = section.tls.as_ref().and_then(|t| {
        // The admin server speaks HTTP/1.1 only: no h2 in ALPN.
        match tls::server_config(TlsKeys::ADMIN, &t.cert, &t.key, false) {
            Ok(cfg) => Some(cfg),
            Err(mut p) => {
                problems.append(&mut p);
                None
            }
        }
    });
    AdminAccess {
        token,
        metrics_auth: section.metrics_auth,
        tls,
    }
}

/// One line of visible ASCII, surrounding whitespace (a trailing newline) ignored.
fn read_token(path: &str) -> Result<AdminToken, Problem> {
    const KEY: &str = "admin.token_file";
    let text = std::fs::read_to_string(path).map_err(|source| Problem::Io {
        key: KEY,
        path: path.into(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Problem::invalid(KEY, format!("`{path}` is empty")));
    }
    // Anything else could never arrive intact in an Authorization header.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Problem::invalid(
            KEY,
            format!("`{path}` must hold one token of visible ASCII characters, without spaces"),
        ));
    }
    Ok(AdminToken(Arc::from(token.as_bytes())))
}

/// Something allowed but probably unintended; printed by `check-config`, logged at start.
pub fn warnings(admin: SocketAddr, access: &AdminAccess) -> Vec<String> {
    let mut out = Vec::new();
    if !admin.ip().is_loopback() && access.token.is_none() {
        out.push(format!(
            "admin.listen: {admin} is reachable from other hosts and admin.token_file is not \
             set: anyone who can connect can read the request log and the API"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> AdminToken {
        AdminToken(Arc::from(s.as_bytes()))
    }

    #[test]
    fn token_matches_only_itself_and_never_shows() {
        let t = token("s3cret-token");
        assert!(t.matches(b"s3cret-token"));
        assert!(!t.matches(b"s3cret-tokem"));
        assert!(!t.matches(b"s3cret"));
        assert!(!t.matches(b""));
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn open_non_loopback_admin_warns() {
        let open = AdminAccess::default();
        let any: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:9464".parse().unwrap();
        assert_eq!(warnings(any, &open).len(), 1);
        assert!(warnings(lo, &open).is_empty());
        let closed = AdminAccess {
            token: Some(token("t")),
            ..AdminAccess::default()
        };
        assert!(warnings(any, &closed).is_empty());
    }
}
