//! HTTP/2 settings: `server.http2_max_concurrent_streams`, `server.max_request_header_bytes`.

use super::*;

/// The server's first SETTINGS frame, as (identifier, value) pairs.
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // An empty SETTINGS frame of our own.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut head = [0u8; 9];
    tokio::time::timeout(WAIT, s.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head[3], 4, "the server opens with SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    payload
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_clients_are_told_the_stream_and_header_limits() {
    let up = FakeUpstream::start(ok_json()).await;
    let proxy = start_proxy(&up.url()).await;
    let settings = server_settings(proxy.proxy_addr).await;
    const MAX_CONCURRENT_STREAMS: u16 = 3;
    const MAX_HEADER_LIST_SIZE: u16 = 6;
    assert!(
        settings.contains(&(MAX_CONCURRENT_STREAMS, 128)),
        "{settings:?}"
    );
    assert!(
        settings.contains(&(MAX_HEADER_LIST_SIZE, 65536)),
        "{settings:?}"
    );
    proxy.shutdown().await;
}
