//! hyper's client (TLS and HTTP/2 upstreams, upgrades) out of descriptors: a connect that
//! fails for want of them waits, as the inline pool's does ([`Slots::wait_for_files`]),
//! and is tried again as connections come back and every
//! [`super::slots::FILES_RETRY`], up to `upstream.pool_wait_timeout`; only then does the
//! request fail (503 `proxy_out_of_files`). The request has its slot already: what it
//! waits for is a descriptor, not a place in the budget.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Uri;
use tower::{Service, ServiceExt};

use super::{error, slots::Slots};
use crate::BoxError;

/// A connector that waits for descriptors (see the module doc); without `slots` it only
/// passes the connect on.
#[derive(Clone)]
pub struct FilesWait<C> {
    inner: C,
    slots: Option<Arc<Slots>>,
}

impl<C> FilesWait<C> {
    pub fn new(inner: C, slots: Option<Arc<Slots>>) -> FilesWait<C> {
        FilesWait { inner, slots }
    }
}

impl<C> Service<Uri> for FilesWait<C>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Response: Send,
    C::Error: Into<BoxError>,
    C::Future: Send,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        // The clone that was made ready goes to this call; the one left behind is
        // readied again before the next.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let slots = self.slots.clone();
        Box::pin(async move {
            let first = inner.call(uri.clone()).await.map_err(Into::into);
            let Some(slots) = slots else {
                return first;
            };
            let mut tried = first;
            let mut until = None;
            loop {
                match tried {
                    Err(e) if error::is_out_of_files(&*e) => {
                        let until = *until
                            .get_or_insert_with(|| tokio::time::Instant::now() + slots.wait());
                        if !slots.wait_for_files(until).await {
                            return Err(e);
                        }
                        tracing::debug!("out of descriptors connecting upstream; trying again");
                    }
                    done => return done,
                }
                let ready = inner.ready().await.map_err(Into::into);
                tried = match ready {
                    Ok(ready) => ready.call(uri.clone()).await.map_err(Into::into),
                    Err(e) => Err(e),
                };
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicU32, Ordering},
        time::Duration,
    };

    use super::*;
    use crate::proxy::LimitMetrics;

    /// A connector that runs out of descriptors `failures` times, then connects.
    fn connector(
        failures: u32,
        calls: Arc<AtomicU32>,
    ) -> impl Service<Uri, Response = &'static str, Error = BoxError, Future: Send> + Clone + Send
    {
        tower::service_fn(move |_uri: Uri| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < failures {
                    Err(Box::new(std::io::Error::from_raw_os_error(24)) as BoxError)
                } else {
                    Ok("connected")
                }
            }
        })
    }

    fn slots(wait: Duration) -> Option<Arc<Slots>> {
        Some(Arc::new(Slots::new(4, wait, LimitMetrics::default())))
    }

    #[tokio::test(start_paused = true)]
    async fn a_connect_out_of_descriptors_is_tried_again_until_it_gets_one() {
        let calls = Arc::new(AtomicU32::new(0));
        let mut c = FilesWait::new(connector(3, calls.clone()), slots(Duration::from_secs(5)));
        let start = tokio::time::Instant::now();
        let got = c
            .ready()
            .await
            .map(|c| c.call(Uri::from_static("http://u")));
        let got = match got {
            Ok(f) => f.await,
            Err(e) => Err(e),
        };
        assert_eq!(got.ok(), Some("connected"));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Three waits of FILES_RETRY, no connection came back meanwhile.
        assert_eq!(start.elapsed(), super::super::slots::FILES_RETRY * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn it_fails_once_the_pool_wait_has_passed_and_other_errors_at_once() {
        let calls = Arc::new(AtomicU32::new(0));
        let wait = Duration::from_millis(100);
        let mut c = FilesWait::new(connector(u32::MAX, calls.clone()), slots(wait));
        let start = tokio::time::Instant::now();
        let got = match c.ready().await {
            Ok(c) => c.call(Uri::from_static("http://u")).await,
            Err(e) => Err(e),
        };
        let e = got.err().map(|e| error::is_out_of_files(&*e));
        assert_eq!(e, Some(true), "the last error is the descriptors'");
        assert_eq!(start.elapsed(), wait);

        // A refused connect is no wait: it fails at once.
        let refused = tower::service_fn(|_uri: Uri| async {
            Err::<&'static str, BoxError>(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            )))
        });
        let mut c = FilesWait::new(refused, slots(wait));
        let start = tokio::time::Instant::now();
        let got = match c.ready().await {
            Ok(c) => c.call(Uri::from_static("http://u")).await,
            Err(e) => Err(e),
        };
        assert!(got.is_err());
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn without_slots_it_only_passes_the_connect_on() {
        let calls = Arc::new(AtomicU32::new(0));
        let mut c = FilesWait::new(connector(1, calls.clone()), None);
        let got = match c.ready().await {
            Ok(c) => c.call(Uri::from_static("http://u")).await,
            Err(e) => Err(e),
        };
        assert!(got.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
