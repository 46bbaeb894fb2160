//! Upstream answers bounded like client requests, on both upstream paths (the relay and
//! hyper's client): the response head's size (`upstream.max_response_header_bytes`), a
//! `Content-Length` list of one repeated value, a body trickled under
//! `upstream.min_body_rate`, and connections closed for bytes nobody asked for
//! (`goodput_upstream_connections_closed_total{reason="unsolicited_bytes"}`). Each case
//! checks what the client received, the record, the counter, and that the next request
//! to the same upstream gets its own answer.

use super::*;
use goodput::{config::Config, run::Running};

const PATHS: [bool; 2] = [true, false];

fn path(relay: bool) -> &'static str {
    if relay { "relay" } else { "hyper" }
}

/// A proxy in front of `fake` on the chosen upstream path. Started directly: the harness
/// would put every proxy on hyper's client under `GOODPUT_TEST_UPSTREAM_CLIENT=hyper`.
async fn proxy(fake: &FakeUpstream, relay: bool, edit: impl FnOnce(&mut Config)) -> Running {
    let mut cfg = test_config(&fake.url());
    cfg.upstream.http1_relay = relay;
    edit(&mut cfg);
    goodput::run::start(cfg).await.unwrap()
}

/// A keep-alive POST (the client side's connection is not the point here).
fn post() -> Vec<u8> {
    raw_post(CHAT, "{}")
}

fn head_field<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .collect()
}

/// The second request on the same upstream is answered with its own bytes.
async fn next_gets_its_own_answer(proxy: &Running, fake: &FakeUpstream, records: usize) {
    let (raw, _) = raw_exchange(proxy.proxy_addr, &post(), WAIT).await;
    let (status, body) = status_and_body(&raw);
    assert_eq!((status, &body[..]), (200, &b"next"[..]));
    let r = wait_records(proxy.admin_addr, records, WAIT).await;
    assert_eq!(r.len(), records);
    assert!(fake.connections() >= 1);
}

fn next() -> Script {
    Script::response(200, &[("content-type", "application/json")], b"next")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_content_length_list_of_one_value_is_forwarded_as_that_value() {
    for relay in PATHS {
        let answer = Script::new(vec![Step::Write(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5, 5\r\n\r\nhello",
        ))]);
        let fake = FakeUpstream::start_sequence(vec![answer, next()]).await;
        let proxy = proxy(&fake, relay, |_| {}).await;
        let (raw, _) = raw_exchange(proxy.proxy_addr, &post(), WAIT).await;
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200"), "{}: {head}", path(relay));
        assert_eq!(
            head_field(&head, "content-length"),
            ["5"],
            "{}",
            path(relay)
        );
        assert_eq!(body, b"hello");
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["outcome"], "ok", "{}: {r}", path(relay));
        assert_eq!(r["bytes_out"], 5, "{r}");
        next_gets_its_own_answer(&proxy, &fake, 2).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_content_length_list_of_differing_values_is_a_502() {
    for relay in PATHS {
        let answer = Script::new(vec![Step::Write(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello!",
        ))]);
        let fake = FakeUpstream::start_sequence(vec![answer, next()]).await;
        let proxy = proxy(&fake, relay, |_| {}).await;
        let answered = raw_status(proxy.proxy_addr, &post()).await;
        assert_eq!(answered.0, 502, "{}", path(relay));
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["outcome"], "upstream_error", "{r}");
        next_gets_its_own_answer(&proxy, &fake, 2).await;
    }
}

