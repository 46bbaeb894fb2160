//! Header handling of a reverse proxy: hop-by-hop fields removed in both directions
//! (RFC 9110 §7.6.1, plus the legacy fields every proxy strips), `X-Forwarded-*` set, and
//! `Host` pointed at the upstream unless the operator asks to preserve it.

use crate::measure::REQUEST_ID;
use http::{
    HeaderMap, HeaderName, HeaderValue, Request, Version,
    header::{CONNECTION, CONTENT_LENGTH, HOST, TE, TRANSFER_ENCODING, UPGRADE},
};

use super::ConnInfo;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Fields that only describe one connection. `Proxy-Authenticate`/`Proxy-Authorization`
/// are aimed at a forward proxy, not at the gateway behind us.
const HOP_BY_HOP: [HeaderName; 8] = [
    CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    TE,
    http::header::TRAILER,
    TRANSFER_ENCODING,
];

/// Whether the request asks to switch protocols (e.g. WebSocket) over HTTP/1.1.
pub fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(UPGRADE)
        && connection_tokens(req.headers()).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes hop-by-hop fields. For an upgrade, `Connection: upgrade` and `Upgrade` are the
/// point of the request and are kept (and re-set cleanly).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let listed: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in listed {
        if !(upgrade && name == UPGRADE) {
            headers.remove(&name);
        }
    }
    // `TE: trailers` is the one TE value that must survive (gRPC-style trailers over h2).
    let te_trailers = headers
        .get(TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    if upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(UPGRADE);
    }
}

/// RFC 9112 §3.2: an HTTP/1.1 request has exactly one `Host`; no request has two.
/// HTTP/2 and HTTP/3 carry the authority in `:authority` and may leave `Host` out.
pub fn check_host<B>(req: &Request<B>) -> Result<(), &'static str> {
    let mut hosts = req.headers().get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Err("more than one Host header"),
        (None, _) if req.version() == Version::HTTP_11 => {
            Err("an HTTP/1.1 request must carry a Host header")
        }
        _ => Ok(()),
    }
}

/// With `preserve_host`, the `Host` the upstream sees is the client's, so it must be
/// the one the request was for: an HTTP/2 request whose `host` names another authority
/// than its `:authority` is malformed (RFC 9113 §8.3.1) and refused. (HTTP/1's
/// absolute-form, where the request target wins over `Host`, is settled in
/// [`prepare_request`].)
pub fn check_authority<B>(req: &Request<B>, preserve_host: bool) -> Result<(), &'static str> {
    if !preserve_host || req.version() != Version::HTTP_2 {
        return Ok(());
    }
    let (Some(authority), Some(host)) = (req.uri().authority(), req.headers().get(HOST)) else {
        return Ok(());
    };
    let same = host
        .to_str()
        .is_ok_and(|h| h.trim().eq_ignore_ascii_case(authority.as_str()));
    if same {
        Ok(())
    } else {
        Err("the host header differs from :authority")
    }
}

