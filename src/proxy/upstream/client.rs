//! The pooled upstream client: keep-alive connections, HTTP/1.1 or HTTP/2 (prior
//! knowledge for `http://`, ALPN for `https://`), TLS by rustls with the configured roots.
//!
//! hyper's pool carries every request to an HTTP/2 upstream on one connection, and past
//! the upstream's stream limit (SETTINGS_MAX_CONCURRENT_STREAMS) requests wait inside it
//! for a free stream, unseen. So an HTTP/2 upstream gets lanes: up to
//! `upstream.http2_max_connections` clients of one connection each, opened as they are
//! first used; a request takes the first lane with fewer than
//! `upstream.http2_max_streams_per_connection` streams in flight and holds its place
//! until its response body ends ([`StreamHold`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use prometheus_client::metrics::counter::Counter;

use super::{files_wait::FilesWait, request_body::ClientBody, slots::Slots};
use crate::{
    config::Upstream, measure::RequestTap, proxy::client_body::ClientSide,
    usage_injection::ForwardBody,
};

/// The connector of every pooled client: TLS over a TCP connect that waits for
/// descriptors ([`FilesWait`]).
pub type Connector = HttpsConnector<FilesWait<HttpConnector>>;

pub type UpstreamClient = Client<Connector, ForwardBody<ClientBody<RequestTap<ClientSide>>>>;

/// The upstream clients: one for HTTP/1.1 upstreams (hyper pools its connections), a
/// lane per HTTP/2 connection otherwise.
pub struct Clients {
    lanes: Vec<Lane>,
    /// Streams a lane carries before the next one is used (`usize::MAX` for HTTP/1.1).
    per_lane: usize,
    saturated: Counter,
}

struct Lane {
    client: UpstreamClient,
    in_flight: Arc<AtomicUsize>,
}

impl Lane {
    /// The lane's client and the place already counted in `in_flight`.
    fn hold(&self) -> (&UpstreamClient, StreamHold) {
        (&self.client, StreamHold(Arc::clone(&self.in_flight)))
    }
}

/// A request's place on its lane, given back when dropped (with the response body).
pub struct StreamHold(Arc<AtomicUsize>);

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Clients {
    /// A connect out of descriptors waits on `slots` (see [`FilesWait`]).
    pub fn build(cfg: &Upstream, saturated: Counter, slots: &Arc<Slots>) -> Clients {
        let (lanes, per_lane) = if cfg.http2 {
            (
                cfg.http2_max_connections.max(1),
                cfg.http2_max_streams_per_connection.max(1),
            )
        } else {
            (1, usize::MAX)
        };
        Clients {
            lanes: (0..lanes)
                .map(|_| Lane {
                    client: build_waiting(cfg, Some(Arc::clone(slots))),
                    in_flight: Arc::new(AtomicUsize::new(0)),
                })
                .collect(),
            per_lane,
            saturated,
        }
    }

    /// The client for the next request and its place there: the first lane with room, or,
    /// when every lane is full, the least busy one (counted as saturated). A place is
    /// taken only while the lane has room, so two requests racing for a lane's last
    /// place never both get it.
    pub fn pick(&self) -> (&UpstreamClient, StreamHold) {
        let mut least: Option<(&Lane, usize)> = None;
        for lane in &self.lanes {
            let taken = lane
                .in_flight
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < self.per_lane).then_some(n + 1)
                });
            match taken {
                Ok(_) => return lane.hold(),
                Err(n) if least.is_none_or(|(_, m)| n < m) => least = Some((lane, n)),
                Err(_) => {}
            }
        }
        self.saturated.inc();
        match least {
            Some((lane, _)) => {
                lane.in_flight.fetch_add(1, Ordering::Relaxed);
                lane.hold()
            }
            // `build` makes at least one lane.
            None => unreachable_lane(),
        }
    }

    /// Streams in flight per lane.
    #[cfg(test)]
    fn in_flight(&self) -> Vec<usize> {
        self.lanes
            .iter()
            .map(|l| l.in_flight.load(Ordering::Relaxed))
            .collect()
    }
}