/// A response head of about `size` bytes: one long field.
fn head_of(size: usize) -> Bytes {
    let start = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-big: ";
    let mut head = start.to_vec();
    head.resize(size.saturating_sub(4), b'a');
    head.extend_from_slice(b"\r\n\r\nok");
    Bytes::from(head)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_response_head_over_the_limit_is_a_502_and_counted_and_one_under_it_passes() {
    let series = "goodput_limit_rejections_total{limit=\"upstream.max_response_header_bytes\"}";
    for relay in PATHS {
        // 200 KB, as a probe sent: over the default of 64 KiB.
        let big = Script::new(vec![Step::Write(head_of(200_000))]);
        let fine = Script::new(vec![Step::Write(head_of(60 * 1024))]);
        let fake = FakeUpstream::start_sequence(vec![big, fine, next()]).await;
        let proxy = proxy(&fake, relay, |_| {}).await;
        assert_eq!(metric(proxy.admin_addr, series).await, 0.0);
        let (status, body) = raw_status(proxy.proxy_addr, &post()).await;
        assert_eq!(status, 502, "{}", path(relay));
        assert_eq!(
            error_code(&body),
            "upstream_head_too_large",
            "{}",
            path(relay)
        );
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["outcome"], "upstream_error", "{r}");
        assert_eq!(r["status"], 502, "{r}");
        assert_eq!(wait_metric(proxy.admin_addr, series, 1.0).await, 1.0);
        // Under the limit: forwarded whole.
        let (raw, _) = raw_exchange(proxy.proxy_addr, &post(), WAIT).await;
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200"), "{}", path(relay));
        assert!(head_field(&head, "x-big")[0].len() > 60_000);
        assert_eq!(body, b"ok");
        next_gets_its_own_answer(&proxy, &fake, 3).await;
        assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_head_limit_is_the_configured_one() {
    for relay in PATHS {
        let fake = FakeUpstream::start_sequence(vec![
            Script::new(vec![Step::Write(head_of(20_000))]),
            next(),
        ])
        .await;
        let proxy = proxy(&fake, relay, |c| {
            c.upstream.max_response_header_bytes = 16_384
        })
        .await;
        let (status, body) = raw_status(proxy.proxy_addr, &post()).await;
        assert_eq!(status, 502, "{}", path(relay));
        assert_eq!(error_code(&body), "upstream_head_too_large");
        next_gets_its_own_answer(&proxy, &fake, 2).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_trickled_under_the_minimum_rate_is_cut_recorded_and_counted() {
    let series = "goodput_limit_rejections_total{limit=\"upstream.min_body_rate\"}";
    for relay in PATHS {
        // One byte every 100 ms: 10 bytes/s against 1,000 over a window of one second.
        let mut steps = vec![Step::Write(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        ))];
        for _ in 0..300 {
            steps.push(Step::Write(http_chunk(b":")));
            steps.push(Step::Pause(Duration::from_millis(100)));
        }
        let fake = FakeUpstream::start_sequence(vec![Script::new(steps), next()]).await;
        let proxy = proxy(&fake, relay, |c| {
            c.upstream.min_body_rate = Some((1000, Duration::from_secs(1)));
        })
        .await;
        let (raw, _) = raw_exchange(proxy.proxy_addr, &post(), WAIT).await;
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200"), "{}", path(relay));
        // Cut: the chunked body never reached its last chunk.
        assert!(!body.ends_with(b"0\r\n\r\n"), "{}", path(relay));
        let r = one_record(proxy.admin_addr).await;
        assert_eq!(r["outcome"], "timeout", "{}: {r}", path(relay));
        assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
        // The trickling connection is closed, and the upstream hears of it.
        assert!(fake.wait_client_close(WAIT).await.is_some());
        next_gets_its_own_answer(&proxy, &fake, 2).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_at_the_minimum_rate_is_never_cut() {
    for relay in PATHS {
        // 25 chunks of 100 bytes 50 ms apart: 2,000 bytes/s against 1,000.
        let mut steps = vec![Step::Write(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        ))];
        for _ in 0..25 {
            steps.push(Step::Write(http_chunk(&[b':'; 100])));
            steps.push(Step::Pause(Duration::from_millis(50)));
        }
        steps.push(Step::Write(Bytes::from_static(LAST_CHUNK)));
        let fake = FakeUpstream::start(Script::new(steps)).await;
        let proxy = proxy(&fake, relay, |c| {
            c.upstream.min_body_rate = Some((1000, Duration::from_secs(1)));
        })
        .await;
        let (raw, _) = raw_exchange(proxy.proxy_addr, &post(), WAIT).await;
        let (_, body) = split_head(&raw);
        assert!(body.ends_with(b"0\r\n\r\n"), "{}", path(relay));
        // Not a dialect's stream (no terminal event): whatever the outcome, not a cut.
        let r = one_record(proxy.admin_addr).await;
        assert_ne!(r["outcome"], "timeout", "{}: {r}", path(relay));
        assert_eq!(r["bytes_out"], 2500, "{r}");
        let series = "goodput_limit_rejections_total{limit=\"upstream.min_body_rate\"}";
        assert_eq!(metric(proxy.admin_addr, series).await, 0.0);
    }
}

const UNSOLICITED: &str = "goodput_upstream_connections_closed_total{reason=\"unsolicited_bytes\"}";

#[tokio::test(flavor = "multi_thread")]
async fn bytes_after_a_complete_response_close_the_connection_and_are_counted() {
    for relay in PATHS {
        // A second response nobody asked for, in the same write as the first.
        let answer = Script::new(vec![Step::Write(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirstHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale",
        ))]);
        unsolicited_close_the_connection(answer, relay).await;
    }
}

/// `answer` (a response with bytes after it) gets the client its first response; the
/// connection is closed and counted, never reused; the next request gets its own answer.
/// Returns the proxy for further checks.
async fn unsolicited_close_the_connection(answer: Script, relay: bool) -> Running {
    let fake = FakeUpstream::start_sequence(vec![answer, next()]).await;
    let proxy = proxy(&fake, relay, |_| {}).await;
    let (raw, _) = raw_exchange(proxy.proxy_addr, &post(), WAIT).await;
    let path = path(relay);
    assert_eq!(status_and_body(&raw), (200, b"first".to_vec()), "{path}");
    // Counted when the response ends, or when the pool next looks at its idle
    // connections (the sweep, every second): the next request never meets the bytes.
    let counted = wait_metric(proxy.admin_addr, UNSOLICITED, 1.0).await;
    assert_eq!(counted, 1.0, "{path}");
    next_gets_its_own_answer(&proxy, &fake, 2).await;
    assert_eq!(fake.connections(), 2, "{path}: the connection was reused");
    proxy
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_on_an_idle_connection_close_it_and_are_counted() {
    for relay in PATHS {
        // The unsolicited bytes leave as their own segment, after the response.
        let answer = Script::new(vec![
            Step::Write(Bytes::from_static(
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst",
            )),
            Step::Write(Bytes::from_static(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n",
            )),
        ]);
        let proxy = unsolicited_close_the_connection(answer, relay).await;
        let closed = "goodput_upstream_connections_closed_total{reason=\"closed_by_upstream\"}";
        assert_eq!(metric(proxy.admin_addr, closed).await, 0.0);
    }
}
