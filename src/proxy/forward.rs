//! The forwarding service: rewrites the request head for the upstream, sends it with the
//! client's body streaming through, and returns the upstream's response head with its
//! body untouched. Failures before a response head become 502/504 in one place. The one
//! exception to "untouched" is opt-in usage injection ([`super::inject`]), decided here
//! for the requests the measurement layer marked as candidates.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use arc_swap::ArcSwap;
use http::{
    Method, Request, Response, StatusCode, Uri, Version,
    header::{CONTENT_LENGTH, TRANSFER_ENCODING},
};
use http_body::Body as _;
use hyper::body::Incoming;
use tower::Service;

use super::{
    ConnInfo, Tunnel,
    body::UpstreamBody,
    client::{self, UpstreamClient},
    error::ProxyError,
    headers,
    inject::{self, ForwardBody, InjectPlan},
    inline,
};
use crate::{config::Upstream, measure::RequestTap};

/// Cheap to clone; the upstream side can be replaced on config reload while requests in
/// flight keep the client they started with.
#[derive(Clone)]
pub struct Forward {
    inner: Arc<ArcSwap<Inner>>,
}

struct Inner {
    /// TLS and HTTP/2 upstreams, and upgrades on any upstream.
    client: UpstreamClient,
    /// Plain HTTP/1.1 upstreams (see [`super::inline`]).
    inline: Option<Arc<inline::Pool>>,
    upstream: Upstream,
}

impl Forward {
    pub fn new(upstream: &Upstream) -> Forward {
        Forward {
            inner: Arc::new(ArcSwap::from_pointee(Inner::new(upstream))),
        }
    }

    /// Switches new requests to a freshly built client for `upstream`.
    pub fn replace(&self, upstream: &Upstream) {
        self.inner.store(Arc::new(Inner::new(upstream)));
    }
}

impl Service<Request<RequestTap<Incoming>>> for Forward {
    type Response = Response<UpstreamBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<UpstreamBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestTap<Incoming>>) -> Self::Future {
        let inner = self.inner.load_full();
        Box::pin(async move {
            Ok(match inner.forward(req).await {
                Ok(resp) => resp,
                Err(e) => e.into_response(),
            })
        })
    }
}

impl Inner {
    fn new(upstream: &Upstream) -> Inner {
        Inner {
            client: client::build(upstream),
            inline: inline::Pool::for_upstream(upstream),
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
        mut req: Request<RequestTap<Incoming>>,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let upgrade = headers::is_upgrade(&req);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
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
            Some(plan) => inject::prepare(&plan, &mut parts.headers, body).await,
            None => (ForwardBody::stream(body), None),
        };

        let timeout = self.upstream.response_header_timeout;
        let request = Request::from_parts(parts, body);
        let sent = async {
            match &self.inline {
                Some(pool) if !upgrade && request.method() != Method::CONNECT => pool
                    .send(request)
                    .await
                    .map(|(resp, lease)| (resp, Some(lease))),
                _ => match self.client.request(request).await {
                    Ok(resp) => Ok((resp, None)),
                    Err(e) => Err(ProxyError::from_client(e)),
                },
            }
        };
        let (resp, mut lease) = match tokio::time::timeout(timeout, sent).await {
            Err(_) => return Err(ProxyError::HeaderTimeout(timeout)),
            Ok(result) => result?,
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
        {
            let mut upstream_resp = Response::from_parts(parts, body);
            let upstream_upgrade = hyper::upgrade::on(&mut upstream_resp);
            let (mut parts, _) = upstream_resp.into_parts();
            headers::prepare_response(&mut parts.headers, true);
            parts.extensions = http::Extensions::new();
            parts
                .extensions
                .insert(Tunnel::spawn(client_upgrade, upstream_upgrade));
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
        if let Some(lease) = &lease {
            // The measured body stamps frames with the time of the read that brought them.
            parts.extensions.insert(lease.reads());
        }
        let body = UpstreamBody::open(body, self.upstream.idle_timeout, lease)
            .await
            .map_err(|e| ProxyError::UpstreamFailed(Box::new(e)))?;
        Ok(Response::from_parts(parts, body))
    }
}
