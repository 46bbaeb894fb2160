//! Secrecy: prompts and answers never reach metrics, the API or the logs.

use super::*;
use crate::common::binary::Serving;

/// The secrets found in `text`.
fn leaked(text: &str) -> Vec<&'static str> {
    SECRETS.into_iter().filter(|s| text.contains(s)).collect()
}

/// Sends a streamed and a non-streamed chat with every secret; returns the request ids.
async fn send_secrets(proxy: SocketAddr, tag: &str) -> anyhow::Result<Vec<String>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{proxy}{CHAT}");
    let mut ids = Vec::new();
    for stream in [true, false] {
        let id = format!("{tag}-{}", if stream { "stream" } else { "full" });
        let body = chat_body(stream, 8, stream);
        ensure!(
            body.contains("SECRET-PROMPT-TEXT"),
            "the prompt must carry the secret"
        );
        let resp = send(&client, chat_request(&uri, &id, body)?).await?;
        ensure!(
            resp.status == StatusCode::OK,
            "{id}: {} {}",
            resp.status,
            resp.text()
        );
        ids.push(id);
    }
    Ok(ids)
}

/// Checks that `/metrics` and the API hold records for `ids` and none of the secrets.
async fn admin_is_clean(admin: SocketAddr, ids: &[String]) -> anyhow::Result<()> {
    records_by_id(admin, ids, Duration::from_secs(5)).await?;
    for path in ["/metrics", "/api/v1/requests?limit=1000"] {
        let (status, text) = http_get(admin, path).await?;
        ensure!(status == StatusCode::OK, "{path}: {status}");
        ensure!(
            leaked(&text).is_empty(),
            "{path} leaks {:?}:\n{text}",
            leaked(&text)
        );
    }
    Ok(())
}

#[test]
fn secrets_never_reach_metrics_or_the_api_in_process() {
    light(async {
        let events = openai_chat_events(8, true);
        let upstream = FakeUpstream::start(Script::sse_chunked(
            &events,
            WritePlan::Whole,
            Duration::ZERO,
        ))
        .await;
        let proxy = start_proxy(&upstream.url()).await;
        let ids = send_secrets(proxy.proxy_addr, "inproc").await.unwrap();
        // Credentials are the gateway's business: they pass through untouched.
        let seen = upstream.wait_requests(2, Duration::from_secs(5)).await;
        for r in &seen {
            assert_eq!(r.header("authorization"), Some("Bearer SECRET-API-KEY"));
            assert_eq!(r.header("x-api-key"), Some("SECRET-X-API-KEY"));
            assert_eq!(r.header("api-key"), Some("SECRET-API-KEY-2"));
            assert_eq!(r.header("cookie"), Some("session=SECRET-COOKIE"));
            assert!(r.body_text().contains("SECRET-PROMPT-TEXT"));
        }
        admin_is_clean(proxy.admin_addr, &ids).await.unwrap();
        proxy.shutdown().await;
    });
}

/// Starts the real binary in front of `upstream` on ports it binds itself.
fn serve_binary(upstream: &str, config: Option<&Path>) -> anyhow::Result<Serving> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_goodput"));
    cmd.arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--upstream", upstream])
        .env_remove("RUST_LOG");
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    Serving::start(cmd, Duration::from_secs(20)).map_err(|e| anyhow!(e))
}

/// SIGTERM, then waits for a clean exit; returns (stdout, stderr).
async fn terminate(mut served: Serving) -> anyhow::Result<(String, String)> {
    served.signal("-TERM");
    let exit = tokio::task::spawn_blocking(move || {
        let exit = served.exited(Duration::from_secs(20));
        exit.map(|exit| (exit, served))
    })
    .await?
    .map_err(|e| anyhow!(e))?;
    let (exit, served) = exit;
    ensure!(exit.success(), "goodput exited with {exit} after SIGTERM");
    Ok((served.stdout(), served.stderr()))
}

#[test]
fn secrets_never_reach_the_logs_of_the_real_binary_text_and_json() {
    light(async {
        let (_sim, upstream) = start_sim(fast_sim(5.0, 1.0)).await;
        let dir = TempDir::new("secrecy");

        // Text logs, flags only, defaults: level info, access log on.
        let served = serve_binary(&upstream, None).unwrap();
        let ids = send_secrets(served.proxy, "sec-text").await.unwrap();
        admin_is_clean(served.admin, &ids).await.unwrap();
        let (stdout, stderr) = terminate(served).await.unwrap();
        let logs = format!("{stdout}\n{stderr}");
        assert!(
            leaked(&logs).is_empty(),
            "text logs leak {:?}:\n{logs}",
            leaked(&logs)
        );
        // Written to a file, not a terminal: plain text that `grep id=...` finds.
        assert!(
            !logs.contains('\u{1b}'),
            "colour escapes in a log file:\n{logs}"
        );
        for id in &ids {
            let line = logs
                .lines()
                .find(|l| l.contains("goodput::access") && l.contains(&format!("id={id} ")))
                .unwrap_or_else(|| panic!("no access line for {id}:\n{logs}"));
            assert!(
                line.contains("outcome=\"ok\"") && line.contains("output_tokens=8"),
                "{line}"
            );
        }

        // JSON logs, from a config file.
        let config = dir
            .write("json.toml", "[log]\nformat = \"json\"\n")
            .unwrap();
        let served = serve_binary(&upstream, Some(&config)).unwrap();
        let ids = send_secrets(served.proxy, "sec-json").await.unwrap();
        admin_is_clean(served.admin, &ids).await.unwrap();
        let (stdout, stderr) = terminate(served).await.unwrap();
        let logs = format!("{stdout}\n{stderr}");
        assert!(
            leaked(&logs).is_empty(),
            "JSON logs leak {:?}:\n{logs}",
            leaked(&logs)
        );
        let lines: Vec<Value> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        for id in &ids {
            let line = lines
                .iter()
                .find(|v| v["target"] == "goodput::access" && v["id"] == id.as_str())
                .unwrap_or_else(|| panic!("no access line for {id}:\n{stderr}"));
            assert_eq!(line["outcome"], "ok", "{line}");
            assert_eq!(line["output_tokens"], 8, "{line}");
        }
    });
}
