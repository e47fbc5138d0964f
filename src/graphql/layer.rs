//! The request scope for any service that runs the schema: a tower layer.
//!
//! [`FanoutLayer`] is the way in for an app that already serves its schema
//! with a stock service — async-graphql-axum's `GraphQL`, or its own handler —
//! and mounts [`FanoutExtension::new(&engine)`](crate::FanoutExtension::new) on the schema.
//! Per HTTP request the layer:
//!
//! 1. opens the request's scope (the caller from the rate-limit layer's
//!    [`Caller`](crate::inbound::Caller), else the internal-token header) — one budget,
//!    one de-duplication cache, one deadline;
//! 2. for any method but `GET` (whose operation is in the query string,
//!    bounded like a body: 413; only queries run, the extension refuses
//!    anything else), reads the body within the request's bounds (413
//!    `PAYLOAD_TOO_LARGE`, 408 `REQUEST_TIMEOUT`, with `Connection: close`)
//!    and counts the operations of a JSON batch: an empty batch is 400
//!    `BAD_REQUEST`, more than `max_batch_operations` is 400
//!    `BATCH_TOO_LARGE` — nothing runs, nothing is read. The count announces
//!    the batch to the scope's pricing barrier
//!    ([`FanoutRequest::expect_operations`](crate::request::FanoutRequest::expect_operations)), so with `refuse_over_estimate`
//!    no operation runs before every one is priced;
//! 3. hands the request on — the body as it was read, the scope in the
//!    request's extensions (a handler can take it with
//!    `Extension<FanoutRequest>`) — and runs the inner service with the scope
//!    as the task's current one, where the extension finds it.
//!
//! **Which integration?** [`FanoutGraphQL`](crate::FanoutGraphQL) runs the
//! batch itself (GET, media types, persisted queries, GraphiQL): prefer it
//! for a new endpoint. The layer fits an endpoint that exists already. Both
//! need the extension on the schema, which counts each answer as it is built;
//! a batch a memory bound stopped answers as one (the layer replaces the
//! stock service's answer with `RESPONSE_TOO_LARGE` or 503 `OVERLOADED`).
//! Every body but a multipart one is read as JSON whatever its content type
//! says and whatever the method, as async-graphql reads it (a `PUT` is still
//! counted and capped). Refused with 400 `BAD_REQUEST` before anything is
//! read: a body a browser could send cross-site without a CORS preflight —
//! no `Content-Type`, `text/plain`, a form or multipart, without an
//! `Apollo-Require-Preflight` or `X-Apollo-Operation-Name` header (CSRF
//! prevention, as in [`FanoutGraphQL`](crate::FanoutGraphQL)), and likewise,
//! under `http.csrf_get = "require_preflight"` (the default), a `GET` whose
//! query string carries `query` or `extensions` (a `GET` without them — a
//! page the app serves on the same route — passes); a multipart
//! upload (its batch could not be counted before it runs); and a
//! subscription stream over HTTP (`Accept: multipart/mixed;
//! subscriptionSpec="1.0"`: its body would be polled after the layer
//! returned, outside the request's scope). Register `FanoutExtension::new(&engine)`
//! first among the schema's extensions: an extension before it that refuses
//! an operation is seen only when that operation ends.
//!
//! With `http.cost_headers`, every answer the wrapped service gives carries
//! the request's cost (`X-Cost-Estimated`, `X-Cost-Actual`, `X-Cost-Max`:
//! `finish.rs`); with `http.cost_extension`, the extension adds
//! `extensions.cost` to each operation, as under `FanoutGraphQL`.

use super::finish::{cost_caller, cost_headers, spent_header, CostEnvelope};
use crate::engine::Engine;
use crate::error::Rejection;
use crate::request::FanoutRequest;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use http::{header, Method};
use std::convert::Infallible;
use std::task::{Context, Poll};

/// Opens one fan-out scope per HTTP request for the service it wraps.
///
/// ```
/// use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
/// use fanout_budget::{Config, Engine, FanoutExtension, FanoutLayer};
///
/// struct Query;
///
/// #[Object]
/// impl Query {
///     async fn hello(&self) -> &str {
///         "world"
///     }
/// }
///
/// let engine = Engine::new(Config::default());
/// let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
///     .extension(FanoutExtension::new(&engine))
///     .finish();
/// # let graphql = axum::routing::post(|| async { "the stock service" });
/// // With async-graphql-axum: `let graphql = async_graphql_axum::GraphQL::new(schema);`
/// let app: axum::Router = axum::Router::new()
///     .route_service("/graphql", graphql)
///     .layer(FanoutLayer::new(engine));
/// # drop((app, schema));
/// ```
#[derive(Clone, Debug)]
pub struct FanoutLayer {
    engine: Engine,
    /// `http.cost_extension`'s envelope, when it is on.
    envelope: Option<CostEnvelope>,
}

impl FanoutLayer {
    /// A layer opening `engine`'s request scopes.
    pub fn new(engine: Engine) -> Self {
        let envelope = CostEnvelope::of(engine.config());
        Self { engine, envelope }
    }
}

impl<S> tower::Layer<S> for FanoutLayer {
    type Service = FanoutService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FanoutService {
            inner,
            engine: self.engine.clone(),
            envelope: self.envelope,
        }
    }
}

