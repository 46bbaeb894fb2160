//! Failures the proxy answers itself, and the one function that turns them into HTTP
//! responses. Each carries the measurement outcome it stands for.

use std::error::Error as _;

use bytes::Bytes;
use http::{
    HeaderValue, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};

use super::body::UpstreamBody;
use crate::{
    BoxError,
    measure::{Outcome, ProxyFailure},
};

/// Why the proxy could not obtain a response head from the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream unreachable: {0}")]
    Unreachable(#[source] BoxError),
    #[error("upstream connect timed out")]
    ConnectTimeout(#[source] BoxError),
    #[error("upstream sent no response headers within {0:?}")]
    HeaderTimeout(std::time::Duration),
    #[error("upstream failed before responding: {0}")]
    UpstreamFailed(#[source] BoxError),
    #[error("cannot build the upstream request: {0}")]
    BadTarget(#[source] http::Error),
    #[error("upstream response is malformed: {0}")]
    BadResponse(&'static str),
    #[error("upstream response head larger than {0} bytes (upstream.max_response_header_bytes)")]
    HeadTooLarge(usize),
    #[error("no upstream connection free within {0:?} (upstream.max_connections in use)")]
    UpstreamBusy(std::time::Duration),
    #[error("request body not received within {0:?}")]
    BodyTimeout(std::time::Duration),
    #[error("malformed or incomplete request body: {0}")]
    BadBody(#[source] BoxError),
    #[error("{0}")]
    BadHost(&'static str),
    /// The proxy's own descriptors ran out: not the upstream's fault.
    #[error("out of file descriptors while connecting upstream: {0}")]
    OutOfFiles(#[source] BoxError),
}

impl ProxyError {
    /// Sorts a client error by where it happened; `max_head`: the response head limit
    /// hyper's read buffer was given.
    pub fn from_client(e: hyper_util::client::legacy::Error, max_head: usize) -> ProxyError {
        if e.is_connect() {
            ProxyError::connect(Box::new(e))
        } else if e
            .source()
            .and_then(|s| s.downcast_ref::<hyper::Error>())
            .is_some_and(hyper::Error::is_parse_too_large)
        {
            ProxyError::HeadTooLarge(max_head)
        } else {
            ProxyError::UpstreamFailed(Box::new(e))
        }
    }

    /// Sorts a failure of hyper's HTTP/1 connection before the response head.
    pub fn from_hyper(e: hyper::Error, max_head: usize) -> ProxyError {
        if e.is_parse_too_large() {
            ProxyError::HeadTooLarge(max_head)
        } else {
            ProxyError::UpstreamFailed(Box::new(e))
        }
    }

    /// Sorts a connect failure into a timeout, the proxy's own lack of descriptors, or an
    /// unreachable upstream.
    pub fn connect(e: BoxError) -> ProxyError {
        if chain_has_out_of_files(&*e) {
            ProxyError::OutOfFiles(e)
        } else if chain_has_timeout(&*e) {
            ProxyError::ConnectTimeout(e)
        } else {
            ProxyError::Unreachable(e)
        }
    }

    /// Stable machine-readable code for the JSON body and logs.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::Unreachable(_) => "upstream_unreachable",
            ProxyError::ConnectTimeout(_) => "upstream_connect_timeout",
            ProxyError::HeaderTimeout(_) => "upstream_header_timeout",
            ProxyError::UpstreamFailed(_) => "upstream_failed",
            ProxyError::BadTarget(_) => "bad_target",
            ProxyError::BadResponse(_) => "upstream_bad_response",
            ProxyError::HeadTooLarge(_) => "upstream_head_too_large",
            ProxyError::UpstreamBusy(_) => "upstream_busy",
            ProxyError::BodyTimeout(_) => "request_body_timeout",
            ProxyError::BadBody(_) => "bad_request_body",
            ProxyError::BadHost(_) => "bad_host",
            ProxyError::OutOfFiles(_) => "proxy_out_of_files",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ProxyError::ConnectTimeout(_) | ProxyError::HeaderTimeout(_) => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::Unreachable(_)
            | ProxyError::UpstreamFailed(_)
            | ProxyError::BadResponse(_)
            | ProxyError::HeadTooLarge(_) => StatusCode::BAD_GATEWAY,
            ProxyError::BadTarget(_) | ProxyError::BadBody(_) | ProxyError::BadHost(_) => {
                StatusCode::BAD_REQUEST
            }
            ProxyError::UpstreamBusy(_) | ProxyError::OutOfFiles(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            ProxyError::ConnectTimeout(_) | ProxyError::HeaderTimeout(_) => Outcome::Timeout,
            ProxyError::Unreachable(_)
            | ProxyError::UpstreamFailed(_)
            | ProxyError::BadResponse(_)
            | ProxyError::HeadTooLarge(_) => Outcome::UpstreamError,
            ProxyError::BadTarget(_) | ProxyError::OutOfFiles(_) => Outcome::ProxyError,
            ProxyError::UpstreamBusy(_) => Outcome::Rejected,
            ProxyError::BodyTimeout(_) | ProxyError::BadBody(_) | ProxyError::BadHost(_) => {
                Outcome::ClientError
            }
        }
    }

    /// The response the client gets: OpenAI-style error JSON so SDKs surface the cause.
    pub fn into_response(self) -> Response<UpstreamBody> {
        let detail = full_chain(&self);
        if self.outcome() == Outcome::ClientError {
            // Any client can cause these at will: not worth an operator's attention.
            tracing::debug!(code = self.code(), error = %detail, "request refused");
        } else {
            tracing::warn!(code = self.code(), error = %detail, "proxy answered with an error");
        }
        let body = serde_json::json!({
            "error": {
                "message": detail,
                "type": "goodput_proxy_error",
                "code": self.code(),
            }
        });
        let mut resp = Response::new(UpstreamBody::full(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status();
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let ProxyError::UpstreamBusy(_) | ProxyError::OutOfFiles(_) = self {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp.extensions_mut().insert(ProxyFailure(self.outcome()));
        resp
    }
}

/// `EMFILE` (this process) and `ENFILE` (the system), the same numbers on Linux and the BSDs.
const OUT_OF_FILES: [i32; 2] = [24, 23];

/// Whether `e` (or an error it was caused by) is the proxy running out of descriptors.
pub(super) fn is_out_of_files(e: &(dyn std::error::Error + 'static)) -> bool {
    chain_has_out_of_files(e)
}

fn chain_has_out_of_files(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.raw_os_error().is_some_and(|n| OUT_OF_FILES.contains(&n))
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn chain_has_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        if err.to_string().contains("timed out") {
            return true;
        }
        cur = err.source();
    }
    false
}

fn full_chain(e: &ProxyError) -> String {
    let mut out = e.to_string();
    let mut cur = e.source().and_then(|s| s.source());
    while let Some(err) = cur {
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_is_the_proxys_failure_not_the_upstreams() {
        let emfile: BoxError = Box::new(std::io::Error::from_raw_os_error(24));
        let e = ProxyError::connect(emfile);
        assert_eq!(e.code(), "proxy_out_of_files");
        assert_eq!(e.outcome(), Outcome::ProxyError);
        let refused: BoxError =
            Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            ProxyError::connect(refused).outcome(),
            Outcome::UpstreamError
        );
    }
}
