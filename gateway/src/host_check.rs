//! The outermost layer: a request naming a host `http.allowed_hosts` does
//! not list is answered 400 `BAD_REQUEST` by nothing else, whatever its
//! path (a page served on loopback is not reachable through a rebound DNS
//! name). A plain `tower` service: a request it lets through is the inner
//! service's call as it is, with no future or `Next` of its own boxed (as
//! `axum::middleware::from_fn` boxes one per request).

use axum::extract::Request;
use axum::response::Response;
use fanout_budget::Engine;
use futures::future::Either;
use std::future::Ready;
use std::task::{Context, Poll};

/// [`HostCheck`] around each route.
#[derive(Clone)]
pub struct HostCheckLayer {
    engine: Engine,
}

impl HostCheckLayer {
    /// Checks against `engine`'s `http.allowed_hosts`.
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

impl<S> tower::Layer<S> for HostCheckLayer {
    type Service = HostCheck<S>;

    fn layer(&self, inner: S) -> HostCheck<S> {
        HostCheck {
            engine: self.engine.clone(),
            inner,
        }
    }
}

/// `inner`, for a request whose host `http.allowed_hosts` lists.
#[derive(Clone)]
pub struct HostCheck<S> {
    engine: Engine,
    inner: S,
}

impl<S> tower::Service<Request> for HostCheck<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let host = match request.headers().get(axum::http::header::HOST) {
            Some(host) => host.to_str().ok(),
            None => request.uri().authority().map(|a| a.as_str()),
        };
        if self.engine.config().http.allows_host(host) {
            return Either::Right(self.inner.call(request));
        }
        let shown: String = host.unwrap_or_default().chars().take(100).collect();
        let refused = fanout_budget::error::Rejection::BadRequest {
            message: format!("the host {shown:?} is not one of http.allowed_hosts"),
        }
        .unread();
        Either::Left(std::future::ready(Ok(refused)))
    }
}
