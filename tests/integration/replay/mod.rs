//! `goodput replay` end to end over loopback, a module per concern: the steps, trace,
//! ramp and soak modes against the in-process simulator ([`steps`]), the engine's metrics
//! and cost in the report ([`attribution`]), profile filtering ([`filter`]), abnormal input
//! and bursts ([`inject`]), the request log ([`log`]), the comparison matrix ([`matrix`]),
//! quality probes and repeats ([`quality`]), recovery from a fault ([`recovery`]) and
//! tenants and models ([`tenants`]), the gates, reproducibility and GPU telemetry
//! ([`gates`]), decisions that cannot mislead ([`decisions`]), the engine hosts'
//! node_exporter ([`host`]), like compared only with like
//! ([`like`]), and one run answering all of them ([`acceptance`]). Replays are timing-sensitive: each takes
//! [`crate::common::SERIAL`] so that two never run at once.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "integration tests: a failed step must stop the test"
)]

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Parser;
use goodput::replay::ReplayArgs;
use serde_json::Value;

mod acceptance;
mod attribution;
mod decisions;
mod filter;
mod gates;
mod host;
mod inject;
mod like;
mod limits;
mod log;
mod matrix;
mod quality;
mod recovery;
mod steps;
mod tenants;

/// `goodput replay`'s flags, parsed as the command line does.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ReplayArgs,
}

/// The replay arguments of a command line (`--quiet` added).
fn args(list: &[&str]) -> ReplayArgs {
    let mut all = vec!["replay", "--quiet"];
    all.extend_from_slice(list);
    Cli::try_parse_from(all).unwrap().args
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A profile's header line (docs/PROFILE.md) with the given `contract` object.
fn header(contract: &str) -> String {
    format!(
        r#"{{"type":"header","format":"goodput-profile","version":1,"started_at":"2026-01-01T00:00:00.000Z","salt_id":"5a1700000000beef","goodput_version":"0.1.0","block":{{"unit":"bytes","size":2048}},"contract":{contract}}}"#
    )
}

/// A streamed chat request line sent at `t_ms`; `extra` adds fields (`,"hash_ids":[1]`).
fn request(t_ms: u64, model: &str, input: u64, output: u64, class: &str, extra: &str) -> String {
    format!(
        r#"{{"t_ms":{t_ms},"model":"{model}","api":"chat_completions","stream":true,"input_tokens":{input},"input_tokens_source":"usage","output_tokens":{output},"output_tokens_source":"usage","max_tokens":null,"outcome":"ok","status":200,"slo_class":"{class}","slo_met":true,"ttft_ms":20.0,"tpot_ms":2.0,"e2e_ms":40.0{extra}}}"#
    )
}

/// Writes `dir/profile.jsonl` from its lines.
fn write_lines(dir: &Path, lines: &[String]) -> PathBuf {
    let path = dir.join("profile.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Twenty streamed chat requests of 300 input and `output` tokens, 50 ms apart, in
/// `class`; each with a prompt block of its own when `blocks`.
fn twenty_requests(dir: &Path, output: u64, class: &str, blocks: bool) -> PathBuf {
    let mut lines = vec![header("{}")];
    for i in 0..20 {
        let extra = if blocks {
            format!(r#","hash_ids":[{}]"#, i + 1)
        } else {
            String::new()
        };
        lines.push(request(i * 50, "sim-model", 300, output, class, &extra));
    }
    write_lines(dir, &lines)
}

/// A `goodput sim` process on a fixed loopback port, started by `start.sh` (which the
/// fault command runs again); killed when dropped.
pub(super) struct SimProcess {
    dir: PathBuf,
    port: u16,
}

impl SimProcess {
    pub(super) fn start(dir: &Path, extra: &str) -> SimProcess {
        // A free port: bound at :0 and released for the simulator to take.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = format!(
            "'{}' sim --listen 127.0.0.1:{port} --ttft fixed:20 --itl fixed:2 \
             --output-tokens fixed:10 {extra} >>'{}/sim.log' 2>&1 &\necho $! >'{}/sim.pid'\n",
            env!("CARGO_BIN_EXE_goodput"),
            dir.display(),
            dir.display()
        );
        std::fs::write(dir.join("start.sh"), script).unwrap();
        let sim = SimProcess {
            dir: dir.to_owned(),
            port,
        };
        let ok = std::process::Command::new("sh")
            .arg(dir.join("start.sh"))
            .status()
            .unwrap()
            .success();
        assert!(ok, "start.sh failed");
        sim
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the simulator accepts connections (it binds before answering).
    pub(super) async fn ready(&self) {
        let listening = async {
            poll_until!("the simulator to listen", Duration::from_secs(30), {
                tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .ok()
            })
        };
        if tokio::time::timeout(Duration::from_secs(31), listening)
            .await
            .is_ok()
        {
            return;
        }
        panic!(
            "the simulator never listened: {}",
            std::fs::read_to_string(self.dir.join("sim.log")).unwrap_or_default()
        );
    }

    /// Kills the current process and, with `restart`, starts a new one on the same port
    /// after a second without any.
    pub(super) fn fault_cmd(&self, restart: bool) -> String {
        let d = self.dir.display();
        let mut cmd = format!("kill -9 $(cat '{d}/sim.pid')");
        if restart {
            cmd.push_str(&format!("; sleep 1; sh '{d}/start.sh'"));
        }
        cmd
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("sim.pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-9", pid.trim()])
                .status();
        }
    }
}
