//! The live dashboard over real loopback sockets: `GET /` serves the embedded page and its
//! assets with the right types and headers; with `[admin] token_file` the page answers 401
//! with the token form (no data) while its static assets stay loadable and the APIs it
//! polls need the token; `/api/v1/timeline` closes points from real traffic and bounds
//! them by `[slo] timeline_points`; `/api/v1/drift?optional=true` answers `null`.
#![expect(
    clippy::unwrap_used,
    reason = "tests: a failed set-up must stop the test"
)]

use std::{net::SocketAddr, time::Duration};

use crate::common::{harness::*, temp::TempDir};
use goodput::config::{self, Overrides};
use http::{Request, header::AUTHORIZATION};
use http_body_util::BodyExt;

const TOKEN: &str = "dashboard-T0KEN-for-tests";

/// GETs `path`; returns the status, the headers and the body.
async fn get(admin: SocketAddr, path: &str, auth: Option<&str>) -> (u16, http::HeaderMap, String) {
    let mut req = Request::get(format!("http://{admin}{path}"));
    if let Some(a) = auth {
        req = req.header(AUTHORIZATION, a);
    }
    let resp = client()
        .request(req.body(Default::default()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> &'a str {
    h.get(name).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_open_without_a_token() {
    let running = start_proxy("http://127.0.0.1:9").await;
    let admin = running.admin_addr;
    let (status, h, body) = get(admin, "/", None).await;
    assert_eq!(status, 200);
    assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
    assert!(header(&h, "content-security-policy").contains("default-src 'none'"));
    assert_eq!(header(&h, "cache-control"), "no-store");
    assert!(body.starts_with("<!doctype html>") && body.contains("/dashboard.js"));
    for (path, ty, needle) in [
        (
            "/dashboard.js",
            "text/javascript; charset=utf-8",
            "/api/v1/summary",
        ),
        ("/dashboard.css", "text/css; charset=utf-8", ".kpi"),
    ] {
        let (status, h, body) = get(admin, path, None).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(header(&h, "content-type"), ty, "{path}");
        assert_eq!(header(&h, "x-content-type-options"), "nosniff");
        assert!(body.contains(needle), "{path}");
    }
    // Only GET (and HEAD): the page is no form target.
    let resp = client()
        .request(
            Request::post(format!("http://{admin}/"))
                .body(Default::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    // With drift off, the dashboard's poll gets null; the plain endpoint keeps its 404.
    assert_eq!(
        get(admin, "/api/v1/drift?optional=true", None).await.2,
        "null"
    );
    assert_eq!(get(admin, "/api/v1/drift", None).await.0, 404);
    running.shutdown().await;
}

#[tokio::test]
async fn with_a_token_the_page_is_the_form_and_the_apis_need_the_token() {
    let dir = TempDir::new("dashboard");
    let token = dir.write("token", &format!("{TOKEN}\n")).unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         token_file = \"{}\"\n[upstream]\nurl = \"http://127.0.0.1:9\"\n",
        token.display()
    );
    let path = dir.write("goodput.toml", &text).unwrap();
    let cfg = config::load(Some(&path), &Overrides::default()).unwrap();
    let running = start_proxy_with(cfg).await;
    let admin = running.admin_addr;
    let right = format!("Bearer {TOKEN}");

    for auth in [None, Some("Bearer wrong")] {
        let (status, h, body) = get(admin, "/", auth).await;
        assert_eq!(status, 401, "{auth:?}");
        assert!(header(&h, "www-authenticate").starts_with("Bearer"));
        assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
        assert!(
            body.contains("id=\"login-form\""),
            "the shell with its token form"
        );
        assert!(!body.contains(TOKEN));
    }
    let (status, _, body) = get(admin, "/", Some(&right)).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("id=\"login-form\""),
        "the same page either way"
    );
    // The static assets hold no data and load without the header a browser cannot add.
    assert_eq!(get(admin, "/dashboard.js", None).await.0, 200);
    assert_eq!(get(admin, "/dashboard.css", None).await.0, 200);
    for api in [
        "/api/v1/summary",
        "/api/v1/timeline",
        "/api/v1/capacity",
        "/api/v1/drift?optional=true",
        "/api/v1/calibration",
        "/api/v1/requests?limit=50",
    ] {
        assert_eq!(get(admin, api, None).await.0, 401, "{api}");
        assert_eq!(get(admin, api, Some(&right)).await.0, 200, "{api}");
    }
    // Nothing else hides behind the asset paths.
    assert_eq!(get(admin, "/dashboard.jsx", None).await.0, 401);
    running.shutdown().await;
}

#[tokio::test]
async fn the_timeline_closes_points_from_traffic_and_stays_bounded() {
    let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
    let mut cfg = test_config(&upstream);
    // 12 s window: 1 s slices, so points close quickly; three kept.
    cfg.slo.windows = vec![Duration::from_secs(12)];
    cfg.slo.timeline_points = 3;
    let running = start_proxy_with(cfg).await;
    let (admin, proxy) = (running.admin_addr, running.proxy_addr);
    let (status, _, body) = get(admin, "/api/v1/timeline?limit=x", None).await;
    assert_eq!(status, 400, "{body}");

    let c = client();
    let url = format!("http://{proxy}/v1/chat/completions");
    for _ in 0..4 {
        let (status, _) = post_collect(&c, &url, chat_body(true, 8, true)).await;
        assert_eq!(status, 200);
    }
    wait_records(admin, 4, Duration::from_secs(10)).await;
    // The slice holding the requests closes when time moves past it (the aggregator
    // advances the engine every second); wait for that, not for a fixed time.
    let t = poll_loop!(
        deadline = tokio::time::Instant::now() + Duration::from_secs(15),
        {
            let (status, _, body) = get(admin, "/api/v1/timeline", None).await;
            assert_eq!(status, 200, "{body}");
            let t: serde_json::Value = serde_json::from_str(&body).unwrap();
            let requests: u64 = t["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["requests"].as_u64().unwrap())
                .sum();
            if requests == 4 {
                break t;
            }
            assert!(tokio::time::Instant::now() < deadline, "never closed: {t}");
        }
    );
    assert_eq!(t["slice_seconds"], 1.0);
    assert_eq!(t["capacity"], 3);
    let points = t["points"].as_array().unwrap();
    assert!(points.len() <= 3, "{}", points.len());
    let p = points
        .iter()
        .find(|p| p["requests"].as_u64() > Some(0))
        .unwrap();
    assert_eq!(
        p["output_tokens"].as_u64(),
        p["effective_output_tokens"].as_u64()
    );
    assert!(p["ttft_ms"]["p50"].as_f64().unwrap() >= 5.0, "{p}");
    assert!(p["itl_ms"]["count"].as_u64().unwrap() > 0);
    assert!(p["raw_output_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(p["ended_s_ago"].as_f64().unwrap() >= 0.0);
    // Idle slices keep closing (zero points) and the oldest fall out.
    poll_loop!(
        deadline = tokio::time::Instant::now() + Duration::from_secs(15),
        {
            let (_, _, body) = get(admin, "/api/v1/timeline?limit=2", None).await;
            let t: serde_json::Value = serde_json::from_str(&body).unwrap();
            let points = t["points"].as_array().unwrap();
            if points.len() == 2 && points.iter().all(|p| p["requests"] == 0) {
                assert_eq!(points[0]["attainment"], serde_json::Value::Null);
                assert!(points[0]["ended_s_ago"].as_f64() > points[1]["ended_s_ago"].as_f64());
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{t}");
        }
    );
    running.shutdown().await;
}

#[tokio::test]
async fn demo_prints_the_dashboard_url_and_it_serves_the_page() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--clients",
            "1",
            "--duration",
            "30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let url = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                l.trim()
                    .strip_prefix("dashboard")
                    .map(|u| u.trim().to_owned())
            })
    })
    .await
    .unwrap();
    let url = url.expect("demo printed no dashboard line");
    let addr: SocketAddr = url
        .strip_prefix("http://")
        .and_then(|u| u.strip_suffix('/'))
        .unwrap()
        .parse()
        .unwrap();
    let (status, h, body) = get(addr, "/", None).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status, 200);
    assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
    assert!(body.contains("goodput"));
}
