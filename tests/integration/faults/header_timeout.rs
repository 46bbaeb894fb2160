//! hyper's header-read timeout is really wired.

use super::*;

/// Sends `bytes` to a proxy with a 300 ms header-read timeout and says how the proxy
/// ended the connection and after how long.
#[expect(clippy::unwrap_used, reason = "test body shared by three tests")]
async fn stalled_client_is_closed(bytes: &[u8]) -> (Vec<u8>, End, Duration) {
    let mut cfg = test_config("http://127.0.0.1:1");
    cfg.server.header_read_timeout = Duration::from_millis(300);
    let proxy = start_proxy_with(cfg).await;
    let mut s = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let start = Instant::now();
    s.write_all(bytes).await.unwrap();
    // Without the timeout the stalled connection would stay open for good.
    let (raw, end) = read_to_end(&mut s, Duration::from_secs(10)).await;
    let took = start.elapsed();
    proxy.shutdown().await;
    (raw, end, took)
}

fn assert_closed_in_time(what: &str, raw: &[u8], end: &End, took: Duration) {
    assert_ne!(
        *end,
        End::TimedOut,
        "{what}: connection still open after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(250),
        "{what}: closed too early ({took:?})"
    );
    let text = String::from_utf8_lossy(raw);
    assert!(
        raw.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{what}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_request_head_is_closed_after_the_header_read_timeout() {
    let (raw, end, took) =
        stalled_client_is_closed(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-")
            .await;
    assert_closed_in_time("partial head", &raw, &end, took);
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_connection_is_closed_after_the_header_read_timeout() {
    let (raw, end, took) = stalled_client_is_closed(b"").await;
    assert_closed_in_time("no bytes at all", &raw, &end, took);
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_h2_preface_is_closed_after_the_header_read_timeout() {
    let (raw, end, took) = stalled_client_is_closed(b"PRI * HTTP/2.0\r\n").await;
    assert_closed_in_time("partial h2 preface", &raw, &end, took);
}
