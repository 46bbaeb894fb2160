//! HTTP/2 client (h2c prior knowledge).

use super::*;

#[test]
fn h2c_client_gets_the_stream_byte_identical_to_a_direct_request() {
    light(async {
        // Two simulators with the same seed: the n-th request to each is the same run.
        let sim_cfg = fast_sim(20.0, 2.0);
        let (_direct_sim, direct_url) = start_sim(sim_cfg.clone()).await;
        let (_sim, upstream) = start_sim(sim_cfg).await;
        let proxy = start_proxy(&upstream).await;
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<Full<Bytes>>();

        let body = chat_body(true, 12, true);
        let direct_req = chat_request(&format!("{direct_url}{CHAT}"), "h2c-direct", body.clone());
        let direct = send(&h2c, direct_req.unwrap()).await.unwrap();
        let proxied_req = chat_request(
            &format!("http://{}{CHAT}", proxy.proxy_addr),
            "h2c-proxied",
            body,
        );
        let proxied = send(&h2c, proxied_req.unwrap()).await.unwrap();

        assert_eq!(
            (direct.status, direct.version),
            (StatusCode::OK, Version::HTTP_2)
        );
        assert_eq!(
            (proxied.status, proxied.version),
            (StatusCode::OK, Version::HTTP_2)
        );
        assert_eq!(proxied.headers["content-type"], "text/event-stream");
        assert_eq!(mask_created(&proxied.body), mask_created(&direct.body));
        let stream = parse_chat_stream(&proxied.body).unwrap();
        assert_eq!(
            (stream.content_events, stream.usage_completion_tokens),
            (12, Some(12))
        );

        let ids = ["h2c-proxied".to_owned()];
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let r = &recs["h2c-proxied"];
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["status"], 200);
        assert_eq!(r["api"], "chat_completions");
        assert_eq!(r["stream"], true);
        assert_eq!(r["output_tokens"], 12);
        assert_eq!(r["output_tokens_source"], "usage");
        assert_eq!(r["events"], 12);
        assert_eq!(r["bytes_out"], proxied.body.len());
        assert!(r["ttft_ms"].as_f64().unwrap() >= 20.0, "{r}");
        proxy.shutdown().await;
    });
}
