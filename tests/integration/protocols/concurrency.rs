//! 500 concurrent streams.

use super::*;

/// Sends `n` streamed chats at once; returns each body by the request id it was sent with.
async fn concurrent_streams(
    base: &str,
    n: usize,
    tag: &str,
) -> anyhow::Result<BTreeMap<String, Bytes>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let req = chat_request(&format!("{base}{CHAT}"), &id, chat_body(true, 20, true))?;
        let client = client.clone();
        tasks.spawn(async move {
            let resp = send(&client, req).await?;
            ensure!(
                resp.status == StatusCode::OK,
                "{id}: status {}",
                resp.status
            );
            anyhow::Ok((id, resp.body))
        });
    }
    let mut out = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (id, body) = done??;
        out.insert(id, body);
    }
    Ok(out)
}

#[test]
fn five_hundred_concurrent_streams_are_byte_exact_and_all_recorded() {
    const N: usize = 500;
    exclusive(async {
        let started = Instant::now();
        // The reference: the same seed answered directly. A body depends only on its
        // sequence number, which the simulator writes into every event's id, so bodies of
        // the two runs are matched by that id whatever order the requests arrived in.
        let sim_cfg = fast_sim(20.0, 2.0);
        let (_reference_sim, reference_url) = start_sim(sim_cfg.clone()).await;
        let (_sim, upstream) = start_sim(sim_cfg).await;
        let proxy = start_proxy(&upstream).await;

        let reference = concurrent_streams(&reference_url, N, "ref").await.unwrap();
        let mut by_sim_id = BTreeMap::new();
        for body in reference.values() {
            let s = parse_chat_stream(body).unwrap();
            assert_eq!(s.ids.len(), 1);
            by_sim_id.insert(s.ids.into_iter().next().unwrap(), mask_created(body));
        }
        assert_eq!(by_sim_id.len(), N);

        let proxied_at = Instant::now();
        let proxied = concurrent_streams(&format!("http://{}", proxy.proxy_addr), N, "c")
            .await
            .unwrap();
        let proxied_took = proxied_at.elapsed();
        assert_eq!(proxied.len(), N);
        let mut sim_ids = BTreeSet::new();
        for (id, body) in &proxied {
            let s = parse_chat_stream(body).unwrap_or_else(|e| panic!("{id}: {e:#}"));
            assert_eq!(s.content_events, 20, "{id}");
            assert_eq!(s.usage_completion_tokens, Some(20), "{id}");
            assert_eq!(
                s.ids.len(),
                1,
                "{id}: events of several streams mixed: {:?}",
                s.ids
            );
            let sim_id = s.ids.into_iter().next().unwrap();
            assert!(
                by_sim_id.get(&sim_id) == Some(&mask_created(body)),
                "{id} ({sim_id}) differs from the direct answer"
            );
            assert!(sim_ids.insert(sim_id), "{id}: a stream was delivered twice");
        }

        let ids: Vec<String> = proxied.keys().cloned().collect();
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(10))
            .await
            .unwrap();
        for (id, body) in &proxied {
            let r = &recs[id];
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(r["output_tokens"], 20, "{r}");
            assert_eq!(r["events"], 20, "{r}");
            assert_eq!(r["bytes_out"], body.len(), "{r}");
        }
        let (_, metrics) = http_get(proxy.admin_addr, "/metrics").await.unwrap();
        assert_eq!(
            sum_series(&metrics, "goodput_requests_total"),
            N as f64,
            "{metrics}"
        );
        assert_eq!(
            metric_value(&metrics, "goodput_in_flight_requests"),
            Some(0.0),
            "{metrics}"
        );
        assert_eq!(
            metric_value(&metrics, "goodput_measurement_dropped_total"),
            Some(0.0)
        );
        proxy.shutdown().await;
        eprintln!(
            "500 streams: proxied run {proxied_took:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

#[test]
fn five_hundred_streams_multiplexed_on_one_h2_connection_all_reach_the_upstream_at_once() {
    const N: usize = 500;
    exclusive(async {
        // Every response starts and then stalls, so every stream stays open: the only way
        // fewer than N requests reach the upstream is a concurrency limit on the way, which
        // would hold the rest back in the client, before t_arrival, unmeasured. The
        // default bounds (128 streams per connection, 1024 upstream connections) are
        // raised to let N through: an operator's choice (the hostile tests hold them).
        let upstream = FakeUpstream::start(Script::stall_after_head()).await;
        let mut cfg = harness::test_config(&upstream.url());
        cfg.server.limits.http2_max_concurrent_streams = N as u32;
        cfg.upstream.max_connections = N;
        let proxy = start_proxy_with(cfg).await;
        let tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        let conn = tokio::spawn(conn);

        let mut tasks = JoinSet::new();
        for i in 0..N {
            let id = format!("mux-{i}");
            let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
            let req = chat_request(&uri, &id, chat_body(true, 3, true)).unwrap();
            let mut sender = sender.clone();
            tasks.spawn(async move {
                let resp = sender.send_request(req).await?;
                ensure!(resp.status() == StatusCode::OK, "{id}: {}", resp.status());
                let mut body = resp.into_body();
                let first = body.frame().await.context("no first frame")??;
                ensure!(
                    first.data_ref().map(|d| &d[..]) == Some(SSE_COMMENT),
                    "{id}: {first:?}"
                );
                anyhow::Ok((id, body))
            });
        }
        let reached = upstream
            .wait_requests(N, Duration::from_secs(10))
            .await
            .len();
        assert_eq!(
            reached, N,
            "streams of one HTTP/2 connection were held back"
        );
        let mut open = Vec::new();
        while let Some(done) = tasks.join_next().await {
            open.push(done.unwrap().unwrap());
        }

        // Hanging up the connection cancels every one of the upstream requests.
        drop((open, sender));
        conn.abort();
        poll_loop!(deadline = Instant::now() + Duration::from_secs(10), {
            if upstream.client_closes().len() >= N || Instant::now() >= deadline {
                break;
            }
        });
        assert_eq!(
            upstream.client_closes().len(),
            N,
            "upstream requests left open"
        );
        let ids: Vec<String> = (0..N).map(|i| format!("mux-{i}")).collect();
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(10))
            .await
            .unwrap();
        for r in recs.values() {
            assert_eq!(r["outcome"], "client_abort", "{r}");
        }
        let (_, metrics) = http_get(proxy.admin_addr, "/metrics").await.unwrap();
        assert_eq!(
            metric_value(&metrics, "goodput_in_flight_requests"),
            Some(0.0),
            "{metrics}"
        );
        proxy.shutdown().await;
    });
}