/// The service [`FanoutLayer`] wraps around another.
#[derive(Clone, Debug)]
pub struct FanoutService<S> {
    inner: S,
    engine: Engine,
    envelope: Option<CostEnvelope>,
}

impl<S> tower::Service<http::Request<Body>> for FanoutService<S>
where
    S: tower::Service<http::Request<Body>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone is ready (`poll_ready` ran on `self.inner`); keep it.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (engine, envelope) = (self.engine.clone(), self.envelope);
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            CostEnvelope::mark(envelope, &mut parts.extensions);
            let caller = cost_caller(&engine, &parts.extensions, &parts.headers);
            let mut scope = None;
            let mut answer = answer(&engine, inner, parts, body, &mut scope).await?;
            cost_headers(&mut answer, &engine, scope.as_ref(), caller);
            spent_header(&mut answer, scope.as_ref());
            Ok(answer)
        })
    }
}

/// One HTTP request through the layer (see the module docs), answered by
/// `inner` within its scope, which `scope` holds once opened.
async fn answer<S>(
    engine: &Engine,
    mut inner: S,
    mut parts: http::request::Parts,
    body: Body,
    scope: &mut Option<FanoutRequest>,
) -> Result<Response, Infallible>
where
    S: tower::Service<http::Request<Body>, Response = Response, Error = Infallible>,
{
    if accepts_a_stream(&parts) {
        return Ok(STREAM.clone().into_response());
    }
    // async-graphql-axum reads the query string of a GET and the
    // body of every other method (HEAD included), as a batch.
    let has_body = parts.method != Method::GET;
    if has_body {
        if let Err(refused) = crate::graphql::protocol::check_preflighted(&parts.headers) {
            return Ok(refused.unread());
        }
    } else {
        let policy = engine.config().http.csrf_get_or_default();
        if let Err(refused) =
            crate::graphql::protocol::check_get(&parts.headers, parts.uri.query(), policy)
        {
            return Ok(refused.unread());
        }
        // The query string carries what a body would: bounded like one.
        let max = engine.config().http.max_body_bytes;
        if parts.uri.query().is_some_and(|q| q.len() > max) {
            return Ok(Rejection::PayloadTooLarge { max }.into_response());
        }
    }
    let fanout = &*scope.insert(engine.open_request(&parts));
    let body = if has_body {
        let bytes = match fanout.read_body(body, &engine.config().http).await {
            Ok(bytes) => bytes,
            Err(refused) => return Ok(refused.unread()),
        };
        if is_multipart(&parts) {
            return Ok(MULTIPART.clone().into_response());
        }
        match operations(&bytes, engine.config().http.max_batch_operations) {
            Ok(n) => fanout.expect_operations(n),
            Err(refused) => return Ok(refused.into_response()),
        }
        Body::from(bytes)
    } else {
        fanout.expect_operations(1);
        body
    };
    parts.extensions.insert(fanout.clone());
    let request = http::Request::from_parts(parts, body);
    let answered = fanout.clone().scope(inner.call(request)).await;
    // A memory bound stopped the batch: it answers as one.
    let answer = match fanout.stopped() {
        Some(rejection) => rejection.into_response(),
        None => answered?,
    };
    // Until the client has read it, the answer holds its bytes in
    // the process's memory pool.
    Ok(fanout.memory().lease_body(answer))
}

/// Whether the client asks for a subscription stream over HTTP
/// (`multipart/mixed`, `subscriptionSpec="1.0"`): async-graphql-axum then
/// answers with a body it polls after the service returned, outside the
/// request's scope.
fn accepts_a_stream(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(async_graphql::http::is_accept_multipart_mixed)
}

/// A stream would run outside the request's budget and deadline.
static STREAM: std::sync::LazyLock<Rejection> =
    std::sync::LazyLock::new(|| Rejection::BadRequest {
        message: "subscriptions over HTTP (multipart/mixed) are not served under FanoutLayer: \
              the stream would outlive the request's budget and deadline"
            .into(),
    });

/// Whether the body is a multipart upload (whose operations are in one of
/// its parts).
fn is_multipart(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/")
        })
}

/// A multipart body's batch cannot be counted before the service reads it,
/// so the layer would hold neither the batch cap nor the pricing.
static MULTIPART: std::sync::LazyLock<Rejection> =
    std::sync::LazyLock::new(|| Rejection::BadRequest {
        message: "multipart requests (uploads) are not served under FanoutLayer: its batch \
              cannot be counted before it runs; serve uploads on a route of their own"
            .into(),
    });

/// How many operations a JSON body holds: 1 for an object, the length of a
/// non-empty array of at most `max`. Anything else is left to the service
/// (it answers its own 400) and counts as one.
fn operations(body: &[u8], max: usize) -> Result<usize, Rejection> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'[') {
        return Ok(1);
    }
    match serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(body) {
        Ok(batch) if batch.is_empty() => Err(Rejection::BadRequest {
            message: "an empty batch has nothing to run".into(),
        }),
        Ok(batch) if batch.len() > max => Err(Rejection::BatchTooLarge { max }),
        Ok(batch) => Ok(batch.len()),
        Err(err) => Err(Rejection::BadRequest {
            message: format!("not a batch of GraphQL requests: {err}"),
        }),
    }
}
