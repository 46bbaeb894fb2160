//! `https://` upstreams and HTTP/2 towards the upstream.

use super::*;

/// What the relay saw on one connection.
#[derive(Clone, Debug)]
enum Seen {
    /// The TLS handshake failed (the peer refused our certificate, for instance).
    HandshakeFailed(String),
    /// A connection was relayed: the ALPN protocol agreed and the first line of the
    /// (decrypted) byte stream: a request line, or `PRI * HTTP/2.0` for HTTP/2.
    Relayed {
        alpn: Option<Vec<u8>>,
        first_line: String,
    },
}

/// A TCP relay in front of the simulator, optionally terminating TLS, that notes the
/// negotiated ALPN and the first line each connection sends. The simulator serves both
/// HTTP/1.1 and h2c, so whatever the relay's peer speaks reaches it unchanged.
struct Relay {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr, tls: Option<TlsAcceptor>) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (tls, log) = (tls.clone(), log.clone());
                conns.spawn(async move {
                    if let Err(e) = relay_conn(tcp, tls, target, log).await {
                        tracing::debug!(error = %e, "relay connection failed");
                    }
                });
            }
        });
        Ok(Relay { addr, seen, accept })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// [`Relay::seen`] once it holds at least `n` entries, or whatever it holds at `timeout`.
    async fn wait_seen(&self, n: usize, timeout: Duration) -> Vec<Seen> {
        poll_loop!(deadline = Instant::now() + timeout, {
            let seen = self.seen();
            if seen.len() >= n || Instant::now() >= deadline {
                return seen;
            }
        });
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn note(log: &Mutex<Vec<Seen>>, seen: Seen) {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(seen);
}

async fn relay_conn(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    target: SocketAddr,
    log: Arc<Mutex<Vec<Seen>>>,
) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let Some(acceptor) = tls else {
        return pipe(tcp, None, target, &log).await;
    };
    match acceptor.accept(tcp).await {
        Ok(stream) => {
            let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            pipe(stream, alpn, target, &log).await
        }
        Err(e) => {
            note(&log, Seen::HandshakeFailed(e.to_string()));
            Ok(())
        }
    }
}

async fn pipe<S>(
    mut client: S,
    alpn: Option<Vec<u8>>,
    target: SocketAddr,
    log: &Mutex<Vec<Seen>>,
) -> anyhow::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let first_line = String::from_utf8_lossy(&head[..end]).into_owned();
    note(log, Seen::Relayed { alpn, first_line });
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    upstream.write_all(&head).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// An https upstream: the simulator behind a TLS relay whose certificate names `localhost`.
struct TlsUpstream {
    dir: TempDir,
    ca_file: PathBuf,
    relay: Relay,
    _sim: goodput::sim::Sim,
}

impl TlsUpstream {
    async fn start(tag: &str) -> anyhow::Result<TlsUpstream> {
        let pki = Pki::new()?;
        let leaf = pki.leaf(&["localhost"])?;
        let dir = TempDir::new(tag);
        let ca_file = dir.write("ca.pem", &pki.ca_pem())?;
        let (sim, url) = start_sim(fast_sim(10.0, 1.0)).await;
        let relay = Relay::start(sim_addr(&url)?, Some(leaf.acceptor()?)).await?;
        Ok(TlsUpstream {
            dir,
            ca_file,
            relay,
            _sim: sim,
        })
    }

    fn url(&self) -> String {
        format!("https://localhost:{}", self.relay.addr.port())
    }

    /// goodput's config for this upstream; `extra` goes into `[upstream]`.
    fn config(&self, extra: &str) -> anyhow::Result<Config> {
        load_toml(
            &self.dir,
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n\
                 [upstream]\nurl = \"{}\"\n{extra}\n",
                self.url()
            ),
        )
    }
}

/// Streams one chat completion through `proxy` and checks the body and the record.
async fn stream_through(proxy: &goodput::run::Running, id: &str) -> anyhow::Result<Collected> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
    let resp = send(&client, chat_request(&uri, id, chat_body(true, 8, true))?).await?;
    ensure!(
        resp.status == StatusCode::OK,
        "status {}: {}",
        resp.status,
        resp.text()
    );
    let stream = parse_chat_stream(&resp.body)?;
    ensure!(
        stream.content_events == 8 && stream.usage_completion_tokens == Some(8),
        "{stream:?}"
    );
    let recs = records_by_id(proxy.admin_addr, &[id.to_owned()], Duration::from_secs(5)).await?;
    let r = &recs[id];
    ensure!(
        r["outcome"] == "ok" && r["output_tokens"] == 8,
        "record {r}"
    );
    Ok(resp)
}

