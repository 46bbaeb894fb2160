//! TLS termination: HTTP/1.1 and h2 chosen by ALPN.

use super::*;

/// One request on a fresh TLS connection offering exactly `alpn`; returns what was
/// negotiated and the response. HTTP/2 when `h2` was negotiated, else HTTP/1.1.
async fn tls_exchange(
    pki: &Pki,
    addr: SocketAddr,
    alpn: &[u8],
    id: &str,
    body: String,
) -> anyhow::Result<(Option<Vec<u8>>, Collected)> {
    let connector = TlsConnector::from(Arc::new(pki.client_config(&[alpn])?));
    let tcp = TcpStream::connect(addr).await?;
    let tls = connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(tls);
    let resp = if negotiated.as_deref() == Some(b"h2") {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        let req = chat_request(&format!("https://localhost{CHAT}"), id, body)?;
        sender.send_request(req).await?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        let mut req = chat_request(CHAT, id, body)?;
        req.headers_mut()
            .insert("host", http::HeaderValue::from_static("localhost"));
        sender.send_request(req).await?
    };
    Ok((negotiated, collect(resp).await?))
}

#[test]
fn tls_termination_serves_http1_and_h2_by_alpn_and_says_https_upstream() {
    light(async {
        let pki = Pki::new().unwrap();
        let leaf = pki.leaf(&["localhost", "127.0.0.1"]).unwrap();
        let dir = TempDir::new("tls-server");
        let cert = dir.write("server.pem", &leaf.cert_pem).unwrap();
        let key = dir.write("server.key", &leaf.key_pem).unwrap();
        let events = openai_chat_events(5, true);
        let expected: Vec<u8> = events.concat();
        let upstream = FakeUpstream::start(Script::sse_chunked(
            &events,
            WritePlan::Whole,
            Duration::ZERO,
        ))
        .await;
        let cfg = load_toml(
            &dir,
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n\
                 [server.tls]\ncert = {}\nkey = {}\n\
                 [upstream]\nurl = \"{}\"\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n\
                 [log]\naccess_log = false\n",
                toml_path(&cert).unwrap(),
                toml_path(&key).unwrap(),
                upstream.url()
            ),
        )
        .unwrap();
        assert!(cfg.server.tls.is_some());
        let proxy = start_proxy_with(cfg).await;
        let body = chat_body(true, 5, true);

        let (alpn, h1) = tls_exchange(&pki, proxy.proxy_addr, b"http/1.1", "tls-h1", body.clone())
            .await
            .unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!((h1.status, h1.version), (StatusCode::OK, Version::HTTP_11));
        assert_eq!(h1.body, expected);

        let (alpn, h2) = tls_exchange(&pki, proxy.proxy_addr, b"h2", "tls-h2", body.clone())
            .await
            .unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
        assert_eq!((h2.status, h2.version), (StatusCode::OK, Version::HTTP_2));
        assert_eq!(h2.body, expected);

        // A stock client offering both gets h2, as the server prefers it.
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(pki.client_config(&[]).unwrap())
            .https_only()
            .enable_all_versions()
            .build();
        let stock = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(https);
        let port = proxy.proxy_addr.port();
        let req = chat_request(
            &format!("https://localhost:{port}{CHAT}"),
            "tls-stock",
            body,
        );
        let resp = send(&stock, req.unwrap()).await.unwrap();
        assert_eq!(
            (resp.status, resp.version),
            (StatusCode::OK, Version::HTTP_2)
        );
        assert_eq!(resp.body, expected);

        let seen = upstream.wait_requests(3, Duration::from_secs(5)).await;
        assert_eq!(seen.len(), 3);
        for r in &seen {
            assert_eq!(
                r.header("x-forwarded-proto"),
                Some("https"),
                "{:?}",
                r.headers
            );
            assert_eq!(
                r.header("x-forwarded-for"),
                Some("127.0.0.1"),
                "{:?}",
                r.headers
            );
            assert_eq!(r.version, "HTTP/1.1");
        }
        let ids = ["tls-h1", "tls-h2", "tls-stock"].map(str::to_owned);
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        for id in &ids {
            let r = &recs[id];
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(r["output_tokens"], 5, "{r}");
            assert_eq!(r["bytes_out"], expected.len(), "{r}");
        }
        proxy.shutdown().await;
    });
}
