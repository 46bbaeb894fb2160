//! A collector that hangs, refuses or answers 503 never slows or breaks proxying; OTLP settings need a restart.

use super::*;

/// Requests through a proxy whose collector misbehaves: every one completes, and the
/// failures are counted.
async fn proxy_survives(endpoint: &str) -> (Running, String) {
    let (_sim, upstream) = start_sim(fast_sim(1.0, 0.5)).await;
    let cfg = otlp_config(
        &upstream,
        &format!(
            "[otlp]\nendpoint = \"{endpoint}\"\ntraces = true\ninterval = \"100ms\"\n\
             timeout = \"300ms\"\nqueue_size = 2\nbatch_size = 1\n"
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let sending = async {
        for _ in 0..30 {
            let (status, body) = post_collect(&client, &url, chat_body(true, 4, true)).await;
            assert_eq!(status, 200);
            assert!(body.ends_with(b"data: [DONE]\n\n"));
        }
    };
    // Generous: the requests themselves take ~10 ms each; an export that blocked proxying
    // would hold each one for the 300 ms export timeout or forever.
    tokio::time::timeout(Duration::from_secs(8), sending)
        .await
        .expect("proxying slowed down behind a failing collector");
    let records = wait_records(proxy.admin_addr, 30, Duration::from_secs(10)).await;
    assert!(records.iter().all(|r| r["outcome"] == "ok"));
    let text = poll_until!(
        "export failures of both signals",
        Duration::from_secs(15),
        {
            let text = metrics(proxy.admin_addr).await;
            let failures = |signal: &str| {
                metric_value(
                    &text,
                    &format!("goodput_otlp_export_failures_total{{signal=\"{signal}\"}}"),
                )
                .unwrap_or(0.0)
            };
            (failures("metrics") >= 1.0 && failures("traces") >= 1.0).then_some(text)
        }
    );
    (proxy, text)
}

#[tokio::test]
async fn a_collector_that_hangs_never_slows_proxying() {
    let receiver = Receiver::start(Mode::Hang).await;
    let (proxy, text) = proxy_survives(&receiver.endpoint()).await;
    // One span is held by each hanging export (300 ms) and two fit the queue: 30 requests
    // within the 8 s bound above cannot all have found room.
    let dropped = metric_value(
        &text,
        "goodput_otlp_spans_dropped_total{reason=\"queue_full\"}",
    )
    .unwrap_or(0.0);
    assert!(dropped >= 1.0, "{text}");
    assert_eq!(
        metric_value(&text, "goodput_otlp_exports_total{signal=\"traces\"}").unwrap_or(0.0),
        0.0
    );
    // Shutdown is not held up by the hanging collector beyond the export timeout.
    tokio::time::timeout(Duration::from_secs(10), proxy.shutdown())
        .await
        .expect("shutdown waited on a hanging collector");
}

#[tokio::test]
async fn a_collector_that_refuses_never_breaks_proxying() {
    // A port nothing listens on: connections are refused.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let (proxy, text) = proxy_survives(&format!("http://{addr}")).await;
    assert!(
        metric_value(
            &text,
            "goodput_otlp_spans_dropped_total{reason=\"export_failed\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_collector_that_answers_503_is_a_failure() {
    let receiver = Receiver::start(Mode::Status(503)).await;
    let (proxy, _) = proxy_survives(&receiver.endpoint()).await;
    assert!(!receiver.seen.lock().unwrap().bodies.is_empty());
    proxy.shutdown().await;
}

/// `[otlp]` is built at start: a reload that changes it is refused by name and the
/// running configuration stays; one that leaves it alone applies.
#[tokio::test]
async fn otlp_changes_need_a_restart() {
    let receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(1.0, 1.0)).await;
    let dir = TempDir::new("otlp-reload");
    let path = dir.path().join("goodput.toml");
    let section = |endpoint: &str| {
        format!(
            "[upstream]\nurl = \"{upstream}\"\n[otlp]\nendpoint = \"{endpoint}\"\ntraces = true\n"
        )
    };
    std::fs::write(&path, section(&receiver.endpoint())).unwrap();
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    let cfg = config::load(Some(&path), &overrides).unwrap();
    let proxy = run::start_from(
        cfg,
        Some(ConfigSource {
            path: path.clone(),
            overrides,
        }),
    )
    .await
    .unwrap();
    let reloader = proxy.reloader.clone().unwrap();
    std::fs::write(&path, section("http://127.0.0.1:9")).unwrap();
    match reloader.reload() {
        Err(ReloadError::RestartRequired(keys)) => assert_eq!(keys, ["otlp"]),
        other => panic!("expected a refusal, got {other:?}"),
    }
    std::fs::write(
        &path,
        format!(
            "{}[slo.default]\nttft_ms = 500\n",
            section(&receiver.endpoint())
        ),
    )
    .unwrap();
    reloader.reload().unwrap();
    proxy.shutdown().await;
}
