//! The proxies under test as child processes (`goodput serve`, Debian's nginx and HAProxy), what
//! `/proc` says about them (CPU time, resident memory), and their cleanup: every child is
//! registered when spawned and killed by its id on normal exit, on panic (the registry's
//! guard is dropped while unwinding) and on Ctrl-C/SIGTERM.

use std::{
    fs,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Children still running, by pid: how each one is stopped.
static CHILDREN: Mutex<Vec<(u32, Stop)>> = Mutex::new(Vec::new());

#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGKILL is enough: a single process.
    Kill,
    /// nginx: SIGTERM to the master, which stops its workers (a SIGKILL would orphan them).
    TermMaster,
}

/// Kills every registered child. Runs from `Cleanup::drop` and the signal handler.
pub fn kill_all() {
    let children = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(PoisonError::into_inner));
    for (pid, stop) in children {
        let signal = match stop {
            Stop::Kill => "-KILL",
            Stop::TermMaster => "-TERM",
        };
        let _ = Command::new("kill")
            .args([signal, &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// Kills the registered children when dropped, including while a panic unwinds.
pub struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_all();
    }
}

fn register(pid: u32, stop: Stop) {
    CHILDREN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((pid, stop));
}

fn unregister(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|(p, _)| *p != pid);
}

/// `N` distinct free loopback ports (all bound before any is released, so the kernel cannot
/// hand one out twice; the child binds them right after).
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr()?.port();
    }
    Ok(ports)
}

/// A proxy under test, running as a child process.
pub struct Proxy {
    pub name: &'static str,
    pub addr: SocketAddr,
    /// goodput's admin address (records, health).
    pub admin: Option<SocketAddr>,
    child: Child,
    stop: Stop,
}

