//! The live dashboard at `GET /`: one HTML page, its stylesheet and its script, embedded in
//! the binary (no CDN, no build step). The page draws its charts in SVG from the JSON API,
//! polling it every two seconds.
//!
//! With `[admin] token_file` set, `GET /` without a valid bearer token answers 401 with the
//! same page: it holds no data, only the shell, whose script asks for the token, keeps it
//! in the tab's sessionStorage and sends it as `Authorization: Bearer` on every API call,
//! so the token never travels in a URL (nor lands in a log or the browser history). The
//! stylesheet and script are static and hold no data either; they are served without a
//! token because a browser loads them without headers.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// The dashboard's address for people: an unspecified listen address (`0.0.0.0`, `::`)
/// becomes loopback, which reaches it from the same host.
pub fn url(addr: std::net::SocketAddr, tls: bool) -> String {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("{}://{addr}/", if tls { "https" } else { "http" })
}

const INDEX_HTML: &str = include_str!("assets/index.html");
const DASHBOARD_JS: &str = include_str!("assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("assets/dashboard.css");

/// Paths of the static assets (open even with a token: see the module doc).
pub(super) const ASSET_PATHS: [&str; 2] = ["/dashboard.js", "/dashboard.css"];

/// Only the page's own assets and API; no framing by other sites, no referrer.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

fn asset(
    status: StatusCode,
    body: &'static str,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

/// The page; `status` is 401 when the request lacked the admin token.
pub(super) fn page(status: StatusCode) -> Response<Full<Bytes>> {
    asset(status, INDEX_HTML, "text/html; charset=utf-8")
}

/// A static asset by path, if it is one.
pub(super) fn static_asset(path: &str) -> Option<Response<Full<Bytes>>> {
    match path {
        "/dashboard.js" => Some(asset(
            StatusCode::OK,
            DASHBOARD_JS,
            "text/javascript; charset=utf-8",
        )),
        "/dashboard.css" => Some(asset(
            StatusCode::OK,
            DASHBOARD_CSS,
            "text/css; charset=utf-8",
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_for_people() {
        assert_eq!(
            url("127.0.0.1:9464".parse().unwrap(), false),
            "http://127.0.0.1:9464/"
        );
        assert_eq!(
            url("0.0.0.0:9464".parse().unwrap(), true),
            "https://127.0.0.1:9464/"
        );
        assert_eq!(url("[::]:1".parse().unwrap(), false), "http://[::1]:1/");
    }

    #[test]
    fn the_page_references_only_its_own_assets() {
        for path in ASSET_PATHS {
            assert!(INDEX_HTML.contains(&format!("\"{path}\"")), "{path}");
        }
        for text in [INDEX_HTML, DASHBOARD_JS, DASHBOARD_CSS] {
            assert!(!text.contains("https://"), "no remote resources");
            assert!(!text.contains("http://") || text.contains("http://www.w3.org/2000/svg"));
        }
        assert!(
            !DASHBOARD_JS.contains("localStorage"),
            "the token stays in the tab"
        );
        assert!(
            !DASHBOARD_JS.contains("?token"),
            "the token never goes into a URL"
        );
    }

    #[test]
    fn every_api_the_script_polls_is_served() {
        for api in [
            "/api/v1/summary",
            "/api/v1/capacity",
            "/api/v1/timeline",
            "/api/v1/drift",
            "/api/v1/calibration",
            "/api/v1/requests",
        ] {
            assert!(DASHBOARD_JS.contains(api), "{api}");
        }
    }
}
