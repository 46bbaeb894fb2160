//! Same answers through the real proxy: each copy goes to a candidate and a secondary
//! (another replica of the primary), and the candidate's words on deterministic requests
//! are judged against the secondary's own differences, while the client gets the
//! primary's words and no content reaches a record, a log line, a metric or the report.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_secondary_answers_every_copy_and_stays_out_of_the_primarys_numbers() {
    let (_primary, upstream) = start_sim(fast_sim(1.0, 0.0)).await;
    let (_candidate, candidate_url) = start_sim(fast_sim(1.0, 0.0)).await;
    let (secondary, secondary_url) = start_sim(fast_sim(1.0, 0.0)).await;
    let extra = format!("secondary_url = \"{secondary_url}\"\nauth_header = \"Bearer CAND\"");
    let proxy = proxy_with(&upstream, &shadow_config(&candidate_url, &extra)).await;
    let n = 6;
    for i in 0..n {
        let (status, body, _) = chat(&proxy, &format!("req-{i}")).await;
        assert_eq!(status, 200);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
    let report = report_when(&proxy, |r| {
        r["classes"][0]["secondary"]["requests"].as_u64() == Some(n)
    })
    .await;
    assert_eq!(pairs(&report), n, "{report:#}");
    // The primary's own spread beside the candidate's shift.
    let class = &report["classes"][0];
    assert_eq!(class["ttft_shift"]["secondary"]["pairs"], n, "{report:#}");
    assert!(class["ttft_shift"]["secondary"]["shift_ms"].is_f64());
    assert_eq!(class["tpot_shift"]["candidate"]["pairs"], n);
    // These requests are sampled (no temperature 0, no seed): compared by length and
    // finish reason as distributions, never word for word.
    let report = report_when(&proxy, |r| {
        let a = &r["classes"][0]["answers"];
        a["sampled"]["pairs"].as_u64() == Some(n) && a["noise_sampled"]["pairs"].as_u64() == Some(n)
    })
    .await;
    let answers = &report["classes"][0]["answers"];
    assert_eq!(answers["pairs"], 0, "{answers:#}");
    assert!(answers["sampled"]["length_p_value"].is_f64(), "{answers:#}");
    let recs = poll_until!("every secondary record", T, {
        let recs = records(proxy.admin_addr).await;
        let n_sec = recs.iter().filter(|r| r["target"] == "secondary").count();
        (n_sec == n as usize).then_some(recs)
    });
    for i in 0..n {
        let id = format!("req-{i}:secondary");
        let rec = recs.iter().find(|r| r["id"] == id.as_str()).unwrap();
        assert_eq!(rec["pair_id"], format!("req-{i}"));
    }
    assert_eq!(
        recs.iter().filter(|r| r["target"] == "primary").count(),
        n as usize
    );
    // The secondary gets the client's body, without the candidate's credential.
    assert_eq!(secondary.truth().len(), n as usize);
    // Only the candidate's answers count as the shadow's.
    metric_reaches(
        &proxy,
        r#"goodput_shadow_requests_total{outcome="ok"}"#,
        n as f64,
    )
    .await;
    proxy.shutdown().await;
}

/// A greedy (temperature 0) streamed chat request whose prompt carries a canary; returns
/// the words the client received.
async fn greedy_chat(addr: std::net::SocketAddr, id: &str, prompt: &str) -> String {
    let body = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": format!("CANARY-PROMPT-{prompt}")}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(CONTENT_TYPE, "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.ends_with(b"data: [DONE]\n\n"));
    words_of(&bytes)
}