impl Proxy {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process and, for nginx, its workers.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.pid()];
        pids.extend(children_of(self.pid()));
        pids
    }

    /// User + system CPU seconds of the process tree so far.
    pub fn cpu_seconds(&self) -> f64 {
        self.pids().into_iter().filter_map(cpu_seconds).sum()
    }

    /// Read and write system calls of the process tree so far (`/proc/PID/io`: `read`,
    /// `readv`, `write`, `writev`, ...; not `recvfrom`/`sendmsg`).
    pub fn io_calls(&self) -> (u64, u64) {
        self.pids()
            .into_iter()
            .filter_map(io_calls)
            .fold((0, 0), |(r, w), (a, b)| (r + a, w + b))
    }

    /// Resident memory of the process tree, bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.pids().into_iter().filter_map(rss_bytes).sum()
    }

    /// Stops the process (and nginx's workers) and waits for it.
    pub fn stop(mut self) {
        let pid = self.pid();
        let workers = children_of(pid);
        match self.stop {
            Stop::Kill => {
                let _ = self.child.kill();
            }
            Stop::TermMaster => {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for w in workers {
            if Path::new(&format!("/proc/{w}")).exists() {
                let _ = Command::new("kill")
                    .args(["-KILL", &w.to_string()])
                    .status();
            }
        }
        unregister(pid);
    }
}

/// `goodput serve` with the default configuration (full measurement, access log on) but
/// for its addresses, and client and upstream connection budgets above the 10,000 streams
/// of `streams-10k` (the defaults, 10,000 and 1,024, would turn some away, as nginx
/// configured for them never does);
/// logs go to `dir`. A build from before `upstream.max_connections` rejects the key.
/// `mode` is `serve`, or `plain-proxy` for the plain hyper proxy (`bin` is then this
/// benchmark's executable). `extra` is appended to the configuration (`--goodput-config`);
/// its keys of `[server]`, `[upstream]` and `[admin]` go into the generated tables.
pub fn start_goodput(
    bin: &Path,
    mode: &str,
    dir: &Path,
    upstream: SocketAddr,
    extra: &str,
) -> Result<Proxy> {
    let [port, admin_port] = free_ports()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let config = dir.join("goodput.toml");
    let (mut keys, rest) = split_tables(extra, &["server", "upstream", "admin"]);
    let mut keys_of = |table: &str| keys.remove(table).unwrap_or_default();
    let (server, upstream_keys, admin_keys) =
        (keys_of("server"), keys_of("upstream"), keys_of("admin"));
    fs::write(
        &config,
        format!(
            "# generated by benches/load: defaults but for the addresses and the connection budgets\n\
             [server]\nlisten = \"{addr}\"\nmax_connections = 16384\n{server}\
             [upstream]\nurl = \"http://{upstream}\"\nmax_connections = 16384\n{upstream_keys}\
             [admin]\nlisten = \"{admin}\"\n{admin_keys}{rest}"
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.args([mode, "--config"]).arg(&config);
    launch(
        "goodput",
        cmd,
        &dir.join("goodput.log"),
        addr,
        Some(admin),
        Stop::Kill,
    )
}

/// Runs `cmd` (output to `log`), registers it for cleanup and waits until it listens on
/// `addr` (and `admin`).
fn launch(
    name: &'static str,
    mut cmd: Command,
    log: &Path,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    stop: Stop,
) -> Result<Proxy> {
    let log = fs::File::create(log)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {name} ({:?})", cmd.get_program()))?;
    register(child.id(), stop);
    let mut proxy = Proxy {
        name,
        addr,
        admin,
        child,
        stop,
    };
    let addrs: Vec<SocketAddr> = std::iter::once(addr).chain(admin).collect();
    wait_listening(&mut proxy, &addrs)?;
    Ok(proxy)
}

/// The nginx binary, installing Debian's `nginx-light` when missing (as root only).
pub fn find_nginx() -> Option<PathBuf> {
    find_or_install("nginx", "nginx-light")
}

/// perf, for the system call counts, installing Debian's `linux-perf` when missing.
pub fn find_perf() -> Option<PathBuf> {
    find_or_install("perf", "linux-perf")
}

/// The HAProxy binary, installing Debian's `haproxy` when missing (as root only).
pub fn find_haproxy() -> Option<PathBuf> {
    find_or_install("haproxy", "haproxy")
}

fn find_or_install(name: &str, package: &str) -> Option<PathBuf> {
    let which = || {
        ["/usr/sbin", "/usr/bin", "/usr/local/sbin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
    };
    if let Some(p) = which() {
        return Some(p);
    }
    let root = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("load: {name} not found and not root: install {package} to compare with it");
        return None;
    }
    eprintln!("load: {name} not found; installing Debian's {package}");
    let ok = Command::new("sh")
        .args([
            "-c",
            &format!(
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package}"
            ),
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("load: installing {package} failed; the {name} path is skipped");
    }
    which()
}

/// HAProxy as a plain HTTP reverse proxy (9,000 connections: twice that in descriptors
/// stays under the usual hard limit of 20,000): one process with a thread per core, keep-alive
/// and connection reuse towards the upstream, responses forwarded as they come (HAProxy
/// does not buffer them; `http-buffer-request` is off by default), loopback only.
pub fn start_haproxy(bin: &Path, dir: &Path, upstream: SocketAddr) -> Result<Proxy> {
    let [port] = free_ports()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let conf = format!(
        "# generated by benches/load\n\
         global\n  maxconn 9000\n  nbthread {threads}\n\
         defaults\n  mode http\n  timeout connect 5s\n  timeout client 3600s\n  timeout server 3600s\n\
         frontend f\n  bind {addr}\n  default_backend b\n\
         backend b\n  http-reuse always\n  server s1 {upstream}\n"
    );
    let conf_path = dir.join("haproxy.cfg");
    fs::write(&conf_path, conf)?;
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(&conf_path);
    launch(
        "haproxy",
        cmd,
        &dir.join("haproxy.log"),
        addr,
        None,
        Stop::Kill,
    )
}

/// nginx as a streaming reverse proxy: buffering off, HTTP/1.1 keep-alive upstream,
/// loopback only, one worker per core, everything under `dir`; each worker can hold every
/// connection of `streams-10k` (nginx spreads them unevenly over its workers).
pub fn start_nginx(bin: &Path, dir: &Path, upstream: SocketAddr) -> Result<Proxy> {
    let [port] = free_ports()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let d = dir.display();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let conf = format!(
        "# generated by benches/load\n\
         worker_processes {workers};\n\
         worker_rlimit_nofile 65536;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 24576; }}\n\
         http {{\n\
           access_log {d}/nginx-access.log;\n\
           client_body_temp_path {d}/client_body;\n\
           proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi;\n\
           scgi_temp_path {d}/scgi;\n\
           keepalive_requests 1000000;\n\
           upstream sim {{ server {upstream}; keepalive 1024; }}\n\
           server {{\n\
             listen {addr};\n\
             location / {{\n\
               proxy_pass http://sim;\n\
               proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\";\n\
               proxy_buffering off;\n\
               proxy_request_buffering off;\n\
               proxy_read_timeout 3600s;\n\
             }}\n\
           }}\n\
         }}\n"
    );
    let conf_path = dir.join("nginx.conf");
    fs::write(&conf_path, conf)?;
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .args(["-g", "daemon off;"]);
    let proxy = launch(
        "nginx",
        cmd,
        &dir.join("nginx-stderr.log"),
        addr,
        None,
        Stop::TermMaster,
    )?;
    // The workers start right after the master binds.
    let deadline = Instant::now() + Duration::from_secs(5);
    while children_of(proxy.pid()).len() < workers && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(proxy)
}

fn wait_listening(proxy: &mut Proxy, addrs: &[SocketAddr]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = proxy.child.try_wait() {
            bail!("{} exited at start ({status}); see its log", proxy.name);
        }
        let up = addrs
            .iter()
            .all(|a| std::net::TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok());
        if up {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} did not start listening on {addrs:?}", proxy.name);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Direct children of `pid` (nginx's workers).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            stat_fields(&format!("/proc/{p}/stat")).and_then(|f| field(&f, 4)) == Some(pid.into())
        })
        .collect()
}

/// The fields of a `/proc/.../stat` line after the command name, numbered as in proc(5)
/// (field 3 is the state).
fn stat_fields(path: &str) -> Option<Vec<String>> {
    let s = fs::read_to_string(path).ok()?;
    let after = s.rsplit_once(')')?.1;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

fn field(fields: &[String], n: usize) -> Option<u64> {
    fields.get(n.checked_sub(3)?)?.parse().ok()
}

/// Clock ticks per second of `/proc` CPU times (USER_HZ; 100 on Linux unless told else).
fn ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// utime + stime of a process or a thread (`/proc/PID/task/TID/stat`), seconds.
pub fn cpu_seconds_at(stat_path: &str) -> Option<f64> {
    let f = stat_fields(stat_path)?;
    Some((field(&f, 14)? + field(&f, 15)?) as f64 / ticks_per_second())
}

pub fn cpu_seconds(pid: u32) -> Option<f64> {
    cpu_seconds_at(&format!("/proc/{pid}/stat"))
}

fn io_calls(pid: u32) -> Option<(u64, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let get = |key: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .parse()
            .ok()
    };
    Some((get("syscr:")?, get("syscw:")?))
}

/// VmRSS of a process, bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU seconds of this process, split into the load client (everything but the
/// simulator) and the in-process simulator (its runtime's threads are named `sim`).
pub fn own_cpu_split() -> (f64, f64) {
    let total = cpu_seconds_at("/proc/self/stat").unwrap_or(0.0);
    let mut sim = 0.0;
    if let Ok(tasks) = fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let p = t.path();
            let comm = fs::read_to_string(p.join("comm")).unwrap_or_default();
            if comm.starts_with("sim") {
                sim += cpu_seconds_at(&p.join("stat").to_string_lossy()).unwrap_or(0.0);
            }
        }
    }
    (total - sim, sim)
}

/// Busy and total jiffies of the whole machine (`/proc/stat` cpu line).
pub fn machine_jiffies() -> (u64, u64) {
    let s = fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    // idle + iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// The lines of `toml` under each of `tables` (by name), and the rest of it.
fn split_tables(
    toml: &str,
    tables: &[&str],
) -> (std::collections::HashMap<String, String>, String) {
    let mut keys = std::collections::HashMap::new();
    let mut rest = String::new();
    let mut current: Option<String> = None;
    for line in toml.lines() {
        let header = line.trim();
        if header.starts_with('[') {
            let name = header.trim_matches(|c| c == '[' || c == ']').trim();
            current = tables.contains(&name).then(|| name.to_owned());
            if current.is_some() {
                continue;
            }
        }
        let out: &mut String = match &current {
            Some(name) => keys.entry(name.clone()).or_default(),
            None => &mut rest,
        };
        out.push_str(line);
        out.push('\n');
    }
    (keys, rest)
}
