//! HTTP Upgrade.

use super::*;

/// A WebSocket-style upstream over raw TCP: answers `101 Switching Protocols` (with
/// `greeting` in the same write, as servers that speak first do), then echoes every byte
/// until the peer half-closes, then closes. Notes each request head and the bytes echoed.
struct UpgradeUpstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    echoed: Arc<Mutex<Vec<u8>>>,
    accept: JoinHandle<()>,
}

impl UpgradeUpstream {
    async fn start(greeting: &'static [u8]) -> anyhow::Result<UpgradeUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let heads = Arc::new(Mutex::new(Vec::new()));
        let echoed = Arc::new(Mutex::new(Vec::new()));
        let (h, e) = (heads.clone(), echoed.clone());
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (h, e) = (h.clone(), e.clone());
                conns.spawn(async move {
                    if let Err(err) = upgrade_conn(tcp, greeting, &h, &e).await {
                        tracing::debug!(error = %err, "upgrade upstream connection failed");
                    }
                });
            }
        });
        Ok(UpgradeUpstream {
            addr,
            heads,
            echoed,
            accept,
        })
    }
}

impl Drop for UpgradeUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn upgrade_conn(
    mut tcp: TcpStream,
    greeting: &[u8],
    heads: &Mutex<Vec<String>>,
    echoed: &Mutex<Vec<u8>>,
) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let (head, rest) = read_head(&mut tcp).await?;
    heads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(head);
    let mut out = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\
                    connection: Upgrade\r\n\r\n"
        .to_vec();
    out.extend_from_slice(greeting);
    tcp.write_all(&out).await?;
    let mut pending = rest;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !pending.is_empty() {
            tcp.write_all(&pending).await?;
            echoed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(&pending);
        }
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            tcp.shutdown().await?;
            return Ok(());
        }
        pending = buf[..n].to_vec();
    }
}

/// Reads an HTTP/1.1 head; returns it and whatever followed it in the same reads.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> anyhow::Result<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = data.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&data).into_owned(), rest));
        }
        let n = s.read(&mut buf).await?;
        ensure!(
            n > 0,
            "connection closed inside a head: {:?}",
            String::from_utf8_lossy(&data)
        );
        data.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn upgrade_is_tunnelled_byte_exact_both_ways_and_recorded() {
    light(async {
        const GREETING: &[u8] = b"\x81\x05hello";
        let upstream = UpgradeUpstream::start(GREETING).await.unwrap();
        let proxy = start_proxy(&format!("http://{}", upstream.addr)).await;

        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        tcp.write_all(
            b"GET /v1/realtime HTTP/1.1\r\nhost: gw.test\r\nupgrade: websocket\r\n\
              connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              sec-websocket-version: 13\r\nx-request-id: ws-1\r\n\r\n",
        )
        .await
        .unwrap();
        let (head, mut from_tunnel) = read_head(&mut tcp).await.unwrap();
        let lower = head.to_ascii_lowercase();
        assert!(lower.starts_with("http/1.1 101 "), "{head}");
        assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
        assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");

        // Arbitrary bytes, including some that look like HTTP and every byte value.
        let mut payload: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
        payload.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        let (mut rd, mut wr) = tcp.into_split();
        let to_send = payload.clone();
        let writer = tokio::spawn(async move {
            for piece in to_send.chunks(7_777) {
                wr.write_all(piece).await?;
            }
            // Half-close: the tunnel must carry the FIN through and close the other side.
            wr.shutdown().await?;
            io::Result::Ok(wr)
        });
        let want = GREETING.len() + payload.len();
        let read_all = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = rd.read(&mut buf).await?;
                if n == 0 {
                    return io::Result::Ok(());
                }
                from_tunnel.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read_all)
            .await
            .expect("tunnel did not close after the half-close")
            .unwrap();
        let _wr = writer.await.unwrap().unwrap();
        assert_eq!(from_tunnel.len(), want);
        assert_eq!(&from_tunnel[..GREETING.len()], GREETING);
        assert!(
            from_tunnel[GREETING.len()..] == payload[..],
            "echo differs from what was sent"
        );
        let echoed = upstream
            .echoed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        assert!(echoed == payload, "upstream received different bytes");
        let heads = upstream
            .heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let up_head = heads[0].to_ascii_lowercase();
        assert!(
            up_head.starts_with("get /v1/realtime http/1.1\r\n"),
            "{up_head}"
        );
        assert!(up_head.contains("\r\nupgrade: websocket\r\n"), "{up_head}");
        assert!(up_head.contains("\r\nconnection: upgrade\r\n"), "{up_head}");
        assert!(up_head.contains("\r\nsec-websocket-key: dghlihnhbxbszsbub25jzq==\r\n"));

        let ids = ["ws-1".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["ws-1"];
        assert_eq!(r["api"], "upgrade", "{r}");
        assert_eq!(r["status"], 101, "{r}");
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["bytes_out"], want, "{r}");
        assert!(
            r["ttft_ms"].is_null() && r["output_tokens"].is_null(),
            "{r}"
        );
        assert!(r["e2e_ms"].as_f64().unwrap() > 0.0, "{r}");
        proxy.shutdown().await;
    });
}

/// Opens an upgraded tunnel through `proxy` with request id `id`; returns the stream with
/// the upstream's greeting already read.
async fn open_tunnel(proxy: SocketAddr, id: &str, greeting: &[u8]) -> anyhow::Result<TcpStream> {
    let mut tcp = TcpStream::connect(proxy).await?;
    let head = format!(
        "GET /v1/realtime HTTP/1.1\r\nhost: gw.test\r\nupgrade: websocket\r\n\
         connection: Upgrade\r\nx-request-id: {id}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await?;
    let (head, mut rest) = read_head(&mut tcp).await?;
    ensure!(head.starts_with("HTTP/1.1 101 "), "{head}");
    while rest.len() < greeting.len() {
        let mut buf = [0u8; 256];
        let n = tcp.read(&mut buf).await?;
        ensure!(n > 0, "closed before the greeting");
        rest.extend_from_slice(&buf[..n]);
    }
    ensure!(rest == greeting, "greeting {rest:?}");
    Ok(tcp)
}

#[test]
fn upgrade_tunnel_reset_by_the_client_is_recorded_with_its_bytes() {
    light(async {
        const GREETING: &[u8] = b"\x81\x02hi";
        let upstream = UpgradeUpstream::start(GREETING).await.unwrap();
        let proxy = start_proxy(&format!("http://{}", upstream.addr)).await;
        let mut tcp = open_tunnel(proxy.proxy_addr, "ws-reset", GREETING)
            .await
            .unwrap();
        let payload = vec![0x5a_u8; 1000];
        tcp.write_all(&payload).await.unwrap();
        let mut echo = vec![0u8; payload.len()];
        tcp.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, payload);
        // The client dies: RST instead of an orderly close.
        tcp.set_zero_linger().unwrap();
        drop(tcp);

        let ids = ["ws-reset".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["ws-reset"];
        assert_eq!(
            (r["api"].as_str(), r["status"].as_u64()),
            (Some("upgrade"), Some(101))
        );
        // What did flow before the reset is still counted, and the client is blamed.
        assert_eq!(r["bytes_out"], GREETING.len() + payload.len(), "{r}");
        assert_eq!(r["outcome"], "client_abort", "{r}");
        proxy.shutdown().await;
    });
}
