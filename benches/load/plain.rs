//! A plain hyper reverse proxy that measures nothing: the reference for what the engine
//! goodput is built on costs by itself. `--plain-hyper` runs it in goodput's place
//! (docs/PERFORMANCE.md).
//!
//! It is a proxy as hyper's documentation builds one: hyper's HTTP/1 server, hyper-util's
//! pooled client (each upstream connection a task of its own, response chunks handed to
//! the client connection's task over hyper's body channel), with goodput's socket
//! settings (`TCP_NODELAY` both ways, keep-alive to the upstream). Every request goes to
//! the upstream with its path and headers; the response streams back frame by frame,
//! unbuffered. Nothing is timed, decoded or recorded.
//!
//! It reads the configuration file the benchmark writes for goodput (`[server] listen`,
//! `[upstream] url`, `[admin] listen`); the admin address accepts connections and closes
//! them, so that the benchmark's start-up check finds it listening.

use std::{convert::Infallible, net::SocketAddr, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use serde::Deserialize;
use tokio::net::TcpListener;

#[derive(Deserialize)]
struct Config {
    server: Listen,
    upstream: Upstream,
    admin: Listen,
}

#[derive(Deserialize)]
struct Listen {
    listen: SocketAddr,
}

#[derive(Deserialize)]
struct Upstream {
    url: String,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// Serves until the process is killed; returns only when it cannot start.
pub fn main(config: &Path) -> Result<()> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let cfg: Config = toml::from_str(&text).context("not a goodput config")?;
    let upstream: Uri = cfg.upstream.url.parse().context("[upstream] url")?;
    let authority = upstream
        .authority()
        .context("[upstream] url has no host")?
        .clone();
    // As goodput's default: one worker thread per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(cfg.server.listen).await?;
        let admin = TcpListener::bind(cfg.admin.listen).await?;
        tokio::spawn(async move {
            while let Ok((conn, _)) = admin.accept().await {
                drop(conn);
            }
        });
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build(connector);
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let client = client.clone();
            let authority = authority.clone();
            tokio::spawn(async move {
                let service =
                    service_fn(move |req| forward(client.clone(), authority.clone(), req));
                let served = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    eprintln!("plain proxy: connection: {e}");
                }
            });
        }
    })
}

/// The request to the upstream, its response back; 502 when the upstream fails.
async fn forward(
    client: Client<HttpConnector, Incoming>,
    authority: http::uri::Authority,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let uri = Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build();
    match uri {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    }
    match client.request(req).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(e) => {
            eprintln!("plain proxy: upstream: {e}");
            Ok(status(StatusCode::BAD_GATEWAY))
        }
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = code;
    resp
}
