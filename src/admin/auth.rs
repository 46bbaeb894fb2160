//! Who may read what on the admin listener. With `[admin] token_file` set, every path
//! but the health checks needs `Authorization: Bearer <token>`; `/metrics` needs it only
//! with `metrics_auth` (Prometheus scrapers are often configured without credentials).
//! The dashboard's static script and stylesheet are open (they hold no data; see
//! [`super::dashboard`]). Unknown paths are protected too, so a new endpoint is never open
//! by accident.

use http::{HeaderMap, header::AUTHORIZATION};

use crate::config::AdminAccess;

/// Whether a request for `path` with these headers may be answered.
pub(super) fn allowed(access: &AdminAccess, path: &str, headers: &HeaderMap) -> bool {
    let Some(token) = &access.token else {
        return true;
    };
    let protected = match path {
        "/healthz" | "/readyz" => false,
        "/metrics" => access.metrics_auth,
        p if super::dashboard::ASSET_PATHS.contains(&p) => false,
        _ => true,
    };
    !protected
        || headers
            .get(AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()))
            .is_some_and(|presented| token.matches(presented))
}

/// The credentials of a `Bearer` authorization (the scheme is case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn bearer_credentials() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
    }
}
