//! The forwarding service: rewrites the request head for the upstream, sends it with the
//! client's body streaming through, and returns the upstream's response head with its
//! body untouched. Failures before a response head become 502/504 in one place, those the
//! client caused (a bad `Host`, a broken or too slow body) 400/408. The one
//! exception to "untouched" is opt-in usage injection ([`crate::usage_injection`]), decided here
//! for the requests the measurement layer marked as candidates.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use arc_swap::ArcSwap;
use http::{
    Method, Request, Response, StatusCode, Uri, Version,
    header::{CONTENT_LENGTH, TRANSFER_ENCODING},
};
use http_body::Body as _;
use tower::Service;

use super::{
    ConnInfo,
    client_body::ClientSide,
    fds::{Division, FileBudget},
    headers, tunnel,
    upstream::{
        body::{Rate, Source, UpstreamBody},
        client::Clients,
        error::ProxyError,
        inline::{self, Lease},
        request_body::{BodyFault, ClientBody},
        slots::Slots,
    },
};
use crate::{
    config::Upstream,
    measure::RequestTap,
    proxy::LimitMetrics,
    usage_injection::{self, ForwardBody, InjectPlan},
};

/// Cheap to clone; the upstream side can be replaced on config reload while requests in
/// flight keep the client they started with.
#[derive(Clone)]
pub struct Forward {
    inner: Arc<ArcSwap<Inner>>,
    fixed: Arc<Fixed>,
}

/// What a reload does not change.
struct Fixed {
    /// `server.request_body_timeout`.
    body_timeout: Duration,
    limits: LimitMetrics,
    /// The open-files budget, and its division at start (a reload redivides it).
    files: FileBudget,
    division: Division,
}

struct Inner {
    /// TLS and HTTP/2 upstreams, and upgrades on any upstream.
    clients: Clients,
    /// Plain HTTP/1.1 upstreams (see [`super::upstream::inline`]).
    inline: Option<Arc<inline::Pool>>,
    /// `upstream.max_connections`, shared by `client` and `inline`. A reload starts a new
    /// budget; requests still on the old client keep theirs until they end.
    slots: Arc<Slots>,
    upstream: Upstream,
}

impl Forward {
    /// `division`: the open-files budget's division at start (see [`super::fds`]); the
    /// upstream gets its share of connections.
    pub fn new(
        upstream: &Upstream,
        body_timeout: Duration,
        limits: LimitMetrics,
        files: FileBudget,
        division: Division,
    ) -> Forward {
        let inner = Inner::new(upstream, &limits, division.upstream);
        Forward {
            inner: Arc::new(ArcSwap::from_pointee(inner)),
            fixed: Arc::new(Fixed {
                body_timeout,
                limits,
                files,
                division,
            }),
        }
    }

    /// Switches new requests to a freshly built client for `upstream`, with the
    /// open-files budget divided anew for its `max_connections`.
    pub fn replace(&self, upstream: &Upstream) {
        let f = &self.fixed;
        let division = f.files.redivide(f.division, upstream.max_connections);
        division.publish(f.division.clients, upstream.max_connections, &f.limits);
        let inner = Inner::new(upstream, &f.limits, division.upstream);
        self.inner.store(Arc::new(inner));
    }
}

impl Service<Request<RequestTap<ClientSide>>> for Forward {
    type Response = Response<UpstreamBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<UpstreamBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestTap<ClientSide>>) -> Self::Future {
        let inner = self.inner.load_full();
        let fixed = Arc::clone(&self.fixed);
        Box::pin(async move {
            Ok(match inner.forward(req, &fixed).await {
                Ok(resp) => resp,
                Err(e) => {
                    match e {
                        ProxyError::BodyTimeout(_) => {
                            fixed.limits.rejected("server.request_body_timeout");
                        }
                        ProxyError::HeadTooLarge(_) => {
                            fixed.limits.rejected("upstream.max_response_header_bytes");
                        }
                        _ => {}
                    }
                    e.into_response()
                }
            })
        })
    }
}

impl Inner {
    /// `max_connections`: `upstream.max_connections` as the open-files budget allows.
    fn new(upstream: &Upstream, limits: &LimitMetrics, max_connections: usize) -> Inner {
        let slots = Arc::new(Slots::new(
            max_connections,
            upstream.pool_wait_timeout,
            limits.clone(),
        ));
        Inner {
            clients: Clients::build(upstream, limits.http2_saturated.clone(), &slots),
            inline: inline::Pool::for_upstream(upstream, Arc::clone(&slots)),
            slots,
            upstream: upstream.clone(),
        }
    }

    fn target(&self, uri: &Uri) -> Result<Uri, ProxyError> {
        let u = &self.upstream;
        let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let joined = format!("{}{}", u.base_path, path_and_query);
        Uri::builder()
            .scheme(u.scheme.clone())
            .authority(u.authority.clone())
            .path_and_query(joined)
            .build()
            .map_err(ProxyError::BadTarget)
    }

