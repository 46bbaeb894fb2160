use bytes::BytesMut;

use super::*;

const MAX: usize = 8192;

fn parse(raw: &str) -> Result<Head, Reject> {
    let len = complete(raw.as_bytes(), MAX)?.ok_or(Reject::BadRequest)?;
    let mut buf = BytesMut::from(raw.as_bytes());
    take(&mut buf, len).1
}

#[test]
fn a_plain_request_keeps_its_fields_in_order() {
    let head = parse(
        "POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 5\r\n\r\n",
    )
    .unwrap();
    assert_eq!(head.method, Method::POST);
    assert_eq!(head.uri, "/v1/x?a=1");
    assert_eq!(head.body, Some(BodyLength::Length(5)));
    assert!(head.keep_alive);
    let values: Vec<_> = head.headers.get_all("x-a").iter().collect();
    assert_eq!(values, ["1", "2"]);
}

#[test]
fn the_smuggling_cases_are_refused_as_hyper_refuses_them() {
    let bad = [
        // Differing lengths (CL.CL), a length that is not digits, a signed one.
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n",
        // A transfer coding that does not end in chunked; TE on HTTP/1.0.
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n",
        "POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
        // obs-fold, a space before the colon, a bad method and version.
        "GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n 2\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
        "G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET / HTTP/1.2\r\nHost: h\r\n\r\n",
    ];
    for raw in bad {
        assert_eq!(parse(raw).err(), Some(Reject::BadRequest), "{raw:?}");
    }
}

#[test]
fn chunked_wins_over_a_length_and_the_connection_is_not_kept() {
    for raw in [
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
    ] {
        let head = parse(raw).unwrap();
        assert_eq!(head.body, Some(BodyLength::Chunked), "{raw:?}");
        assert!(!head.keep_alive);
        // Removed (before) or never kept (after): only the chunked framing goes on.
        assert!(head.headers.get("content-length").is_none(), "{raw:?}");
    }
    let head =
        parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n").unwrap();
    assert_eq!(head.body, Some(BodyLength::Chunked));
}

#[test]
fn equal_lengths_are_one_and_a_huge_one_is_too_large() {
    let head =
        parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
            .unwrap();
    assert_eq!(head.body, Some(BodyLength::Length(5)));
    assert_eq!(head.headers.get_all("content-length").iter().count(), 1);
    let max = format!(
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
        u64::MAX
    );
    assert_eq!(parse(&max).err(), Some(Reject::TooLarge));
    let over = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n";
    assert_eq!(parse(over).err(), Some(Reject::BadRequest));
}

#[test]
fn heads_over_the_limits_are_431_and_long_targets_414() {
    let long = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nX: {}\r\n\r\n",
        "a".repeat(MAX)
    );
    assert_eq!(complete(long.as_bytes(), MAX), Err(Reject::TooLarge));
    // Incomplete and already at the limit.
    assert_eq!(
        complete(&long.as_bytes()[..MAX], MAX),
        Err(Reject::TooLarge)
    );
    let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: 1\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
    assert_eq!(complete(many.as_bytes(), MAX), Err(Reject::TooLarge));
    let uri = format!(
        "GET /{} HTTP/1.1\r\nHost: h\r\n\r\n",
        "a".repeat(MAX_URI_LEN)
    );
    let len = complete(uri.as_bytes(), 1 << 20).unwrap().unwrap();
    let mut buf = BytesMut::from(uri.as_bytes());
    assert_eq!(take(&mut buf, len).1.err(), Some(Reject::UriTooLong));
}

#[test]
fn keep_alive_expect_and_upgrade_are_read_as_hyper_reads_them() {
    let h = parse("GET / HTTP/1.0\r\nHost: h\r\n\r\n").unwrap();
    assert!(!h.keep_alive);
    let h = parse("GET / HTTP/1.0\r\nHost: h\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
    assert!(h.keep_alive);
    let h = parse("GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n").unwrap();
    assert!(!h.keep_alive, "close sticks");
    let h = parse("POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n").unwrap();
    assert!(h.expect_continue);
    let h = parse("GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n").unwrap();
    assert!(h.wants_upgrade);
    let h = parse("GET / HTTP/1.0\r\nUpgrade: websocket\r\n\r\n").unwrap();
    assert!(!h.wants_upgrade, "HTTP/1.0 cannot upgrade");
    let h = parse("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n").unwrap();
    assert!(h.wants_upgrade);
}

#[test]
fn bare_lf_line_ends_are_taken_as_httparse_takes_them() {
    let h = parse("GET / HTTP/1.1\nHost: h\n\n").unwrap();
    assert_eq!(h.headers.get("host").unwrap(), "h");
}
