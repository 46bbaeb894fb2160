//! Measurement never blocks traffic.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_full_measurement_queue_never_holds_traffic_back() {
    const N: usize = 200;
    let (_sim, upstream) = start_sim(fast_sim(1.0, 1.0)).await;
    let mut cfg = test_config(&upstream);
    cfg.measure.channel_capacity = 1;
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = chat_url(&proxy);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..N {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move { post_collect(&client, &url, chat_body(true, 5, true)).await });
    }
    let mut complete = 0;
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.unwrap();
        assert_eq!(status, 200);
        let text = String::from_utf8_lossy(&body);
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(text.matches("\"completion_tokens\":5").count(), 1, "{text}");
        complete += 1;
    }
    assert_eq!(complete, N);

    let (recorded, dropped) = poll_loop!(deadline = Instant::now() + Duration::from_secs(3), {
        let recorded = records(proxy.admin_addr).await.len();
        let text = metrics(proxy.admin_addr).await;
        let dropped = metric_value(&text, "goodput_measurement_dropped_total").unwrap_or(-1.0);
        if recorded as f64 + dropped >= N as f64 || Instant::now() >= deadline {
            assert_eq!(
                metric_value(&text, "goodput_in_flight_requests"),
                Some(0.0),
                "{text}"
            );
            break (recorded, dropped);
        }
    });
    assert!(dropped >= 0.0, "goodput_measurement_dropped_total missing");
    assert_eq!(
        recorded + dropped as usize,
        N,
        "recorded {recorded}, dropped {dropped}"
    );
    proxy.shutdown().await;
}