    async fn forward(
        &self,
        mut req: Request<RequestTap<ClientSide>>,
        fixed: &Fixed,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        // Before anything reaches the upstream (RFC 9112 §3.2).
        headers::check_host(&req).map_err(ProxyError::BadHost)?;
        headers::check_authority(&req, self.upstream.preserve_host).map_err(ProxyError::BadHost)?;
        let upgrade = headers::is_upgrade(&req);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        // `server.request_body_timeout` runs from the head, like the body's own timer.
        let body_deadline = tokio::time::Instant::now() + fixed.body_timeout;
        let (body, fault) = ClientBody::new(body, fixed.body_timeout);
        let conn = parts.extensions.get::<ConnInfo>().cloned();
        let client_authority = parts.uri.authority().map(|a| a.as_str().to_owned());
        headers::prepare_request(
            &mut parts.headers,
            conn.as_ref(),
            client_authority.as_deref(),
            self.upstream.preserve_host,
            upgrade,
        );
        parts.uri = self.target(&parts.uri)?;
        // The upstream connection decides the wire version; the pool rejects an HTTP/2
        // request on an HTTP/1 connection, so ask for 1.1 and let h2 connections upgrade it.
        parts.version = Version::HTTP_11;
        let plan = parts.extensions.remove::<InjectPlan>().filter(|_| !upgrade);
        parts.extensions = http::Extensions::new();
        let (body, usage) = match plan {
            Some(plan) => usage_injection::prepare(&plan, &mut parts.headers, body).await,
            None => (ForwardBody::stream(body), None),
        };
        if let Some(e) = fault.take() {
            // The body failed while it was read ahead: the upstream never hears of it.
            return Err(e);
        }

        let timeout = self.upstream.response_header_timeout;
        let request = Request::from_parts(parts, body);
        let sent = async {
            match &self.inline {
                Some(pool) if !upgrade && request.method() != Method::CONNECT => pool
                    .send(request, &fault)
                    .await
                    .map(|(resp, lease)| (resp, Some(lease))),
                _ => {
                    let slot = self.slots.take().await?;
                    let (client, stream) = self.clients.pick();
                    match client.request(request).await {
                        Ok(resp) => Ok((resp.map(Source::Hyper), Some(Lease::slot(slot, stream)))),
                        Err(e) => Err(ProxyError::from_client(
                            e,
                            self.upstream.max_response_header_bytes,
                        )),
                    }
                }
            }
        };
        let deadline = head_deadline(&fault, body_deadline, fixed.body_timeout, timeout);
        // A body that failed or timed out fails the upstream request with it: the
        // client's doing, whatever the upstream client made of it.
        let (resp, mut lease) = tokio::select! {
            biased;
            sent = sent => match sent {
                Ok(sent) => sent,
                Err(e) => return Err(fault.take().unwrap_or(e)),
            },
            e = deadline => return Err(fault.take().unwrap_or(e)),
        };

        let (mut parts, body) = resp.into_parts();
        if parts.headers.contains_key(TRANSFER_ENCODING)
            && parts.headers.contains_key(CONTENT_LENGTH)
        {
            // RFC 9112 6.3: a sign of response splitting, to be handled as an error (nginx
            // answers 502 too); forwarded, its length would contradict its body.
            return Err(ProxyError::BadResponse(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        if let Some(client_upgrade) = client_upgrade
            && parts.status == StatusCode::SWITCHING_PROTOCOLS
            && let Source::Hyper(body) = body
        {
            // Upgrades always go through hyper's client.
            let mut upstream_resp = Response::from_parts(parts, body);
            let upstream_upgrade = hyper::upgrade::on(&mut upstream_resp);
            let (mut parts, _) = upstream_resp.into_parts();
            headers::prepare_response(&mut parts.headers, true);
            parts.extensions = http::Extensions::new();
            // The tunnel holds the upstream connection, and its slot, from now on.
            parts
                .extensions
                .insert(tunnel::spawn(client_upgrade, upstream_upgrade, lease));
            return Ok(Response::from_parts(parts, UpstreamBody::empty()));
        }
        headers::prepare_response(&mut parts.headers, false);
        parts.extensions = http::Extensions::new();
        if let Some(usage) = usage {
            // Tells the measurement layer that usage is coming, and whether to strip it.
            parts.extensions.insert(usage);
        }
        if body.is_end_stream() {
            // No body to drive the connection to its end: it is ready for the next request.
            if let Some(lease) = lease.take() {
                lease.release();
            }
        }
        if let Some(reads) = lease.as_ref().and_then(Lease::reads) {
            // The measured body stamps frames with the time of the read that brought them.
            parts.extensions.insert(reads);
        }
        let rate = self.upstream.min_body_rate.map(|(min, window)| {
            let cut = fixed
                .limits
                .rejections
                .get_or_create(&crate::metrics::LimitLabel {
                    limit: "upstream.min_body_rate",
                })
                .clone();
            Rate::new(min, window, cut)
        });
        let body = UpstreamBody::open(body, self.upstream.idle_timeout, lease, rate)
            .await
            .map_err(|e| ProxyError::UpstreamFailed(Box::new(e)))?;
        Ok(Response::from_parts(parts, body))
    }
}

/// Resolves with the error for a request whose response head is overdue: the upload
/// outlived `server.request_body_timeout` (the client's fault, whatever the other timers
/// say), or `upstream.response_header_timeout` passed since the upstream's clock started:
/// at the end of the request body, or at the upstream's first response byte if earlier.
///
/// A body nobody has asked for yet at its deadline (the request still waits for an
/// upstream connection, bounded by the pool wait and connect timeouts) may well be in the
/// socket buffer: the body's own timer decides once it is read (at once, its deadline
/// being past), and the upstream's clock starts at the deadline meanwhile.
async fn head_deadline(
    fault: &BodyFault,
    body_deadline: tokio::time::Instant,
    body_timeout: Duration,
    header_timeout: Duration,
) -> ProxyError {
    tokio::select! {
        biased;
        () = fault.upstream_clock_started() => {}
        () = tokio::time::sleep_until(body_deadline) => {
            if fault.being_read() {
                return ProxyError::BodyTimeout(body_timeout);
            }
        }
    }
    tokio::time::sleep(header_timeout).await;
    ProxyError::HeaderTimeout(header_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: Duration = Duration::from_secs(8);
    const HEAD: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn the_head_deadline_runs_from_the_end_of_the_body() {
        let fault = BodyFault::default();
        let start = tokio::time::Instant::now();
        let starter = fault.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            starter.start_upstream_clock();
        });
        let e = head_deadline(&fault, start + BODY, BODY, HEAD).await;
        assert!(matches!(e, ProxyError::HeaderTimeout(_)), "{e}");
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn an_upload_past_the_body_deadline_is_the_clients_whatever_else() {
        let (mut body, fault) = ClientBody::new(Pending, BODY);
        // The upstream asks for the body; the client sends nothing.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        let start = tokio::time::Instant::now();
        let e = head_deadline(&fault, start + BODY, BODY, HEAD).await;
        assert!(matches!(e, ProxyError::BodyTimeout(_)), "{e}");
        assert_eq!(start.elapsed(), BODY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_not_yet_asked_for_at_its_deadline_is_not_blamed_on_the_client() {
        // Still waiting for an upstream connection: the upstream's clock starts at the
        // body deadline, and the body's own timer decides once it is read.
        let fault = BodyFault::default();
        let start = tokio::time::Instant::now();
        let e = head_deadline(&fault, start + BODY, BODY, HEAD).await;
        assert!(matches!(e, ProxyError::HeaderTimeout(_)), "{e}");
        assert_eq!(start.elapsed(), BODY + HEAD);
    }

    #[tokio::test]
    async fn a_reload_divides_the_open_files_budget_again() {
        let upstream = |max: usize| {
            let toml =
                format!("[upstream]\nurl = \"http://127.0.0.1:9\"\nmax_connections = {max}\n");
            match crate::config::load_str(&toml, "test", &crate::config::Overrides::default()) {
                Ok(c) => c.upstream,
                Err(e) => panic!("{e}"),
            }
        };
        let limits = LimitMetrics::default();
        let files = FileBudget::of(1024);
        let division = files.divide(10_000, 1_024);
        division.publish(10_000, 1_024, &limits);
        let forward = Forward::new(&upstream(1_024), BODY, limits.clone(), files, division);
        let share = |share| {
            limits
                .file_budget
                .get_or_create(&crate::metrics::ShareLabel { share })
                .get()
        };
        assert_eq!(share("upstream_connections"), 448);
        forward.replace(&upstream(100));
        assert_eq!(share("upstream_connections"), 100);
        assert_eq!(share("client_connections"), 448, "fixed until a restart");
        // More than the clients leave: held to the rest.
        forward.replace(&upstream(5_000));
        assert_eq!(share("upstream_connections"), 448);
    }

    /// A body whose client never sends it.
    struct Pending;

    impl http_body::Body for Pending {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_complete_with_its_head_has_the_whole_head_timeout() {
        let fault = BodyFault::default();
        fault.start_upstream_clock();
        let start = tokio::time::Instant::now();
        let e = head_deadline(&fault, start + BODY, BODY, HEAD).await;
        assert!(matches!(e, ProxyError::HeaderTimeout(_)), "{e}");
        assert_eq!(start.elapsed(), HEAD);
    }
}
