//! Configuration hot reload: a valid file is swapped in for new requests while streams in
//! flight finish on what they started with; an invalid file or a restart-only change keeps
//! the running configuration and is counted.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed set-up must stop the test"
)]

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::common::{
    fake::{FakeUpstream, Script},
    harness::*,
    temp::TempDir,
};
use goodput::{
    config::{self, Overrides},
    run::{self, ConfigSource, ReloadError},
};

const T: Duration = Duration::from_secs(5);

/// `text` as `goodput.toml` in a directory of its own, returned with the file's path: the
/// directory goes when the test drops it.
fn temp_config(name: &str, text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(name);
    let path = dir.write("goodput.toml", text).unwrap();
    (dir, path)
}

fn file_text(upstream: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [upstream]\nurl = \"{upstream}\"\n[log]\naccess_log = false\n{extra}"
    )
}

async fn start_reloadable(path: &Path) -> run::Running {
    let overrides = Overrides::default();
    let cfg = config::load(Some(path), &overrides).unwrap();
    run::start_from(
        cfg,
        Some(ConfigSource {
            path: path.to_path_buf(),
            overrides,
        }),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_valid_file_switches_new_requests_and_spares_streams_in_flight() {
    let (_sim, sim_url) = start_sim(fast_sim(5.0, 20.0)).await;
    let other = FakeUpstream::start(Script::response(
        200,
        &[("content-type", "application/json")],
        b"{\"from\":\"other\"}",
    ))
    .await;
    let (_dir, path) = temp_config("switch", &file_text(&sim_url, ""));
    let proxy = start_reloadable(&path).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let client = client();

    // A 30-token stream (~600 ms) is in flight when the upstream changes.
    let in_flight = post(&client, &url, chat_body(true, 30, true)).await;
    std::fs::write(&path, file_text(&other.url(), "")).unwrap();
    proxy.reloader.as_ref().unwrap().reload().unwrap();

    let (status, body) = post_collect(&client, &url, chat_body(false, 4, false)).await;
    assert_eq!((status, &body[..]), (200, &b"{\"from\":\"other\"}"[..]));
    use http_body_util::BodyExt;
    let streamed = in_flight.into_body().collect().await.unwrap().to_bytes();
    assert!(
        streamed.ends_with(b"data: [DONE]\n\n"),
        "the stream in flight was cut"
    );
    let text = metrics(proxy.admin_addr).await;
    assert_eq!(
        metric_value(&text, "goodput_config_reloads_total"),
        Some(1.0),
        "{text}"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_file_keeps_the_running_config() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let (_dir, path) = temp_config("invalid", &file_text(&sim_url, ""));
    let proxy = start_reloadable(&path).await;
    std::fs::write(&path, "[upstream]\nurl = \"ftp://nope\"\nbogus = 1\n").unwrap();
    let err = proxy.reloader.as_ref().unwrap().reload().unwrap_err();
    assert!(matches!(err, ReloadError::Invalid(_)), "{err}");
    std::fs::write(&path, file_text("ftp://nope", "")).unwrap();
    let err = proxy.reloader.as_ref().unwrap().reload().unwrap_err();
    assert!(err.to_string().contains("upstream.url"), "{err}");

    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let (status, body) = post_collect(&client(), &url, chat_body(true, 3, false)).await;
    assert_eq!(status, 200);
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let text = metrics(proxy.admin_addr).await;
    // The file watcher may have refused the same files once more on its own.
    let failures = metric_value(&text, "goodput_config_reload_failures_total").unwrap();
    assert!(failures >= 2.0, "{text}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_only_settings_are_refused_by_name() {
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let (_dir, path) = temp_config("restart", &file_text(&sim_url, ""));
    let proxy = start_reloadable(&path).await;
    let moved = file_text(&sim_url, "").replace(
        "[server]\nlisten = \"127.0.0.1:0\"",
        "[server]\nlisten = \"127.0.0.1:1\"\ndrain_timeout = \"1s\"",
    );
    std::fs::write(&path, moved).unwrap();
    let err = proxy.reloader.as_ref().unwrap().reload().unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("server.listen") && msg.contains("server.drain_timeout"),
        "{msg}"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn slo_classes_change_live_and_the_file_is_watched() {
    let (_sim, sim_url) = start_sim(fast_sim(20.0, 1.0)).await;
    let (_dir, path) = temp_config("watch", &file_text(&sim_url, ""));
    let proxy = start_reloadable(&path).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    post_collect(&client(), &url, chat_body(true, 3, true)).await;
    let recs = wait_records(proxy.admin_addr, 1, T).await;
    assert_eq!(
        (recs[0]["slo_class"].as_str(), recs[0]["slo_met"].as_bool()),
        (Some("default"), Some(true))
    );

    // A class whose TTFT target the simulator's 20 ms cannot meet; picked up by the watcher
    // (no explicit reload call). The watcher compares the file's content, so a write within
    // the same second as the last one is seen.
    let strict = "[[slo.class]]\nname = \"strict\"\nmatch = { model = \"test-*\" }\nttft_ms = 5\n";
    std::fs::write(&path, file_text(&sim_url, strict)).unwrap();
    let mut sent = 1;
    poll_loop!(
        deadline = tokio::time::Instant::now() + Duration::from_secs(6),
        {
            post_collect(&client(), &url, chat_body(true, 3, true)).await;
            sent += 1;
            let recs = wait_records(proxy.admin_addr, sent, T).await;
            let last = recs.last().unwrap();
            if last["slo_class"] == "strict" {
                assert_eq!(last["slo_met"], false);
                assert_eq!(last["slo_miss_reason"], "ttft");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the watcher never reloaded"
            );
        }
    );
    proxy.shutdown().await;
}

/// A Kubernetes ConfigMap volume: the file is a symlink through `..data`, itself a symlink
/// to a timestamped directory; an update writes a new directory and renames a new `..data`
/// link over the old one. The watcher follows the links and reloads.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_configmap_symlink_swap_is_reloaded() {
    use std::os::unix::fs::symlink;
    let (_sim, sim_url) = start_sim(fast_sim(1.0, 1.0)).await;
    let dir = TempDir::new("configmap");
    let root = dir.path();
    let version = |name: &str, text: &str| {
        std::fs::create_dir(root.join(name)).unwrap();
        std::fs::write(root.join(name).join("goodput.toml"), text).unwrap();
    };
    version("..2026_12_04_20_00_00.1", &file_text(&sim_url, ""));
    symlink("..2026_12_04_20_00_00.1", root.join("..data")).unwrap();
    symlink("..data/goodput.toml", root.join("goodput.toml")).unwrap();
    let proxy = start_reloadable(&root.join("goodput.toml")).await;
    let reloads = |text: &str| metric_value(text, "goodput_config_reloads_total");
    assert_eq!(reloads(&metrics(proxy.admin_addr).await), Some(0.0));

    let strict = "[[slo.class]]\nname = \"strict\"\nmatch = { model = \"test-*\" }\nttft_ms = 5\n";
    version("..2026_12_04_20_01_00.2", &file_text(&sim_url, strict));
    symlink("..2026_12_04_20_01_00.2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(root.join("..2026_12_04_20_00_00.1")).unwrap();

    poll_loop!(
        deadline = tokio::time::Instant::now() + Duration::from_secs(6),
        {
            let text = metrics(proxy.admin_addr).await;
            if reloads(&text) == Some(1.0) {
                assert_eq!(
                    metric_value(&text, "goodput_config_reload_failures_total"),
                    Some(0.0),
                    "{text}"
                );
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the swap was not reloaded: {text}"
            );
        }
    );
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    post_collect(&client(), &url, chat_body(true, 3, true)).await;
    let recs = wait_records(proxy.admin_addr, 1, T).await;
    assert_eq!(recs[0]["slo_class"], "strict");
    proxy.shutdown().await;
}
