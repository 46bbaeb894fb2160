//! Upstream connections: `upstream.max_connections`, `upstream.pool_wait_timeout`.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn five_thousand_http2_streams_share_a_bounded_number_of_upstream_connections() {
    let up = FakeUpstream::start(ok_json()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.max_connections = 8;
    cfg.upstream.pool_wait_timeout = Duration::from_secs(60);
    let proxy = start_proxy_with(cfg).await;
    let send = h2_connect(proxy.proxy_addr).await;
    let streams = 5_000;
    let mut set = JoinSet::new();
    for _ in 0..streams {
        let mut send = send.clone();
        let req = h2_post(proxy.proxy_addr, "{}");
        set.spawn(async move {
            let resp = send.send_request(req).await.unwrap();
            let status = resp.status().as_u16();
            // Read to the end: a response dropped half-read cancels (and closes) its
            // upstream connection.
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        });
    }
    while let Some(answer) = set.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!((status, &body[..]), (200, &b"{}"[..]));
    }
    // At most 8 at once. A connection the proxy replaced on the way is counted closed,
    // and may still look open to the fake upstream for a moment on a loaded machine (it
    // sees the close only when its task next runs): each one past 8, open at once or in
    // all, must be such a counted close.
    let text = metrics(proxy.admin_addr).await;
    let closes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("goodput_upstream_connections_closed_total{"))
        .collect();
    let closed: f64 = closes
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        up.max_open_connections() as f64 <= 8.0 + closed,
        "{} upstream connections open at once for one client connection, closed: {closes:?}",
        up.max_open_connections()
    );
    assert!(
        up.connections() as f64 <= 8.0 + closed,
        "{} upstream connections, closed: {closes:?}",
        up.connections()
    );
    let ok = "goodput_requests_total{model=\"unknown\",api=\"chat_completions\",\
              outcome=\"ok\",class=\"default\",slo=\"met\",status_class=\"2xx\"}";
    let recorded = wait_metric(proxy.admin_addr, ok, streams as f64).await;
    assert_eq!(
        recorded,
        streams as f64,
        "{}",
        metrics(proxy.admin_addr).await
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_finds_no_free_upstream_connection_gets_503_after_the_wait() {
    let up = FakeUpstream::start(Script::no_response()).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.max_connections = 1;
    cfg.upstream.pool_wait_timeout = Duration::from_millis(200);
    let proxy = start_proxy_with(cfg).await;
    // The first request holds the only connection (the upstream never answers it).
    let mut holder = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    holder.write_all(&raw_post(CHAT, "{}")).await.unwrap();
    assert_eq!(up.wait_requests(1, WAIT).await.len(), 1);
    let answer = raw_status(proxy.proxy_addr, &raw_post(CHAT, "{}")).await;
    assert_answered(proxy.admin_addr, answer, (503, "upstream_busy", "rejected")).await;
    assert_eq!(up.connections(), 1);
    let series = "goodput_limit_rejections_total{limit=\"upstream.max_connections\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    drop(holder);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_upstream_is_bounded_by_requests_in_flight() {
    // hyper's pooled client (h2c): the budget counts requests, each held until its
    // response body ends. The first token is far off next to the pool wait, so whichever
    // request comes third finds both slots taken.
    let (_sim, url) = start_sim(fast_sim(1_000.0, 1.0)).await;
    let mut cfg = test_config(&url);
    cfg.upstream.http2 = true;
    cfg.upstream.max_connections = 2;
    cfg.upstream.pool_wait_timeout = Duration::from_millis(100);
    let proxy = start_proxy_with(cfg).await;
    let target = format!("http://{}{CHAT}", proxy.proxy_addr);
    let mut set = JoinSet::new();
    for _ in 0..3 {
        let target = target.clone();
        set.spawn(async move { post_collect(&client(), &target, chat_body(true, 3, false)).await });
    }
    let mut answers = Vec::new();
    while let Some(answer) = set.join_next().await {
        answers.push(answer.unwrap());
    }
    answers.sort_by_key(|(status, _)| *status);
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 503]);
    assert_eq!(error_code(&answers[2].1), "upstream_busy");
    // Both slots came back with their response bodies' ends.
    let (status, _) = post_collect(&client(), &target, chat_body(true, 3, false)).await;
    assert_eq!(status, 200);
    let records = wait_records(proxy.admin_addr, 4, WAIT).await;
    let mut outcomes: Vec<&str> = records
        .iter()
        .filter_map(|r| r["outcome"].as_str())
        .collect();
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["ok", "ok", "ok", "rejected"]);
    proxy.shutdown().await;
}
