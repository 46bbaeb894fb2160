//! The pooled upstream client: keep-alive connections, HTTP/1.1 or HTTP/2 (prior
//! knowledge for `http://`, ALPN for `https://`), TLS by rustls with the configured roots.

use std::time::Duration;

use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};

use super::request_body::ClientBody;
use crate::{config::Upstream, measure::RequestTap, usage_injection::ForwardBody};

pub type UpstreamClient =
    Client<HttpsConnector<HttpConnector>, ForwardBody<ClientBody<RequestTap<Incoming>>>>;

pub fn build(cfg: &Upstream) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let tls = (*cfg.tls).clone();
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let connector = if cfg.http2 {
        builder.enable_all_versions().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    };
    let mut client = Client::builder(TokioExecutor::new());
    client
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(cfg.pool_idle_timeout)
        .pool_max_idle_per_host(cfg.pool_max_idle_per_host);
    if cfg.http2 && cfg.scheme == http::uri::Scheme::HTTP {
        client.http2_only(true);
    }
    client.build(connector)
}
