//! A slow upload is the client's: the upstream's response-head clock starts when the
//! request body is complete, the record says how long the upload took (`upload_ms`), and
//! the SLO judges latency from the end of the body. An upload that outlives
//! `server.request_body_timeout` is a 408 `client_error`, whatever the other timers say.
//!
//! The client's slowness is the subject here, so its pauses are real time (4 s and 9 s
//! against timeouts of 3 s and 8 s: a second's margin either way); the two requests run
//! side by side.

use goodput::config::{self, Overrides};

use super::*;

const CONFIG: &str = "[log]\naccess_log = false\n\
    [server]\nrequest_body_timeout = \"8s\"\n\
    [upstream]\nresponse_header_timeout = \"3s\"\n\
    [[slo.class]]\nname = \"tight\"\nttft_ms = 500\ne2e_ms = 1000\n";

/// Sends a chat request's head at once and its body `after` later; the raw answer.
async fn upload_slowly(addr: SocketAddr, after: Duration) -> (u16, Vec<u8>) {
    let body = chat_body(true, 3, true);
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    // The client may already have been answered (and closed); the answer says.
    let _ = s.write_all(body.as_bytes()).await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut raw)).await;
    status_and_body(&raw)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_upload_is_not_the_upstreams_time_and_one_past_the_body_deadline_is_408() {
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(url),
        admin: Some("127.0.0.1:0".into()),
    };
    let proxy = start_proxy_with(config::load_str(CONFIG, "test", &overrides).unwrap()).await;
    let addr = proxy.proxy_addr;
    let (four, nine) = tokio::join!(
        upload_slowly(addr, Duration::from_secs(4)),
        upload_slowly(addr, Duration::from_secs(9)),
    );
    // Four seconds of upload, past the 3 s response-head timeout: answered.
    assert_eq!(four.0, 200, "{}", String::from_utf8_lossy(&four.1));
    // (Chunked on the wire: the stream's last event, then the last chunk.)
    let text = String::from_utf8_lossy(&four.1);
    assert!(text.contains("data: [DONE]\n\n"), "{text}");
    // Nine: past the body deadline (8 s), the client's fault.
    assert_eq!(nine.0, 408, "{}", String::from_utf8_lossy(&nine.1));
    assert_eq!(error_code(&nine.1), "request_body_timeout");

    let records = wait_records(proxy.admin_addr, 2, WAIT).await;
    let find = |status: u64| {
        records
            .iter()
            .find(|r| r["status"] == status)
            .unwrap_or_else(|| panic!("no {status} record: {records:?}"))
    };
    let ok = find(200);
    assert_eq!(ok["outcome"], "ok", "{ok}");
    let upload = ok["upload_ms"].as_f64().unwrap();
    assert!((3_900.0..4_500.0).contains(&upload), "{ok}");
    // TTFT as defined counts from the head; the SLO's from the end of the body.
    let ttft = ok["ttft_ms"].as_f64().unwrap();
    let judged = ok["ttft_after_upload_ms"].as_f64().unwrap();
    assert!(ttft >= upload, "{ok}");
    assert!(judged < 500.0, "{ok}");
    assert!((ttft - upload - judged).abs() < 1.0, "{ok}");
    assert!(
        ok["e2e_after_upload_ms"].as_f64().unwrap() < 1_000.0,
        "{ok}"
    );
    assert_eq!(ok["slo_class"], "tight", "{ok}");
    assert_eq!(
        ok["slo_met"], true,
        "the upload is not held against the upstream: {ok}"
    );

    let late = find(408);
    assert_eq!(late["outcome"], "client_error", "{late}");
    assert_eq!(
        late["upload_ms"],
        Value::Null,
        "the body never completed: {late}"
    );
    assert_eq!(late["slo_met"], Value::Null, "{late}");
    let series = "goodput_limit_rejections_total{limit=\"server.request_body_timeout\"}";
    assert_eq!(metric(proxy.admin_addr, series).await, 1.0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_a_slow_body_has_no_upload_time() {
    let (_sim, url) = start_sim(fast_sim(5.0, 1.0)).await;
    let proxy = start_proxy(&url).await;
    let target = format!("http://{}{CHAT}", proxy.proxy_addr);
    let (status, _) = post_collect(&client(), &target, chat_body(true, 3, true)).await;
    assert_eq!(status, 200);
    let r = one_record(proxy.admin_addr).await;
    let upload = r["upload_ms"].as_f64().unwrap();
    assert!(upload < 50.0, "{r}");
    assert!(r["ttft_after_upload_ms"].as_f64().unwrap() <= r["ttft_ms"].as_f64().unwrap());
    proxy.shutdown().await;
}
