//! What goodput exports over OTLP: metrics and spans that match the requests sent (the
//! latencies as exponential histograms, decoded bucket by bucket), the engine's phases, and
//! what is left at shutdown.

use super::*;
use serde_json::Value;

#[tokio::test]
async fn metrics_and_spans_match_the_requests_sent() {
    let mut receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
    let cfg = otlp_config(
        &upstream,
        &format!(
            "[otlp]\nendpoint = \"{}\"\ntraces = true\ninterval = \"200ms\"\ntimeout = \"2s\"\n\
             batch_size = 1\nservice_name = \"proxy-under-test\"\n\
             headers = {{ \"x-api-key\" = \"collector-key\" }}\n",
            receiver.endpoint()
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let sampled = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let unsampled = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    for tp in [Some(sampled.as_str()), None, Some(unsampled.as_str())] {
        let (status, _) = post_with(&client, &url, chat_body(true, 8, true), tp).await;
        assert_eq!(status, 200);
    }
    let (status, _) = post_with(&client, &url, chat_body(false, 5, false), None).await;
    assert_eq!(status, 200);
    let records: Vec<Value> = wait_records(proxy.admin_addr, 4, Duration::from_secs(10)).await;

    // Spans: one per request except the one whose caller's trace is not sampled.
    let mut spans = Vec::new();
    receiver
        .until("three spans", |got| {
            if let Got::Traces(t) = got {
                let resource = t.resource_spans[0].resource.as_ref().unwrap();
                assert_eq!(s(&resource.attributes, "service.name"), "proxy-under-test");
                spans.extend(spans_of(t));
            }
            (spans.len() >= 3).then_some(())
        })
        .await;
    assert_eq!(spans.len(), 3);
    for span in &spans {
        let a = &span.attributes;
        let id = s(a, "goodput.request.id");
        let rec = records
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("a span for an unknown request {id}"));
        assert_eq!(span.name, "chat test-model");
        assert_eq!(span.kind, 2, "SPAN_KIND_SERVER");
        assert_eq!(s(a, "gen_ai.operation.name"), "chat");
        assert_eq!(s(a, "gen_ai.provider.name"), "openai");
        assert_eq!(s(a, "gen_ai.request.model"), "test-model");
        assert_eq!(s(a, "server.address"), "127.0.0.1");
        assert_eq!(s(a, "goodput.api"), "chat_completions");
        assert_eq!(s(a, "goodput.outcome"), "ok");
        assert_eq!(
            s(a, "goodput.slo.class"),
            rec["slo_class"].as_str().unwrap()
        );
        assert_eq!(s(a, "goodput.slo.verdict"), "met");
        assert_eq!(int(a, "http.response.status_code"), 200);
        assert_eq!(
            int(a, "gen_ai.usage.output_tokens"),
            rec["output_tokens"].as_i64().unwrap()
        );
        assert_eq!(
            int(a, "gen_ai.usage.input_tokens"),
            rec["input_tokens"].as_i64().unwrap()
        );
        assert!((double(a, "goodput.e2e_ms") - rec["e2e_ms"].as_f64().unwrap()).abs() < 1e-9);
        let e2e_ns = span.end_time_unix_nano - span.start_time_unix_nano;
        assert!(
            (e2e_ns as f64 / 1e6 - rec["e2e_ms"].as_f64().unwrap()).abs() < 0.01,
            "span duration {e2e_ns} ns vs e2e {}",
            rec["e2e_ms"]
        );
        if rec["stream"] == true {
            let ttft = double(a, "goodput.ttft_ms");
            assert!((ttft - rec["ttft_ms"].as_f64().unwrap()).abs() < 1e-9);
            assert!(ttft >= 5.0, "the simulator's TTFT is 5 ms: {ttft}");
            assert!((double(a, "goodput.tpot_ms") - rec["tpot_ms"].as_f64().unwrap()).abs() < 1e-9);
        } else {
            assert!(attr(a, "goodput.ttft_ms").is_none());
        }
        assert!(attr(a, "error.type").is_none());
        // Joined the caller's trace when it sent one; a root span of its own otherwise.
        if hex(&span.trace_id) == TRACE_ID {
            assert_eq!(hex(&span.parent_span_id), PARENT_ID);
        } else {
            assert!(span.parent_span_id.is_empty());
            assert_eq!(span.trace_id.len(), 16);
        }
        assert_eq!(span.span_id.len(), 8);
    }
    assert_eq!(
        spans
            .iter()
            .filter(|s| hex(&s.trace_id) == TRACE_ID)
            .count(),
        1,
        "only the sampled traceparent's request is in the caller's trace"
    );

    // Metrics: cumulative, so wait for an export that has seen all four requests.
    let total = |m: &ExportMetricsServiceRequest| {
        exponential(m, "gen_ai.server.request.duration")
            .iter()
            .map(|p| p.count)
            .sum::<u64>()
    };
    let m = receiver
        .until("metrics of four requests", |got| match got {
            Got::Metrics(m) if total(m) == 4 => Some(m.clone()),
            _ => None,
        })
        .await;
    let duration = exponential(&m, "gen_ai.server.request.duration");
    let a = &duration[0].attributes;
    assert_eq!(s(a, "gen_ai.operation.name"), "chat");
    assert_eq!(s(a, "gen_ai.provider.name"), "openai");
    assert_eq!(s(a, "gen_ai.request.model"), "test-model");
    assert_eq!(s(a, "server.address"), "127.0.0.1");
    let port: i64 = upstream.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(int(a, "server.port"), port);
    let e2e_sum: f64 = records.iter().map(|r| r["e2e_ms"].as_f64().unwrap()).sum();
    let sum: f64 = duration.iter().map(|p| p.sum.unwrap()).sum();
    assert!(
        (sum * 1000.0 - e2e_sum).abs() < 1e-6,
        "{sum} s vs {e2e_sum} ms"
    );
    // The latencies are base-2 exponential histograms at the native histograms' default
    // precision (scale 6: ±0.54 %, at most 512 buckets), every request in the bucket its
    // value falls in.
    let streamed: Vec<&Value> = records.iter().filter(|r| r["stream"] == true).collect();
    let seconds = |rs: &[&Value], key: &str| -> Vec<f64> {
        rs.iter()
            .map(|r| r[key].as_f64().unwrap() / 1000.0)
            .collect()
    };
    let all: Vec<&Value> = records.iter().collect();
    for (name, values) in [
        ("gen_ai.server.request.duration", seconds(&all, "e2e_ms")),
        ("gen_ai.client.operation.duration", seconds(&all, "e2e_ms")),
        (
            "gen_ai.server.time_to_first_token",
            seconds(&streamed, "ttft_ms"),
        ),
        (
            "gen_ai.server.time_per_output_token",
            seconds(&streamed, "tpot_ms"),
        ),
    ] {
        let points = exponential(&m, name);
        assert_eq!(metric(&m, name).unwrap().unit, "s", "{name}");
        let (scale, zeros, counts) = expected_exponential(&values, 6, 512);
        assert_eq!(
            points.iter().map(|p| p.zero_count).sum::<u64>(),
            zeros,
            "{name}"
        );
        for p in &points {
            assert_eq!(p.scale, scale, "{name}");
            assert!(
                p.negative
                    .as_ref()
                    .is_none_or(|b| b.bucket_counts.iter().all(|&n| n == 0))
            );
        }
        assert_eq!(
            points.iter().map(|p| p.count).sum::<u64>(),
            values.len() as u64,
            "{name}"
        );
        assert_eq!(exponential_buckets(&points), counts, "{name}");
        // Within a nanosecond: the records reach the test through JSON.
        let max = values.iter().copied().fold(0.0, f64::max);
        assert!(
            points
                .iter()
                .any(|p| p.max.is_some_and(|m| (m - max).abs() < 1e-9)),
            "{name}: max {max}"
        );
    }
    assert_eq!(streamed.len(), 3);
    // Token usage: input and output, their sums the records' totals.
    let usage = histogram(&m, "gen_ai.client.token.usage");
    assert_eq!(
        metric(&m, "gen_ai.client.token.usage").unwrap().unit,
        "{token}"
    );
    for (kind, field) in [("input", "input_tokens"), ("output", "output_tokens")] {
        let points: Vec<_> = usage
            .iter()
            .filter(|p| s(&p.attributes, "gen_ai.token.type") == kind)
            .collect();
        let expected: f64 = records.iter().map(|r| r[field].as_f64().unwrap()).sum();
        assert_eq!(points.iter().map(|p| p.count).sum::<u64>(), 4, "{kind}");
        assert_eq!(points.iter().map(|p| p.sum.unwrap()).sum::<f64>(), expected);
    }
    // goodput's own: requests by verdict, effective tokens, attainment.
    let requests = match metric(&m, "goodput.requests").and_then(|m| m.data.as_ref()) {
        Some(metric::Data::Sum(sum)) => sum.clone(),
        other => panic!("goodput.requests: {other:?}"),
    };
    assert!(requests.is_monotonic);
    let met: f64 = requests
        .data_points
        .iter()
        .filter(|p| s(&p.attributes, "goodput.slo.verdict") == "met")
        .map(|p| match p.value {
            Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(n)) => {
                n as f64
            }
            Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(
                n,
            )) => n,
            None => 0.0,
        })
        .sum();
    assert_eq!(met, 4.0);
    assert!(metric(&m, "goodput.output_tokens").is_some());

    // Nothing of the content, nor the client's credentials, went to the collector.
    {
        let seen = receiver.seen.lock().unwrap();
        assert!(
            seen.content_types
                .iter()
                .all(|c| c == "application/x-protobuf")
        );
        assert!(seen.api_keys.iter().all(|k| k == "collector-key"));
        for body in &seen.bodies {
            for secret in [&b"SECRET-PROMPT-TEXT"[..], b"SECRET-API-KEY", b"hello"] {
                assert!(
                    !body.windows(secret.len()).any(|w| w == secret),
                    "an export carried {}",
                    String::from_utf8_lossy(secret)
                );
            }
        }
    }
    let text = metrics(proxy.admin_addr).await;
    assert!(
        metric_value(&text, "goodput_otlp_exports_total{signal=\"traces\"}").unwrap() >= 1.0,
        "{text}"
    );
    assert!(metric_value(&text, "goodput_otlp_exports_total{signal=\"metrics\"}").unwrap() >= 1.0);
    // Every inter-token gap and every engine part, as on `/metrics` (the simulator reports
    // no engine timings: none of either), at the same precision.
    let total_of = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    for (otlp, prom) in [
        (
            "goodput.inter_token_latency",
            "goodput_inter_token_latency_seconds",
        ),
        ("goodput.request.phase", "goodput_request_phase_seconds"),
    ] {
        let points = exponential(&m, otlp);
        let count = points.iter().map(|p| p.count).sum::<u64>();
        assert_eq!(count as f64, total_of(&format!("{prom}_count")), "{otlp}");
        let sum: f64 = points.iter().map(|p| p.sum.unwrap()).sum();
        assert!(
            (sum - total_of(&format!("{prom}_sum"))).abs() < 1e-9,
            "{otlp}: sum {sum}"
        );
        // At most scale 6; gaps from a microsecond to tens of milliseconds span more than
        // 512 buckets at 6, and the data point then halves its resolution, once or twice.
        assert!(points.iter().all(|p| (4..=6).contains(&p.scale)), "{otlp}");
    }
    assert!(
        exponential(&m, "goodput.inter_token_latency")
            .iter()
            .any(|p| p.count > 0)
    );
    proxy.shutdown().await;
}