#[test]
fn https_upstream_is_trusted_through_ca_file() {
    light(async {
        let up = TlsUpstream::start("ca-file").await.unwrap();
        let ca = toml_path(&up.ca_file).unwrap();
        let cfg = up.config(&format!("ca_file = {ca}")).unwrap();
        let proxy = start_proxy_with(cfg).await;
        stream_through(&proxy, "https-h1").await.unwrap();
        match up.relay.seen().as_slice() {
            [Seen::Relayed { alpn, first_line }] => {
                // HTTP/1.1 only: no ALPN offered, a plain request line inside TLS.
                assert!(alpn.as_deref().is_none_or(|p| p == b"http/1.1"), "{alpn:?}");
                assert_eq!(first_line, "POST /v1/chat/completions HTTP/1.1");
            }
            other => panic!("relay saw {other:?}"),
        }
        proxy.shutdown().await;
    });
}

#[test]
fn https_upstream_with_an_untrusted_certificate_is_a_502_naming_it() {
    light(async {
        let up = TlsUpstream::start("no-ca").await.unwrap();
        let proxy = start_proxy_with(up.config("").unwrap()).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
        let req = chat_request(&uri, "https-untrusted", chat_body(true, 8, true)).unwrap();
        let resp = send(&client, req).await.unwrap();
        assert_eq!(resp.status, StatusCode::BAD_GATEWAY, "{}", resp.text());
        assert_eq!(resp.headers["content-type"], "application/json");
        let v: Value = serde_json::from_slice(&resp.body).unwrap();
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            message.contains("certificate"),
            "error does not name the cause: {v}"
        );
        assert!(
            v["error"]["code"]
                .as_str()
                .is_some_and(|c| c.starts_with("upstream")),
            "{v}"
        );
        // The proxy refused the handshake itself: no request reached the untrusted peer.
        // (The relay learns of the refusal asynchronously, possibly after the 502.)
        let seen = up.relay.wait_seen(1, Duration::from_secs(5)).await;
        assert!(
            !seen.is_empty()
                && seen
                    .iter()
                    .all(|s| matches!(s, Seen::HandshakeFailed(e) if !e.is_empty())),
            "{seen:?}"
        );
        let ids = ["https-untrusted".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["https-untrusted"];
        assert_eq!(
            (r["status"].as_u64(), r["outcome"].as_str()),
            (Some(502), Some("upstream_error"))
        );
        // The same upstream with the CA trusted works: the failure was the trust, nothing else.
        let ca = toml_path(&up.ca_file).unwrap();
        let trusted = start_proxy_with(up.config(&format!("ca_file = {ca}")).unwrap()).await;
        stream_through(&trusted, "https-trusted").await.unwrap();
        proxy.shutdown().await;
        trusted.shutdown().await;
    });
}

#[test]
fn upstream_http2_over_tls_negotiates_h2_by_alpn() {
    light(async {
        let up = TlsUpstream::start("h2-alpn").await.unwrap();
        let ca = toml_path(&up.ca_file).unwrap();
        let proxy =
            start_proxy_with(up.config(&format!("ca_file = {ca}\nhttp2 = true")).unwrap()).await;
        stream_through(&proxy, "https-h2-a").await.unwrap();
        stream_through(&proxy, "https-h2-b").await.unwrap();
        match up.relay.seen().as_slice() {
            // Both requests share one multiplexed connection.
            [Seen::Relayed { alpn, first_line }] => {
                assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
                assert_eq!(first_line, "PRI * HTTP/2.0");
            }
            other => panic!("relay saw {other:?}"),
        }
        proxy.shutdown().await;
    });
}

#[test]
fn upstream_http2_over_plain_http_uses_h2c_prior_knowledge() {
    light(async {
        let (_sim, url) = start_sim(fast_sim(10.0, 1.0)).await;
        let relay = Relay::start(sim_addr(&url).unwrap(), None).await.unwrap();
        let dir = TempDir::new("h2c-upstream");
        let cfg = load_toml(
            &dir,
            &format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
                 [upstream]\nurl = \"http://{}\"\nhttp2 = true\n",
                relay.addr
            ),
        )
        .unwrap();
        let proxy = start_proxy_with(cfg).await;
        stream_through(&proxy, "h2c-up-a").await.unwrap();
        stream_through(&proxy, "h2c-up-b").await.unwrap();
        match relay.seen().as_slice() {
            [
                Seen::Relayed {
                    alpn: None,
                    first_line,
                },
            ] => assert_eq!(first_line, "PRI * HTTP/2.0"),
            other => panic!("relay saw {other:?}"),
        }
        proxy.shutdown().await;
    });
}
