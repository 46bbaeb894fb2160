//! `/metrics` in both expositions through the real proxy: a scrape that asks for the
//! Prometheus protobuf exposition (as Prometheus does with native histograms on) gets the
//! latency histograms' native buckets, each request in the bucket its record says; a plain
//! scrape gets the text exposition; and the classic buckets have an edge at every SLO
//! threshold, so the share under a threshold read from them equals the records' share.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use crate::common::harness::*;
use bytes::Bytes;
use goodput::sim::SimConfig;
use http::{Request, header::ACCEPT};
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    Histogram, MetricFamily,
};
use prost::Message;
use serde_json::Value;

const T: Duration = Duration::from_secs(10);
const N: usize = 60;
/// What Prometheus 2.42 sends with `--enable-feature=native-histograms`.
const PROTOBUF_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

/// Thresholds that are no default edge, inside the simulated spread.
const CONFIG: &str = "[slo.default]\nttft_ms = 31.7\ntpot_ms = 5.3\ne2e_ms = 71.3\n\
    percentiles = [{ metric = \"itl\", quantile = 0.9, max_ms = 6.1 }]\n\
    [metrics]\nnative_histogram_schema = 6\n";

async fn scrape(admin: SocketAddr, accept: Option<&str>) -> (String, Bytes) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = Request::get(format!("http://{admin}/metrics"));
    if let Some(a) = accept {
        req = req.header(ACCEPT, a);
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let content_type = resp.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    (
        content_type,
        resp.into_body().collect().await.unwrap().to_bytes(),
    )
}

fn families(mut body: &[u8]) -> BTreeMap<String, MetricFamily> {
    let mut out = BTreeMap::new();
    while !body.is_empty() {
        let f = MetricFamily::decode_length_delimited(&mut body).unwrap();
        out.insert(f.name.clone(), f);
    }
    out
}

/// The one histogram of family `name` (one model, API and class in this test).
fn histogram<'a>(families: &'a BTreeMap<String, MetricFamily>, name: &str) -> &'a Histogram {
    let f = &families[name];
    assert_eq!(f.metric.len(), 1, "{name}");
    f.metric[0].histogram.as_ref().unwrap()
}

/// The native buckets' counts by index, from spans and deltas.
fn native_counts(h: &Histogram) -> BTreeMap<i32, u64> {
    let mut out = BTreeMap::new();
    let (mut index, mut count, mut deltas) = (0i32, 0i64, h.positive_delta.iter());
    for span in &h.positive_span {
        index += span.offset;
        for _ in 0..span.length {
            count += deltas.next().unwrap();
            if count > 0 {
                out.insert(index, count as u64);
            }
            index += 1;
        }
    }
    out
}

/// The native bucket of `v` at `schema`: `i` with `2^((i-1)/2^schema) < v <= 2^(i/2^schema)`.
fn native_index(v: f64, schema: i32) -> i32 {
    (v.log2() * 2f64.powi(schema)).ceil() as i32
}

fn values(records: &[Value], key: &str) -> Vec<f64> {
    records.iter().filter_map(|r| r[key].as_f64()).collect()
}

/// The cumulative count of the classic bucket of `name`'s one series whose edge is `le`.
fn classic_bucket(text: &str, name: &str, le: f64) -> Option<u64> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines().find_map(|l| {
        let edge: f64 = l.strip_prefix(&prefix)?.split('"').next()?.parse().ok()?;
        (edge == le).then(|| l.rsplit(' ').next().unwrap().parse().unwrap())
    })
}

