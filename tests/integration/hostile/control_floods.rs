//! HTTP/2 control frame floods: `server.http2_max_control_frames_per_second`.

use super::*;

const FLOOD_LIMIT: &str =
    "goodput_limit_rejections_total{limit=\"server.http2_max_control_frames_per_second\"}";

/// Opens a raw HTTP/2 connection, sends the preface, an empty SETTINGS and `pings` PING
/// frames in one write, then reads frames until the server closes (bounded). Returns the
/// (type, flags) of every frame read, and whether the connection ended (closed or reset).
async fn ping_burst(addr: SocketAddr, pings: usize) -> (Vec<(u8, u8)>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    for i in 0..pings {
        out.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&(i as u64).to_be_bytes());
    }
    s.write_all(&out).await.unwrap();
    let mut frames = Vec::new();
    let read = async {
        let mut head = [0u8; 9];
        loop {
            if s.read_exact(&mut head).await.is_err() {
                return true;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if s.read_exact(&mut payload).await.is_err() {
                return true;
            }
            frames.push((head[3], head[4]));
            // Every PING answered: the connection was left open.
            if frames.iter().filter(|f| **f == (6, 1)).count() == pings {
                return false;
            }
        }
    };
    let ended = tokio::time::timeout(WAIT, read).await.unwrap_or(false);
    (frames, ended)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_ping_flood_closes_the_connection_and_counts() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.server.limits.http2_max_control_frames_per_second = 20;
    let proxy = start_proxy_with(cfg).await;
    assert_eq!(metric(proxy.admin_addr, FLOOD_LIMIT).await, 0.0);

    // Within the limit (one SETTINGS and 19 PINGs at once): every PING answered.
    let (frames, ended) = ping_burst(proxy.proxy_addr, 19).await;
    assert!(!ended);
    assert_eq!(frames.iter().filter(|f| **f == (6, 1)).count(), 19);
    assert_eq!(metric(proxy.admin_addr, FLOOD_LIMIT).await, 0.0);

    // 500 at once: closed before the flood is answered, counted once.
    let (frames, ended) = ping_burst(proxy.proxy_addr, 500).await;
    assert!(ended, "the connection was closed");
    // 19 at once, and a few more if the bucket refilled (20 a second) while the flood
    // was being read on a slow machine: never the flood.
    let answered = frames.iter().filter(|f| **f == (6, 1)).count();
    assert!(answered < 100, "{answered} PINGs answered");
    assert_eq!(wait_metric(proxy.admin_addr, FLOOD_LIMIT, 1.0).await, 1.0);

    // Other clients are served as before.
    let mut send = h2_connect(proxy.proxy_addr).await;
    let resp = send
        .send_request(h2_post(proxy.proxy_addr, "{}"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    proxy.shutdown().await;
}