/// The content deltas of an SSE chat stream, joined.
fn words_of(sse: &[u8]) -> String {
    String::from_utf8_lossy(sse)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

fn varying_sim(seed: u64, vary_share: f64) -> goodput::sim::SimConfig {
    goodput::sim::SimConfig {
        seed,
        vary_share,
        ..fast_sim(1.0, 0.0)
    }
}

/// Sends `n` greedy requests through a proxy mirroring to a candidate and a secondary,
/// and returns the class's `answers` once every pair is compared, with the proxy and the
/// answers the client received.
async fn answers_of(
    candidate: goodput::sim::SimConfig,
    secondary: goodput::sim::SimConfig,
    n: u64,
) -> (Value, Running, Vec<String>) {
    answers_with(varying_sim(1, 0.0), candidate, secondary, n, "").await
}

/// [`answers_of`] with the primary's simulator and more of `[shadow]` given.
async fn answers_with(
    primary: goodput::sim::SimConfig,
    candidate: goodput::sim::SimConfig,
    secondary: goodput::sim::SimConfig,
    n: u64,
    more: &str,
) -> (Value, Running, Vec<String>) {
    let (_primary, upstream) = start_sim(primary.clone()).await;
    let (direct, direct_url) = start_sim(primary).await;
    let (_candidate, candidate_url) = start_sim(candidate).await;
    let (_secondary, secondary_url) = start_sim(secondary).await;
    let extra = format!("secondary_url = \"{secondary_url}\"\n{more}");
    let proxy = proxy_with(&upstream, &shadow_config(&candidate_url, &extra)).await;
    let direct_addr: std::net::SocketAddr =
        direct_url.trim_start_matches("http://").parse().unwrap();
    let mut answers = Vec::new();
    for i in 0..n {
        let words = greedy_chat(proxy.proxy_addr, &format!("req-{i}"), &i.to_string()).await;
        // The client gets the primary's own words, as a direct request would.
        let expected = greedy_chat(direct_addr, &format!("direct-{i}"), &i.to_string()).await;
        assert_eq!(words, expected);
        answers.push(words);
    }
    drop(direct);
    let report = report_when(&proxy, |r| {
        let a = &r["classes"][0]["answers"];
        a["pairs"].as_u64() == Some(n) && a["noise_pairs"].as_u64() == Some(n)
    })
    .await;
    (report["classes"][0]["answers"].clone(), proxy, answers)
}

/// Fails when a prompt's canary or any answer the client received is in `text`.
fn assert_clean(what: &str, text: &str, answers: &[String]) {
    assert!(!text.contains("CANARY"), "a prompt in the {what}");
    for a in answers {
        assert!(a.len() > 8, "an answer too short to look for: {a:?}");
        assert!(!text.contains(a.as_str()), "an answer in the {what}: {a:?}");
    }
}

/// No content of a prompt or an answer anywhere: records, metrics, the report.
async fn assert_no_content(proxy: &Running, answers: &[String]) {
    let recs = serde_json::to_string(&records(proxy.admin_addr).await).unwrap();
    let text = metrics(proxy.admin_addr).await;
    let report = shadow_report(proxy).await.to_string();
    for (what, s) in [("records", &recs), ("metrics", &text), ("report", &report)] {
        assert_clean(what, s, answers);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_with_the_same_words_passes_and_one_with_others_fails() {
    let (answers, proxy, said) = answers_of(varying_sim(1, 0.0), varying_sim(1, 0.0), 6).await;
    assert_eq!(answers["verdict"], "pass", "{answers:#}");
    assert_eq!(answers["exact_match"], 1.0);
    assert_eq!(answers["noise_exact_match"], 1.0);
    assert!(
        answers["rule"]
            .as_str()
            .unwrap()
            .contains("answers_relative")
    );
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="same"}"#,
        6.0,
    )
    .await;
    assert_no_content(&proxy, &said).await;
    proxy.shutdown().await;

    let (answers, proxy, said) = answers_of(varying_sim(2, 0.0), varying_sim(1, 0.0), 6).await;
    assert_eq!(answers["verdict"], "fail", "{answers:#}");
    assert_eq!(answers["exact_match"], 0.0);
    assert!(answers["first_divergence_tokens"]["p50"].as_f64().is_some());
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="differs"}"#,
        6.0,
    )
    .await;
    assert_no_content(&proxy, &said).await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_noisy_secondary_lets_a_little_difference_pass_but_not_a_lot() {
    let n = 50;
    let (answers, proxy, _) = answers_of(varying_sim(1, 0.32), varying_sim(1, 0.3), n).await;
    assert_eq!(answers["noise_exact_match"], 0.7, "{answers:#}");
    assert_eq!(answers["exact_match"], 0.68, "{answers:#}");
    assert_eq!(answers["verdict"], "pass", "{answers:#}");
    proxy.shutdown().await;
    let (answers, proxy, said) = answers_of(varying_sim(1, 0.8), varying_sim(1, 0.3), n).await;
    assert_eq!(answers["exact_match"], 0.2, "{answers:#}");
    assert_eq!(answers["verdict"], "fail", "{answers:#}");
    assert_no_content(&proxy, &said).await;
    proxy.shutdown().await;
}

