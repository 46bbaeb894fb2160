//! Half-closing HTTP/1 clients: `server.http1_half_close`.

use super::*;

/// Sends `request`, waits until the upstream has it, half-closes (`shutdown(SHUT_WR)`), and
/// reads until the proxy closes.
async fn half_closed_exchange(addr: SocketAddr, up: &FakeUpstream, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    assert_eq!(up.wait_requests(1, WAIT).await.len(), 1);
    s.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await;
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_half_closing_client_is_answered_when_configured() {
    let up = FakeUpstream::start(ok_json().delayed(Duration::from_millis(200))).await;
    let mut cfg = test_config(&up.url());
    cfg.server.http1_half_close = true;
    let proxy = start_proxy_with(cfg).await;
    let raw = half_closed_exchange(proxy.proxy_addr, &up, &raw_post(CHAT, "{}")).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(text.ends_with("\r\n\r\n{}"), "{text}");
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["bytes_out"], 2, "{r}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_half_closing_client_is_taken_to_have_left() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let proxy = start_proxy(&up.url()).await;
    let raw = half_closed_exchange(proxy.proxy_addr, &up, &raw_post(CHAT, "{}")).await;
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));
    // The upstream request is cancelled...
    assert!(up.wait_client_close(WAIT).await.is_some());
    // ...and recorded as the client's leaving.
    let r = one_record(proxy.admin_addr).await;
    assert_eq!(r["outcome"], "client_abort", "{r}");
    proxy.shutdown().await;
}