/// The last requests before shutdown are exported at shutdown, not lost; the latency
/// histograms follow `[metrics] native_histogram_schema`.
#[tokio::test]
async fn shutdown_exports_what_is_left() {
    let mut receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(1.0, 1.0)).await;
    // Long interval and large batches: only the shutdown flush can deliver them.
    let cfg = otlp_config(
        &upstream,
        &format!(
            "[metrics]\nnative_histogram_schema = 3\n\
             [otlp]\nendpoint = \"{}\"\ntraces = true\ninterval = \"1h\"\nbatch_size = 100\n",
            receiver.endpoint()
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let client = client();
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    for _ in 0..3 {
        let (status, _) = post_collect(&client, &url, chat_body(true, 4, true)).await;
        assert_eq!(status, 200);
    }
    wait_records(proxy.admin_addr, 3, Duration::from_secs(10)).await;
    proxy.shutdown().await;
    let (mut spans, mut metric_requests, mut scales) = (0, 0, Vec::new());
    receiver
        .until("the shutdown exports", |got| {
            match got {
                Got::Traces(t) => spans += spans_of(t).len(),
                Got::Metrics(m) => {
                    let points = exponential(m, "gen_ai.server.time_to_first_token");
                    metric_requests = points.iter().map(|p| p.count).sum();
                    scales = points.iter().map(|p| p.scale).collect();
                }
            }
            (spans == 3 && metric_requests == 3).then_some(())
        })
        .await;
    assert!(
        !scales.is_empty() && scales.iter().all(|&s| s == 3),
        "{scales:?}"
    );
}

/// With `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` (the real binary, so the
/// variable is its own) the latest client-inference instruments and the cost per request
/// (`gen_ai.usage.cost.source = local`) are exported beside today's.
#[tokio::test(flavor = "multi_thread")]
async fn the_latest_genai_instruments_are_exported_when_opted_in() {
    use crate::common::binary::Serving;
    let mut receiver = Receiver::start(Mode::Accept).await;
    let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
    let tmp = TempDir::new("otlp-latest");
    let cfg = tmp.path().join("goodput.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [upstream]\nurl = \"{upstream}\"\n[log]\naccess_log = false\n\
             [cost]\ncurrency = \"EUR\"\nper_hour = {{ hardware = 36.0 }}\n\
             [otlp]\nendpoint = \"{}\"\ninterval = \"200ms\"\ntimeout = \"2s\"\n",
            receiver.endpoint()
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"));
    cmd.args(["serve", "--config", cfg.to_str().unwrap()]).env(
        "OTEL_SEMCONV_STABILITY_OPT_IN",
        "gen_ai_latest_experimental",
    );
    let mut served = Serving::start(cmd, Duration::from_secs(20)).unwrap();
    let url = format!("http://{}/v1/chat/completions", served.proxy);
    let client = client();
    // The cost per token needs a window with tokens in it: requests until one is priced.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    let (ttfc, cost) = loop {
        let (status, _) = post_with(&client, &url, chat_body(true, 8, true), None).await;
        assert_eq!(status, 200);
        sent += 1;
        let got = tokio::time::timeout(Duration::from_secs(2), receiver.rx.recv()).await;
        if let Ok(Some(Got::Metrics(m))) = got {
            let ttfc = exponential(&m, "gen_ai.client.inference.time_to_first_chunk");
            let cost = histogram(&m, "gen_ai.client.operation.cost");
            if !ttfc.is_empty() && !cost.is_empty() {
                break (ttfc[0].clone(), cost[0].clone());
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no priced request after {sent}"
        );
    };
    assert!(ttfc.count >= 1 && ttfc.scale == 6, "{ttfc:?}");
    assert_eq!(s(&ttfc.attributes, "gen_ai.request.model"), "test-model");
    assert_eq!(s(&cost.attributes, "gen_ai.usage.cost.source"), "local");
    assert_eq!(s(&cost.attributes, "goodput.cost.currency"), "EUR");
    assert!(cost.sum.unwrap() > 0.0, "{cost:?}");
    served.signal("-TERM");
    served.exited(Duration::from_secs(10)).unwrap();
}

/// The engine's own timings (vLLM's per-request `metrics`: 40 ms queued, 75 ms to the first
/// token) reach the collector as `goodput.request.phase`, each part in its exponential
/// bucket at scale 6.
#[tokio::test]
async fn engine_phases_are_exported_as_exponential_histograms() {
    use crate::common::fake::{FakeUpstream, Script, WritePlan, openai_chat_events};
    const METRICS: &str = r#""metrics":{"time_to_first_token_ms":75.0,"generation_time_ms":20.0,"queue_time_ms":40.0,"mean_itl_ms":5.0,"tokens_per_second":200.0}"#;
    let mut events = openai_chat_events(5, true);
    let usage = events.len() - 2;
    let chunk = String::from_utf8(events[usage].clone()).unwrap();
    events[usage] = chunk
        .replacen(r#""usage":"#, &format!("{METRICS},\"usage\":"), 1)
        .into_bytes();
    let fake = FakeUpstream::start(Script::sse_chunked(
        &events,
        WritePlan::Whole,
        Duration::ZERO,
    ))
    .await;
    let mut receiver = Receiver::start(Mode::Accept).await;
    let cfg = otlp_config(
        &fake.url(),
        &format!(
            "[otlp]\nendpoint = \"{}\"\ninterval = \"200ms\"\ntimeout = \"2s\"\n",
            receiver.endpoint()
        ),
    );
    let proxy = start_proxy_with(cfg).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let (status, _) = post_with(&client(), &url, chat_body(true, 5, true), None).await;
    assert_eq!(status, 200);
    let records: Vec<Value> = wait_records(proxy.admin_addr, 1, Duration::from_secs(10)).await;
    let m = receiver
        .until("the engine's phases", |got| match got {
            Got::Metrics(m) if !exponential(m, "goodput.request.phase").is_empty() => {
                Some(m.clone())
            }
            _ => None,
        })
        .await;
    let points = exponential(&m, "goodput.request.phase");
    for (phase, key) in [
        ("queue", "engine_queue_ms"),
        ("prefill", "engine_prefill_ms"),
    ] {
        let seconds = records[0][key].as_f64().unwrap() / 1000.0;
        let of: Vec<_> = points
            .iter()
            .copied()
            .filter(|p| s(&p.attributes, "goodput.phase") == phase)
            .collect();
        let (scale, zeros, counts) = expected_exponential(&[seconds], 6, 512);
        assert_eq!(of.len(), 1, "{phase}");
        assert_eq!(
            (of[0].scale, of[0].zero_count, of[0].count),
            (scale, zeros, 1),
            "{phase}"
        );
        assert_eq!(exponential_buckets(&of), counts, "{phase}");
        assert!((of[0].sum.unwrap() - seconds).abs() < 1e-12, "{phase}");
    }
    assert_eq!(records[0]["engine_queue_ms"].as_f64(), Some(40.0));
    proxy.shutdown().await;
}