/// No content in the logs either: the real binary, with its access log on and its own
/// lines at the most verbose level, mirrors greedy requests whose prompts carry a canary
/// to a candidate with other words and to a secondary.
#[tokio::test(flavor = "multi_thread")]
async fn no_prompt_or_answer_reaches_the_logs() {
    use crate::common::{binary::Serving, temp::TempDir};
    let (_primary, upstream) = start_sim(varying_sim(1, 0.0)).await;
    let (_candidate, candidate_url) = start_sim(varying_sim(2, 0.0)).await;
    let (_secondary, secondary_url) = start_sim(varying_sim(1, 0.0)).await;
    let tmp = TempDir::new("shadow-logs");
    let cfg = tmp.path().join("goodput.toml");
    let shadow = shadow_config(
        &candidate_url,
        &format!("secondary_url = \"{secondary_url}\""),
    );
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [upstream]\nurl = \"{upstream}\"\n[log]\naccess_log = true\n{shadow}"
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"));
    cmd.args(["serve", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "goodput=trace,info");
    let mut served = Serving::start(cmd, Duration::from_secs(20)).unwrap();
    let n = 6;
    let mut said = Vec::new();
    for i in 0..n {
        said.push(greedy_chat(served.proxy, &format!("req-{i}"), &i.to_string()).await);
    }
    poll_until!("every pair compared", T, {
        let (_, text) = admin_get(served.admin, "/api/v1/shadow?window=1h").await;
        let report: Value = serde_json::from_str(&text).unwrap();
        let a = &report["classes"][0]["answers"];
        (a["pairs"].as_u64() == Some(n) && a["noise_pairs"].as_u64() == Some(n)).then_some(())
    });
    served.signal("-TERM");
    served.exited(T).unwrap();
    // The candidate's own words, asked directly (its answers do not vary).
    let candidate_addr: std::net::SocketAddr =
        candidate_url.trim_start_matches("http://").parse().unwrap();
    for i in 0..n {
        let words = greedy_chat(candidate_addr, &format!("direct-{i}"), &i.to_string()).await;
        assert_ne!(words, said[usize::try_from(i).unwrap()]);
        said.push(words);
    }
    let logs = format!("{}{}", served.stdout(), served.stderr());
    // The logs did see every side of every pair.
    for i in 0..n {
        for id in [
            format!("req-{i}"),
            format!("req-{i}:shadow"),
            format!("req-{i}:secondary"),
        ] {
            assert!(
                logs.contains(&format!("id={id} ")),
                "no line of {id}:\n{logs}"
            );
        }
    }
    assert_clean("logs", &logs, &said);
}

/// With `logprobs = true` the copies ask for the top 5 alternatives (the client's answer
/// has none), and vLLM's rule is applied between the candidate's and the secondary's
/// tokens: the same words are accepted with a KL divergence of 0; a candidate with other
/// words is not; and a candidate that differs from the primary only as the secondary
/// does is `close`.
#[tokio::test(flavor = "multi_thread")]
async fn with_logprobs_the_copies_tokens_are_held_to_vllms_rule() {
    let n = 6;
    let on = "logprobs = true";
    let (answers, proxy, said) = answers_with(
        varying_sim(1, 0.0),
        varying_sim(1, 0.0),
        varying_sim(1, 0.0),
        n,
        on,
    )
    .await;
    assert_eq!(answers["close_pairs"], n, "{answers:#}");
    assert_eq!(answers["close_rate"], 1.0, "{answers:#}");
    assert_eq!(answers["kl_mean"], 0.0, "{answers:#}");
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="same"}"#,
        6.0,
    )
    .await;
    assert_no_content(&proxy, &said).await;
    // Asked of the copies only: the client's answer carries none.
    let (status, body, _) = chat(&proxy, "plain").await;
    assert_eq!(status, 200);
    assert!(!String::from_utf8_lossy(&body).contains("top_logprobs"));
    proxy.shutdown().await;

    let (answers, proxy, _) = answers_with(
        varying_sim(1, 0.0),
        varying_sim(2, 0.0),
        varying_sim(1, 0.0),
        n,
        on,
    )
    .await;
    assert_eq!(answers["close_rate"], 0.0, "{answers:#}");
    assert_eq!(answers["verdict"], "fail", "{answers:#}");
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="differs"}"#,
        6.0,
    )
    .await;
    proxy.shutdown().await;

    // The primary says other words than both copies, which agree: the candidate's
    // difference is the primary's own.
    let (answers, proxy, _) = answers_with(
        varying_sim(3, 0.0),
        varying_sim(1, 0.0),
        varying_sim(1, 0.0),
        n,
        on,
    )
    .await;
    assert_eq!(answers["exact_match"], 0.0, "{answers:#}");
    assert_eq!(answers["noise_exact_match"], 0.0, "{answers:#}");
    assert_eq!(answers["close_rate"], 1.0, "{answers:#}");
    assert_eq!(answers["verdict"], "pass", "{answers:#}");
    metric_reaches(
        &proxy,
        r#"goodput_shadow_answer_pairs_total{result="close"}"#,
        6.0,
    )
    .await;
    proxy.shutdown().await;
}
