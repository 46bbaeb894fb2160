//! Self-calibration over real sockets: the simulator's engine-side `/metrics` (vLLM names,
//! from its ground truth) against the proxy's own measurements of the same requests, and a
//! scripted metrics endpoint for the bad paths (down, garbage, HTTP errors, stalls, counter
//! resets). Everything is read back the way an operator would: `/metrics` text and
//! `GET /api/v1/calibration`.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::common::{harness::*, temp::TempDir};
use bytes::Bytes;
use goodput::{
    calibrate::EngineKind,
    config::{self, Calibration, Config, Overrides},
    run::{self, ConfigSource, Running},
};
use http::Response;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

mod gpus;

const INTERVAL: Duration = Duration::from_millis(250);

fn calibrated(upstream: &str, url: Option<String>) -> Config {
    let mut cfg = test_config(upstream);
    let default_url = cfg.calibration.url.clone();
    cfg.calibration = Calibration {
        enabled: true,
        url: url.map_or(default_url, |u| u.parse().unwrap()),
        interval: INTERVAL,
        timeout: Duration::from_millis(200),
        engine: EngineKind::Auto,
        gpu_metrics: Vec::new(),
    };
    cfg
}

async fn status(proxy: &Running) -> Value {
    let (code, body) = admin_get(proxy.admin_addr, "/api/v1/calibration").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits until `cond` holds for the `/metrics` text, or fails with the text.
async fn wait_metrics(proxy: &Running, what: &str, cond: impl Fn(&str) -> bool) -> String {
    poll_until!(what, Duration::from_secs(15), {
        let text = metrics(proxy.admin_addr).await;
        cond(&text).then_some(text)
    })
}

fn gauge(text: &str, name: &str, model: &str, metric: &str) -> Option<f64> {
    metric_value(
        text,
        &format!("{name}{{model=\"{model}\",metric=\"{metric}\"}}"),
    )
}

fn scrapes(text: &str, result: &str) -> f64 {
    metric_value(
        text,
        &format!("goodput_calibration_scrapes_total{{result=\"{result}\"}}"),
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_and_proxy_agree_up_to_the_time_outside_the_engine() {
    let (_sim, sim_url) = start_sim(fast_sim(20.0, 2.0)).await;
    let proxy = start_proxy_with(calibrated(&sim_url, None)).await;
    assert_eq!(
        status(&proxy).await["url"],
        format!("{sim_url}/metrics").as_str()
    );

    // Real client load: four clients streaming 16-token replies for about two seconds.
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let stop = tokio::time::Instant::now() + Duration::from_secs(2);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let c = client();
                let mut n = 0;
                while tokio::time::Instant::now() < stop {
                    let (code, body) = post_collect(&c, &url, chat_body(true, 16, false)).await;
                    assert_eq!(code, 200);
                    assert!(body.ends_with(b"data: [DONE]\n\n"));
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut sent = 0;
    for c in clients {
        sent += c.await.unwrap();
    }
    assert!(sent > 20, "only {sent} requests");

    let text = wait_metrics(&proxy, "a comparison of every measured quantity", |t| {
        ["ttft", "e2e", "tpot", "itl"]
            .iter()
            .all(|m| gauge(t, "goodput_calibration_difference_seconds", "test-model", m).is_some())
    })
    .await;
    assert_eq!(metric_value(&text, "goodput_calibration_up"), Some(1.0));
    assert!(scrapes(&text, "ok") >= 2.0, "{text}");
    assert_eq!(
        metric_value(&text, "goodput_calibration_engine_resets_total"),
        Some(0.0)
    );
    let get = |name, metric| gauge(&text, name, "test-model", metric).unwrap();

    // The engine's own numbers are the simulator's configuration.
    let engine_ttft = get("goodput_calibration_engine_seconds", "ttft");
    assert!(
        (0.019..0.04).contains(&engine_ttft),
        "engine ttft {engine_ttft}"
    );
    let engine_itl = get("goodput_calibration_engine_seconds", "itl");
    assert!(
        (0.0019..0.01).contains(&engine_itl),
        "engine itl {engine_itl}"
    );

    // The proxy sees every request later than the engine and finishes it later: the time
    // outside the engine (loopback and the proxy) is small and never negative.
    for metric in ["ttft", "e2e"] {
        let d = get("goodput_calibration_difference_seconds", metric);
        assert!((0.0..0.02).contains(&d), "{metric} difference {d}\n{text}");
        let (p, e) = (
            get("goodput_calibration_proxy_seconds", metric),
            get("goodput_calibration_engine_seconds", metric),
        );
        assert!((p - e - d).abs() < 1e-9);
    }
    // Per-token times are a difference of two timestamps on each side: they agree closely.
    for metric in ["tpot", "itl"] {
        let d = get("goodput_calibration_difference_seconds", metric);
        assert!(d.abs() < 0.002, "{metric} difference {d}\n{text}");
    }
    // Engine-only phases are exported without a proxy counterpart.
    assert_eq!(
        gauge(
            &text,
            "goodput_calibration_engine_seconds",
            "test-model",
            "queue"
        ),
        Some(0.0)
    );
    assert!(
        gauge(
            &text,
            "goodput_calibration_proxy_seconds",
            "test-model",
            "queue"
        )
        .is_none()
    );
    let samples = metric_value(
        &text,
        "goodput_calibration_samples{model=\"test-model\",metric=\"e2e\",source=\"engine\"}",
    )
    .unwrap();
    assert!(samples >= 1.0, "{text}");

    let s = status(&proxy).await;
    assert_eq!(
        (s["enabled"].as_bool(), s["up"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(s["engine"], "vllm");
    assert_eq!(s["last_result"], "ok");
    let ttft = s["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "test-model" && c["metric"] == "ttft")
        .unwrap();
    assert!(
        ttft["difference_seconds"].as_f64().unwrap() >= 0.0,
        "{ttft}"
    );
    assert!(ttft["engine_samples"].as_u64().unwrap() >= 1);

    // Where the time went, against the simulator's vLLM-style metrics: no engine queue,
    // prefill and decode from its configuration, a little time outside the engine.
    let (code, body) = admin_get(proxy.admin_addr, "/api/v1/summary?window=1m").await;
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    let a = summary["attribution"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["model"] == "test-model")
        .unwrap();
    assert_eq!(a["queue_seconds"], 0.0, "{a}");
    let prefill = a["prefill_seconds"].as_f64().unwrap();
    assert!((0.019..0.04).contains(&prefill), "{a}");
    assert!(a["decode_seconds"].as_f64().unwrap() > 0.0, "{a}");
    let outside = a["outside_engine_seconds"].as_f64().unwrap();
    assert!((0.0..0.02).contains(&outside), "{a}");
    assert_eq!(a["requests_waiting"], 0.0, "{a}");
    assert!(a["kv_cache_usage"].is_number(), "{a}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_counted_and_traffic_is_untouched() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    // A port nothing listens on any more.
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}/metrics", gone.local_addr().unwrap());
    drop(gone);
    let proxy = start_proxy_with(calibrated(&sim_url, Some(dead))).await;
    let (code, _) = post_collect(
        &client(),
        &format!("http://{}/v1/chat/completions", proxy.proxy_addr),
        chat_body(true, 4, false),
    )
    .await;
    assert_eq!(code, 200);
    let text = wait_metrics(&proxy, "two failed scrapes", |t| {
        scrapes(t, "unreachable") >= 2.0
    })
    .await;
    assert_eq!(metric_value(&text, "goodput_calibration_up"), Some(0.0));
    assert!(
        !text.contains("goodput_calibration_engine_seconds{"),
        "{text}"
    );
    let s = status(&proxy).await;
    assert_eq!(s["up"], false);
    assert_eq!(s["last_result"], "unreachable");
    assert_eq!(
        wait_records(proxy.admin_addr, 1, Duration::from_secs(5))
            .await
            .len(),
        1
    );
    proxy.shutdown().await;
}

/// A metrics endpoint that answers its n-th scrape with the n-th page (the last one
/// repeats). `None` as a status never answers (the scrape times out).
struct Scripted {
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
}

async fn scripted(pages: Vec<(Option<u16>, &'static str)>) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let pages = Arc::new(pages);
    let counter = served.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (pages, counter) = (pages.clone(), counter.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = pages[n.min(pages.len() - 1)];
                    async move {
                        if status.is_none() {
                            // Never answers: the scrape times out.
                            std::future::pending::<()>().await;
                        }
                        let mut resp =
                            Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        *resp.status_mut() =
                            http::StatusCode::from_u16(status.unwrap_or(200)).unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Scripted { addr, served }
}

impl Scripted {
    fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    async fn wait_served(&self, n: usize) {
        poll_until!(format!("{n} scrapes"), Duration::from_secs(15), {
            (self.served.load(Ordering::SeqCst) >= n).then_some(())
        });
    }
}

/// A model-less vLLM e2e histogram with this sum and count.
macro_rules! e2e_page {
    ($sum:literal, $count:literal) => {
        concat!(
            "# TYPE vllm:e2e_request_latency_seconds histogram\n",
            "vllm:e2e_request_latency_seconds_sum ",
            $sum,
            "\nvllm:e2e_request_latency_seconds_count ",
            $count,
            "\n"
        )
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pages_are_classified_and_recovered_from() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let endpoint = scripted(vec![
        (
            Some(200),
            "<!doctype html><html><body>metrics live elsewhere</body></html>\n",
        ),
        (Some(404), "not found\n"),
        (Some(200), "# TYPE up gauge\nup 1\n"),
        (None, e2e_page!("1.0", "1")),
        (Some(200), e2e_page!("10.0", "10")),
        (Some(200), e2e_page!("30.0", "20")),
    ])
    .await;
    let proxy = start_proxy_with(calibrated(&sim_url, Some(endpoint.url()))).await;
    endpoint.wait_served(7).await;
    let text = wait_metrics(&proxy, "the comparison after recovery", |t| {
        gauge(t, "goodput_calibration_engine_seconds", "", "e2e").is_some()
    })
    .await;
    for result in ["invalid", "http_error", "no_engine_metrics", "timeout"] {
        assert_eq!(scrapes(&text, result), 1.0, "{result}\n{text}");
    }
    assert!(scrapes(&text, "ok") >= 2.0);
    assert_eq!(metric_value(&text, "goodput_calibration_up"), Some(1.0));
    // (30 - 10) s over (20 - 10) requests.
    assert_eq!(
        gauge(&text, "goodput_calibration_engine_seconds", "", "e2e"),
        Some(2.0)
    );
    // No traffic through the proxy: nothing to compare with.
    assert!(gauge(&text, "goodput_calibration_difference_seconds", "", "e2e").is_none());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_is_a_new_baseline_not_a_negative_interval() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let endpoint = scripted(vec![
        (Some(200), e2e_page!("100.0", "50")),
        (Some(200), e2e_page!("110.0", "60")),
        // Restarted: counters from zero again.
        (Some(200), e2e_page!("1.0", "2")),
        (Some(200), e2e_page!("2.0", "4")),
    ])
    .await;
    let proxy = start_proxy_with(calibrated(&sim_url, Some(endpoint.url()))).await;
    endpoint.wait_served(5).await;
    let text = wait_metrics(&proxy, "the reset", |t| {
        metric_value(t, "goodput_calibration_engine_resets_total") == Some(1.0)
            && gauge(t, "goodput_calibration_engine_seconds", "", "e2e") == Some(0.5)
    })
    .await;
    assert_eq!(
        metric_value(
            &text,
            "goodput_calibration_samples{model=\"\",metric=\"e2e\",source=\"engine\"}"
        ),
        Some(2.0)
    );
    assert!(scrapes(&text, "ok") >= 4.0, "{text}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_restarting_resets_its_histograms() {
    let (sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let c = client();
    post_collect(
        &c,
        &format!("{sim_url}/v1/chat/completions"),
        chat_body(true, 3, false),
    )
    .await;
    let page = |text: &str| {
        metric_value(
            text,
            "vllm:e2e_request_latency_seconds_count{model_name=\"test-model\"}",
        )
    };
    let get = || async {
        let resp = c
            .get(format!("{sim_url}/metrics").parse().unwrap())
            .await
            .unwrap();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
        String::from_utf8(body.to_bytes().to_vec()).unwrap()
    };
    assert_eq!(page(&get().await), Some(1.0));
    sim.restart_metrics();
    assert_eq!(page(&get().await), None);
    // Scrapes are not traffic.
    assert_eq!(sim.truth().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_turns_calibration_on_and_off() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let endpoint = scripted(vec![(Some(200), e2e_page!("1.0", "1"))]).await;
    let dir = TempDir::new("reload");
    let path = dir.path().join("goodput.toml");
    let text = |calibration: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [upstream]\nurl = \"{sim_url}\"\n[log]\naccess_log = false\n{calibration}"
        )
    };
    std::fs::write(&path, text("")).unwrap();
    let overrides = Overrides::default();
    let cfg = config::load(Some(&path), &overrides).unwrap();
    let source = ConfigSource {
        path: path.clone(),
        overrides,
    };
    let proxy = run::start_from(cfg, Some(source)).await.unwrap();
    assert_eq!(status(&proxy).await["enabled"], false);

    let on = format!(
        "[calibration]\nenabled = true\nurl = \"{}\"\ninterval = \"250ms\"\ntimeout = \"200ms\"\n",
        endpoint.url()
    );
    std::fs::write(&path, text(&on)).unwrap();
    proxy.reloader.as_ref().unwrap().reload().unwrap();
    wait_metrics(&proxy, "scrapes after the reload", |t| {
        scrapes(t, "ok") >= 1.0
    })
    .await;
    assert_eq!(status(&proxy).await["up"], true);

    std::fs::write(&path, text("[calibration]\nenabled = false\n")).unwrap();
    proxy.reloader.as_ref().unwrap().reload().unwrap();
    wait_metrics(&proxy, "calibration off", |t| {
        metric_value(t, "goodput_calibration_up") == Some(0.0)
    })
    .await;
    let served = endpoint.served.load(Ordering::SeqCst);
    tokio::time::sleep(INTERVAL * 3).await;
    assert!(endpoint.served.load(Ordering::SeqCst) <= served + 1);
    assert_eq!(status(&proxy).await["enabled"], false);
    proxy.shutdown().await;
}

const LOAD_PAGE_1: &str = "\
vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 10.0
vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 10.0
vllm:request_queue_time_seconds_sum{model_name=\"m\"} 1.0
vllm:request_queue_time_seconds_count{model_name=\"m\"} 10.0
vllm:request_prefill_time_seconds_sum{model_name=\"m\"} 2.0
vllm:request_prefill_time_seconds_count{model_name=\"m\"} 10.0
vllm:request_decode_time_seconds_sum{model_name=\"m\"} 5.0
vllm:request_decode_time_seconds_count{model_name=\"m\"} 10.0
vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5
vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 3.0
vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 6.0
vllm:num_preemptions_total{model_name=\"m\",engine=\"0\"} 4.0
";

const LOAD_PAGE_2: &str = "\
vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 30.0
vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 20.0
vllm:request_queue_time_seconds_sum{model_name=\"m\"} 6.0
vllm:request_queue_time_seconds_count{model_name=\"m\"} 20.0
vllm:request_prefill_time_seconds_sum{model_name=\"m\"} 6.0
vllm:request_prefill_time_seconds_count{model_name=\"m\"} 20.0
vllm:request_decode_time_seconds_sum{model_name=\"m\"} 15.0
vllm:request_decode_time_seconds_count{model_name=\"m\"} 20.0
vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.75
vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.25
vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 3.0
vllm:num_requests_waiting{model_name=\"m\",engine=\"1\"} 2.0
vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 8.0
vllm:num_preemptions_total{model_name=\"m\",engine=\"0\"} 7.0
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribution_says_where_time_goes_and_how_loaded_the_engine_is() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let endpoint = scripted(vec![(Some(200), LOAD_PAGE_1), (Some(200), LOAD_PAGE_2)]).await;
    let proxy = start_proxy_with(calibrated(&sim_url, Some(endpoint.url()))).await;
    let text = wait_metrics(&proxy, "the attribution", |t| {
        metric_value(
            t,
            "goodput_attribution_seconds{model=\"m\",phase=\"decode\"}",
        ) == Some(1.0)
    })
    .await;
    let v = |series: &str| metric_value(&text, series);
    // (6 - 1) s over (20 - 10) requests, and so on.
    assert_eq!(
        v("goodput_attribution_seconds{model=\"m\",phase=\"queue\"}"),
        Some(0.5)
    );
    assert_eq!(
        v("goodput_attribution_seconds{model=\"m\",phase=\"prefill\"}"),
        Some(0.4)
    );
    // The engine's ranks: the fullest KV cache, the sum of waiting requests.
    assert_eq!(
        v("goodput_engine_kv_cache_usage_ratio{model=\"m\"}"),
        Some(0.75)
    );
    assert_eq!(v("goodput_engine_requests_waiting{model=\"m\"}"), Some(5.0));
    assert_eq!(v("goodput_engine_requests_running{model=\"m\"}"), Some(8.0));
    assert_eq!(v("goodput_engine_preemptions{model=\"m\"}"), Some(3.0));
    let (code, body) = admin_get(proxy.admin_addr, "/api/v1/summary?window=5m").await;
    assert_eq!(code, 200, "{body}");
    let s: Value = serde_json::from_str(&body).unwrap();
    let a = &s["attribution"][0];
    assert_eq!(a["model"], "m", "{s}");
    assert_eq!(a["engine_e2e_seconds"], 2.0);
    assert_eq!(a["decode_seconds"], 1.0);
    assert_eq!(a["engine_requests"], 10);
    // Over the window: the mean of the scrapes' KV usage (0.5, then 0.75 from then on),
    // the preemptions of every interval added up.
    let kv = a["kv_cache_usage"].as_f64().unwrap();
    assert!((0.625..=0.75).contains(&kv), "{kv}");
    assert_eq!(a["preemptions"], 3.0);
    // The latest interval, as /api/v1/calibration has it.
    let latest = &status(&proxy).await["attribution"][0];
    assert_eq!(latest["kv_cache_usage"], 0.75, "{latest}");
    assert_eq!(latest["queue_seconds"], 0.5);
    // No traffic through the proxy: the time outside the engine is unknown.
    assert!(a["outside_engine_seconds"].is_null());
    assert!(s["overall"].is_object());
    proxy.shutdown().await;
}
