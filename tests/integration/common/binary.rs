//! The real `goodput serve` binary as a child process. It binds the ports it is given, and
//! `127.0.0.1:0` is the usual choice: the addresses it really bound are read back from its
//! start-up line (`goodput serving proxy=… admin=…`), which it logs once its listeners are
//! bound and its signal handlers installed. No test guesses a free port or waits on the
//! clock hoping the process is up.
#![expect(
    clippy::unwrap_used,
    reason = "test support: a failed set-up must stop the test"
)]

use std::{
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::Duration,
};

/// A running `goodput serve`; killed if the test ends without stopping it.
pub struct Serving {
    pub child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Serving {
    /// Spawns `cmd` (a `goodput serve …` command; its stdout and stderr are taken over and
    /// kept) and waits up to `wait` for the start-up line. The error says why it did not
    /// come up, with what it printed.
    pub fn start(mut cmd: Command, wait: Duration) -> Result<Serving, String> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let readers = vec![
            keep(child.stdout.take().unwrap(), Arc::clone(&stdout), None),
            keep(child.stderr.take().unwrap(), Arc::clone(&stderr), Some(tx)),
        ];
        let started = match rx.recv_timeout(wait) {
            Ok(line) => addresses(&line).ok_or_else(|| format!("no addresses in {line:?}")),
            Err(_) => Err(format!(
                "goodput serve did not say it was serving within {wait:?}"
            )),
        };
        let mut serving = Serving {
            child,
            proxy: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: SocketAddr::from(([0, 0, 0, 0], 0)),
            stdout,
            stderr,
            readers,
        };
        match started {
            Ok((proxy, admin)) => {
                serving.proxy = proxy;
                serving.admin = admin;
                Ok(serving)
            }
            Err(e) => {
                let _ = serving.child.kill();
                let _ = serving.child.wait();
                Err(format!("{e}; stderr:\n{}", serving.stderr()))
            }
        }
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits up to `within` for the process to exit, then for the last of its output.
    pub fn exited(&mut self, within: Duration) -> Result<ExitStatus, String> {
        let mut failed = None;
        let status = super::wait::blocking(within, || match self.child.try_wait() {
            Ok(status) => status,
            Err(e) => {
                failed = Some(e.to_string());
                Some(std::process::ExitStatus::default())
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let Some(status) = status else {
            return Err(format!("goodput did not exit within {within:?}"));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        Ok(status)
    }

    /// Sends `signal` (as `kill` names it: `-TERM`, `-STOP`, …).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} failed");
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Copies what `from` writes into `into` line by line on a thread of its own (so the pipe
/// never fills), handing the start-up line to `startup` when it comes.
fn keep(
    from: impl Read + Send + 'static,
    into: Arc<Mutex<String>>,
    startup: Option<mpsc::Sender<String>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if let Some(tx) = &startup
                && line.contains("goodput serving")
            {
                let _ = tx.send(line.clone());
            }
            let mut kept = into.lock().unwrap();
            kept.push_str(&line);
            kept.push('\n');
        }
    })
}

/// The proxy and admin addresses of a start-up line, in the text or the JSON log format.
fn addresses(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let plain = strip_ansi(line);
    Some((field(&plain, "proxy")?, field(&plain, "admin")?))
}

fn field(line: &str, name: &str) -> Option<SocketAddr> {
    let text = format!("{name}=");
    let json = format!("\"{name}\":\"");
    let start = line
        .find(&text)
        .map(|i| i + text.len())
        .or_else(|| line.find(&json).map(|i| i + json.len()))?;
    let rest = &line[start..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"' || c == ',')
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The line without terminal colour codes (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn addresses_are_read_from_either_log_format() {
    let text = "2026-12-05T08:00:00Z  INFO goodput::run: goodput serving proxy=127.0.0.1:4100 \
                admin=127.0.0.1:4101 dashboard=http://127.0.0.1:4101/ tls=false";
    let json = r#"{"fields":{"message":"goodput serving","proxy":"127.0.0.1:4100","admin":"127.0.0.1:4101"}}"#;
    let coloured = "\u{1b}[3mproxy\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:4100 \u{1b}[3madmin\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:4101";
    let want = Some((
        "127.0.0.1:4100".parse().unwrap(),
        "127.0.0.1:4101".parse().unwrap(),
    ));
    for line in [text, json, coloured] {
        assert_eq!(addresses(line), want, "{line}");
    }
    assert_eq!(addresses("goodput serving"), None);
}