/// Prepares the request head for the upstream. `client_authority` is the authority of
/// the request target (HTTP/1 absolute-form, HTTP/2 `:authority`): where there is one,
/// it wins over `Host` (RFC 9112 §3.2.2, RFC 9113 §8.3.1).
pub fn prepare_request(
    headers: &mut HeaderMap,
    conn: Option<&ConnInfo>,
    client_authority: Option<&str>,
    preserve_host: bool,
    upgrade: bool,
) {
    // The request id joins the upstream's logs to the record: the proxy set it (or kept
    // the client's), so a `Connection` header that lists it does not take it away.
    let request_id = headers.get(REQUEST_ID).cloned();
    strip_hop_by_hop(headers, upgrade);
    if let Some(id) = request_id {
        headers.insert(REQUEST_ID, id);
    }
    let original_host = client_authority.map(str::to_owned).or_else(|| {
        headers
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    if let Some(conn) = conn {
        let ip = conn.remote.ip().to_string();
        let value = match headers.get(X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
            Some(prior) if !prior.trim().is_empty() => format!("{prior}, {ip}"),
            _ => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(X_FORWARDED_FOR, v);
        }
        let proto = if conn.tls { "https" } else { "http" };
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if let Some(host) = &original_host
        && !headers.contains_key(X_FORWARDED_HOST)
        && let Ok(v) = HeaderValue::from_str(host)
    {
        headers.insert(X_FORWARDED_HOST, v);
    }
    if preserve_host {
        if let Some(v) = original_host.and_then(|h| HeaderValue::from_str(&h).ok()) {
            headers.insert(HOST, v);
        }
    } else {
        // The client library sets Host from the upstream URL.
        headers.remove(HOST);
    }
}

/// Prepares the response head for the client.
pub fn prepare_response(headers: &mut HeaderMap, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    one_content_length(headers);
}

/// A `Content-Length` given as a list of one repeated value (`5, 5`, or the field twice)
/// goes on as that one value: RFC 9110 §8.6 lets a recipient accept such a list only if
/// it forwards a single value. Both upstream paths refuse lists of differing values before
/// this point (502); one that is still here (a head-only answer) is left as it came.
fn one_content_length(headers: &mut HeaderMap) {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let (Some(first), second) = (values.next(), values.next()) else {
        return;
    };
    if second.is_none() && !first.as_bytes().contains(&b',') {
        return;
    }
    let mut single: Option<&str> = None;
    for part in headers
        .get_all(CONTENT_LENGTH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
    {
        let Some(part) = std::str::from_utf8(part).ok().map(str::trim) else {
            return;
        };
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return;
        }
        match single {
            Some(s) if s != part => return,
            _ => single = Some(part),
        }
    }
    if let Some(value) = single.and_then(|s| HeaderValue::from_str(s).ok()) {
        headers.insert(CONTENT_LENGTH, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_connection_header_cannot_remove_the_request_id() {
        let mut h = map(&[("connection", "x-request-id"), ("x-request-id", "r-1")]);
        prepare_request(&mut h, None, None, false, false);
        assert_eq!(h.get("x-request-id").unwrap(), "r-1");
        assert!(h.get("connection").is_none());
    }

    #[test]
    fn hop_by_hop_and_connection_listed_fields_go() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("authorization", "Bearer keep-me"),
            ("content-type", "application/json"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["authorization", "content-type"]);
    }

    #[test]
    fn a_list_of_one_content_length_goes_on_as_one_value() {
        let cases: [(&[&str], &[&str]); 6] = [
            (&["5, 5"], &["5"]),
            (&["5,5, 5"], &["5"]),
            (&["5", "5"], &["5"]),
            (&["12"], &["12"]),
            // Differing or malformed lists are refused upstream; left as they came.
            (&["5, 6"], &["5, 6"]),
            (&["5, x"], &["5, x"]),
        ];
        for (given, forwarded) in cases {
            let mut h = HeaderMap::new();
            for v in given {
                h.append(CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
            }
            prepare_response(&mut h, false);
            let got: Vec<_> = h
                .get_all(CONTENT_LENGTH)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            assert_eq!(got, forwarded, "{given:?}");
        }
    }

    #[test]
    fn te_trailers_survives() {
        let mut h = map(&[("te", "trailers, deflate")]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.get(TE).unwrap(), "trailers");
    }

    #[test]
    fn upgrade_keeps_its_headers() {
        let mut h = map(&[
            ("connection", "Upgrade, keep-alive"),
            ("upgrade", "websocket"),
        ]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(CONNECTION).unwrap(), "upgrade");
        assert_eq!(h.get(UPGRADE).unwrap(), "websocket");
    }

    #[test]
    fn host_must_be_there_once_in_http_1_1() {
        let req = |version, hosts: &[&str]| {
            let mut b = Request::builder().version(version);
            for h in hosts {
                b = b.header(HOST, *h);
            }
            b.body(()).unwrap()
        };
        assert!(check_host(&req(Version::HTTP_11, &["a"])).is_ok());
        assert!(check_host(&req(Version::HTTP_11, &[])).is_err());
        assert!(check_host(&req(Version::HTTP_11, &["a", "b"])).is_err());
        assert!(check_host(&req(Version::HTTP_10, &[])).is_ok());
        assert!(check_host(&req(Version::HTTP_2, &[])).is_ok());
        assert!(check_host(&req(Version::HTTP_2, &["a", "a"])).is_err());
    }

    #[test]
    fn an_absolute_form_authority_wins_over_host() {
        let mut h = map(&[("host", "wrong.example")]);
        prepare_request(&mut h, None, Some("right.example:8443"), true, false);
        assert_eq!(h.get(HOST).unwrap(), "right.example:8443");
        assert_eq!(h.get(X_FORWARDED_HOST).unwrap(), "right.example:8443");
        // Origin-form: Host is all there is.
        let mut h = map(&[("host", "only.example")]);
        prepare_request(&mut h, None, None, true, false);
        assert_eq!(h.get(HOST).unwrap(), "only.example");
    }

    #[test]
    fn an_http2_host_that_differs_from_authority_is_refused_when_preserved() {
        let req = |host: &str| {
            Request::builder()
                .version(Version::HTTP_2)
                .uri("http://api.example/v1/chat/completions")
                .header(HOST, host)
                .body(())
                .unwrap()
        };
        assert!(check_authority(&req("API.example"), true).is_ok());
        assert!(check_authority(&req("other.example"), true).is_err());
        // Host is replaced anyway: nothing to refuse.
        assert!(check_authority(&req("other.example"), false).is_ok());
        let mut http1 = req("other.example");
        *http1.version_mut() = Version::HTTP_11;
        assert!(check_authority(&http1, true).is_ok());
    }

    #[test]
    fn forwarded_headers_are_set() {
        let conn = ConnInfo {
            remote: "10.1.2.3:5555".parse::<SocketAddr>().unwrap(),
            tls: true,
            reads: None,
        };
        let mut h = map(&[("host", "proxy.local:8080"), ("x-forwarded-for", "1.1.1.1")]);
        prepare_request(&mut h, Some(&conn), None, false, false);
        assert_eq!(h.get(X_FORWARDED_FOR).unwrap(), "1.1.1.1, 10.1.2.3");
        assert_eq!(h.get(X_FORWARDED_PROTO).unwrap(), "https");
        assert_eq!(h.get(X_FORWARDED_HOST).unwrap(), "proxy.local:8080");
        assert!(
            h.get(HOST).is_none(),
            "Host is re-set from the upstream URL"
        );

        let mut h = HeaderMap::new();
        prepare_request(&mut h, Some(&conn), Some("h2.local"), true, false);
        assert_eq!(h.get(HOST).unwrap(), "h2.local");
        assert_eq!(h.get(X_FORWARDED_FOR).unwrap(), "10.1.2.3");
    }
}