#[expect(
    clippy::panic,
    reason = "Clients::build makes at least one lane; an empty list is a bug"
)]
fn unreachable_lane() -> ! {
    panic!("an upstream client without lanes")
}

/// hyper's read buffer limit for `cfg`: `upstream.max_response_header_bytes`, never under
/// hyper's minimum (validation keeps it there; hyper would panic below it).
pub(super) fn head_buffer(cfg: &Upstream) -> usize {
    cfg.max_response_header_bytes
        .max(crate::config::MIN_RESPONSE_HEADER_BYTES)
}

/// A pooled client for `cfg`, for any request body type (the shadow sends its own); a
/// connect out of descriptors fails at once.
pub fn build<B>(cfg: &Upstream) -> Client<Connector, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    build_waiting(cfg, None)
}

/// [`build`], with connects out of descriptors waiting on `slots`.
fn build_waiting<B>(cfg: &Upstream, slots: Option<Arc<Slots>>) -> Client<Connector, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let tls = (*cfg.tls).clone();
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let http = FilesWait::new(http, slots);
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
        .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
        // A response head must fit hyper's read buffer: its size is the head limit.
        .http1_max_buf_size(head_buffer(cfg))
        .http2_max_header_list_size(
            u32::try_from(cfg.max_response_header_bytes).unwrap_or(u32::MAX),
        );
    if cfg.http2 && cfg.scheme == http::uri::Scheme::HTTP {
        client.http2_only(true);
    }
    client.build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(http2: bool, lanes: usize, per_lane: usize) -> Upstream {
        let toml = format!(
            "[upstream]\nurl = \"http://127.0.0.1:9\"\nhttp2 = {http2}\n\
             http2_max_connections = {lanes}\nhttp2_max_streams_per_connection = {per_lane}\n"
        );
        let overrides = crate::config::Overrides::default();
        match crate::config::load_str(&toml, "test", &overrides) {
            Ok(c) => c.upstream,
            Err(e) => panic!("{e}"),
        }
    }

    fn slots() -> Arc<Slots> {
        Arc::new(Slots::new(
            8,
            Duration::from_secs(1),
            crate::proxy::LimitMetrics::default(),
        ))
    }

    #[tokio::test]
    async fn requests_fill_a_lane_then_open_the_next_and_count_saturation() {
        let saturated = Counter::default();
        let c = Clients::build(&upstream(true, 2, 2), saturated.clone(), &slots());
        let holds: Vec<StreamHold> = (0..4).map(|_| c.pick().1).collect();
        assert_eq!(c.in_flight(), [2, 2]);
        assert_eq!(saturated.get(), 0);
        // Every lane full: the least busy one takes it, and it is counted.
        let extra = c.pick().1;
        assert_eq!(c.in_flight().iter().sum::<usize>(), 5);
        assert_eq!(saturated.get(), 1);
        drop(extra);
        // A finished stream frees its place on its own lane: the first lane has room again.
        let mut holds = holds;
        drop(holds.remove(0));
        assert_eq!(c.in_flight(), [1, 2]);
        let _again = c.pick().1;
        assert_eq!(c.in_flight(), [2, 2]);
    }

    #[tokio::test]
    async fn requests_racing_for_the_last_places_never_overfill_a_lane() {
        let saturated = Counter::default();
        let c = Clients::build(&upstream(true, 4, 4), saturated.clone(), &slots());
        let start = std::sync::Barrier::new(16);
        let holds: Vec<StreamHold> = std::thread::scope(|s| {
            let picks: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        c.pick().1
                    })
                })
                .collect();
            picks.into_iter().filter_map(|p| p.join().ok()).collect()
        });
        assert_eq!(holds.len(), 16);
        assert_eq!(c.in_flight(), [4, 4, 4, 4]);
        assert_eq!(saturated.get(), 0);
    }

    #[tokio::test]
    async fn an_http1_upstream_has_one_client_and_never_saturates() {
        let saturated = Counter::default();
        let c = Clients::build(&upstream(false, 8, 1), saturated.clone(), &slots());
        let _holds: Vec<StreamHold> = (0..50).map(|_| c.pick().1).collect();
        assert_eq!(c.in_flight(), [50]);
        assert_eq!(saturated.get(), 0);
    }
}
