//! The three paths a scenario measures (direct to the simulator, through nginx, through
//! goodput), the in-process simulator they all lead to, and the order rounds visit them in.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use goodput::sim::{Sim, SimConfig};
use tokio::runtime::Handle;

use crate::procs::{self, Proxy};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathKind {
    Direct,
    Nginx,
    Goodput,
    /// Measured in the `requests` scenario only (not in [`PathKind::ALL`]).
    Haproxy,
}

impl PathKind {
    pub const ALL: [PathKind; 3] = [PathKind::Direct, PathKind::Nginx, PathKind::Goodput];

    pub fn name(self) -> &'static str {
        match self {
            PathKind::Direct => "direct",
            PathKind::Nginx => "nginx",
            PathKind::Goodput => "goodput",
            PathKind::Haproxy => "haproxy",
        }
    }
}

/// What every scenario needs: the run's settings and where the binaries are.
pub struct Env {
    pub quick: bool,
    pub rounds: usize,
    /// Clients ask for `stream_options.include_usage`.
    pub usage: bool,
    pub goodput_bin: PathBuf,
    /// goodput's path runs the plain hyper proxy (`goodput_bin` is this executable).
    pub plain: bool,
    /// TOML appended to goodput's generated configuration (`--goodput-config`).
    pub goodput_config: String,
    pub nginx_bin: Option<PathBuf>,
    /// Looked up (installed when missing) only when the `requests` scenario runs.
    pub haproxy_bin: Option<PathBuf>,
    /// Generated configs and the proxies' logs.
    pub dir: PathBuf,
    /// The simulator's own runtime (threads named `sim`), apart from the client's.
    pub sim_rt: Handle,
}

impl Env {
    /// Starts an in-process simulator with `cfg` on a loopback port.
    pub fn start_sim(&self, cfg: SimConfig) -> Result<(Sim, SocketAddr)> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let sim = Sim::new(cfg);
        let serving = sim.clone();
        self.sim_rt.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => {
                    if let Err(e) = serving.serve(l, std::future::pending()).await {
                        eprintln!("load: simulator stopped: {e}");
                    }
                }
                Err(e) => eprintln!("load: simulator cannot listen: {e}"),
            }
        });
        Ok((sim, addr))
    }

    fn sub_dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.dir.join(name);
        std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        Ok(d)
    }

    /// Starts one proxy of `kind` in front of `upstream` (`None` for direct, or when nginx
    /// is unavailable).
    pub fn start_proxy(
        &self,
        kind: PathKind,
        upstream: SocketAddr,
        tag: &str,
    ) -> Result<Option<Proxy>> {
        let dir = self.sub_dir(&format!("{tag}-{}", kind.name()))?;
        tokio::task::block_in_place(|| match kind {
            PathKind::Direct => Ok(None),
            PathKind::Goodput => {
                let mode = if self.plain { "plain-proxy" } else { "serve" };
                procs::start_goodput(
                    &self.goodput_bin,
                    mode,
                    &dir,
                    upstream,
                    &self.goodput_config,
                )
                .map(Some)
            }
            PathKind::Nginx => match &self.nginx_bin {
                Some(bin) => start_nginx_or_warn(bin, &dir, upstream),
                None => Ok(None),
            },
            PathKind::Haproxy => match &self.haproxy_bin {
                Some(bin) => match procs::start_haproxy(bin, &dir, upstream) {
                    Ok(p) => Ok(Some(p)),
                    Err(e) => {
                        eprintln!("load: haproxy did not start ({e:#}); its path is skipped");
                        Ok(None)
                    }
                },
                None => Ok(None),
            },
        })
    }

    /// Starts all three paths in front of `upstream`.
    pub fn start_paths(&self, upstream: SocketAddr, tag: &str) -> Result<Paths> {
        Ok(Paths {
            direct: upstream,
            nginx: self.start_proxy(PathKind::Nginx, upstream, tag)?,
            goodput: self
                .start_proxy(PathKind::Goodput, upstream, tag)?
                .context("goodput did not start")?,
        })
    }
}

fn start_nginx_or_warn(bin: &Path, dir: &Path, upstream: SocketAddr) -> Result<Option<Proxy>> {
    match procs::start_nginx(bin, dir, upstream) {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            eprintln!("load: nginx did not start ({e:#}); its path is skipped");
            Ok(None)
        }
    }
}

/// The running paths of one scenario.
pub struct Paths {
    pub direct: SocketAddr,
    pub nginx: Option<Proxy>,
    pub goodput: Proxy,
}

impl Paths {
    pub fn kinds(&self) -> Vec<PathKind> {
        PathKind::ALL
            .into_iter()
            .filter(|k| *k != PathKind::Nginx || self.nginx.is_some())
            .collect()
    }

    pub fn addr(&self, kind: PathKind) -> SocketAddr {
        match kind {
            PathKind::Direct => self.direct,
            PathKind::Nginx => self.nginx.as_ref().map_or(self.direct, |p| p.addr),
            PathKind::Goodput => self.goodput.addr,
            // Not one of a scenario's three paths.
            PathKind::Haproxy => self.direct,
        }
    }

    pub fn proxy(&self, kind: PathKind) -> Option<&Proxy> {
        match kind {
            PathKind::Direct => None,
            PathKind::Nginx => self.nginx.as_ref(),
            PathKind::Goodput => Some(&self.goodput),
            PathKind::Haproxy => None,
        }
    }

    pub fn stop(self) {
        tokio::task::block_in_place(|| {
            if let Some(n) = self.nginx {
                n.stop();
            }
            self.goodput.stop();
        });
    }
}

/// Round `r` visits the paths rotated by `r`, so no path is always first or last.
pub fn rotate<T: Copy>(items: &[T], r: usize) -> Vec<T> {
    let n = items.len().max(1);
    (0..items.len())
        .filter_map(|i| items.get((i + r) % n).copied())
        .collect()
}