/// The value of `name`'s one series (labels whatever they are).
fn series_value(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    let line = text.lines().find(|l| l.starts_with(&prefix))?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test]
async fn protobuf_scrapes_carry_native_buckets_and_text_scrapes_classic_edges_at_thresholds() {
    let sim = SimConfig {
        ttft: "lognormal:30,0.3".parse().unwrap(),
        itl: "lognormal:5,0.2".parse().unwrap(),
        seed: 7,
        ..SimConfig::default()
    };
    let (_sim, upstream) = start_sim(sim).await;
    let proxy = start_proxy_toml(&upstream, CONFIG).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let client = client();
    for _ in 0..N / 10 {
        let mut sends = tokio::task::JoinSet::new();
        for _ in 0..10 {
            let (client, url) = (client.clone(), url.clone());
            sends.spawn(async move { post_collect(&client, &url, chat_body(true, 8, true)).await });
        }
        while let Some(sent) = sends.join_next().await {
            assert_eq!(sent.unwrap().0, 200);
        }
    }
    let records = wait_records(proxy.admin_addr, N, T).await;
    assert_eq!(records.len(), N);
    // The metrics are written just after the record is kept: wait for every request.
    let ttft = "gen_ai_server_time_to_first_token_seconds";
    let text = poll_loop!(deadline = tokio::time::Instant::now() + T, {
        let (_, body) = scrape(proxy.admin_addr, None).await;
        let text = String::from_utf8(body.to_vec()).unwrap();
        let count = series_value(&text, &format!("{ttft}_count"));
        if count == Some(N as f64) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "TTFT count {count:?}, want {N}"
        );
    });

    // Protobuf: native buckets at schema 6, every request where its record puts it.
    let (content_type, body) = scrape(proxy.admin_addr, Some(PROTOBUF_ACCEPT)).await;
    assert!(
        content_type.starts_with("application/vnd.google.protobuf"),
        "{content_type}"
    );
    let fams = families(&body);
    for (name, key) in [
        (ttft, "ttft_ms"),
        ("gen_ai_server_time_per_output_token_seconds", "tpot_ms"),
        ("gen_ai_server_request_duration_seconds", "e2e_ms"),
    ] {
        let h = histogram(&fams, name);
        assert_eq!(h.schema, 6, "{name}");
        let seconds: Vec<f64> = values(&records, key).iter().map(|ms| ms / 1000.0).collect();
        assert_eq!(h.sample_count, seconds.len() as u64, "{name}");
        let mut want = BTreeMap::new();
        for v in &seconds {
            *want.entry(native_index(*v, 6)).or_insert(0u64) += 1;
        }
        assert_eq!(native_counts(h), want, "{name}");
        // The classic buckets travel beside them, the threshold edge among them.
        assert!(!h.bucket.is_empty(), "{name}");
    }
    let itl = histogram(&fams, "goodput_inter_token_latency_seconds");
    assert_eq!(itl.schema, 6);
    let gaps: u64 = native_counts(itl).values().sum::<u64>() + itl.zero_count;
    assert_eq!(gaps, itl.sample_count);
    let itl_threshold = 6.1 / 1000.0;
    assert!(itl.bucket.iter().any(|b| b.upper_bound == itl_threshold));

    // Text: the classic exposition, no native buckets; an edge at each threshold whose
    // count is the records' count at or under it.
    let (content_type, _) = scrape(proxy.admin_addr, None).await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(text.ends_with("# EOF\n"));
    for (name, key, threshold_ms) in [
        (ttft, "ttft_ms", 31.7),
        (
            "gen_ai_server_time_per_output_token_seconds",
            "tpot_ms",
            5.3,
        ),
        ("gen_ai_server_request_duration_seconds", "e2e_ms", 71.3),
    ] {
        let le = threshold_ms / 1000.0;
        let vals = values(&records, key);
        let under = vals.iter().filter(|ms| *ms / 1000.0 <= le).count();
        // The spread straddles each threshold, so the check is not vacuous.
        assert!(
            under > 0 && under < vals.len(),
            "{name}: {under} of {}",
            vals.len()
        );
        assert_eq!(
            classic_bucket(&text, name, le),
            Some(under as u64),
            "{name}"
        );
    }
    proxy.shutdown().await;
}
