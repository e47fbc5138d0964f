//! The HTTP integration: one inbound HTTP request → one budget → one batch.
//!
//! [`FanoutGraphQL`] is a `tower::Service` (mount it with axum's
//! `route_service`) that does, per request, in this order:
//!
//! 1. identifies the caller (the [`Caller`] the rate-limit layer left in the
//!    request's extensions, else the internal-token header) and opens the
//!    request's [`FanoutRequest`] — the deadline starts now;
//! 2. reads the body up to `max_body_bytes` (413 `PAYLOAD_TOO_LARGE`);
//! 3. parses one operation (`{…}`) or a batch (`[…]`); malformed JSON, an
//!    empty batch or something that is not a GraphQL request is 400
//!    `BAD_REQUEST`, more than `max_batch_operations` is 400
//!    `BATCH_TOO_LARGE` — in every such case nothing runs and nothing is read;
//! 4. attaches the one `FanoutRequest` to every operation
//!    (`BatchRequest::data`) and runs the batch on the schema.
//!
//! Stock async-graphql-axum has neither a batch limit nor a body limit; this
//! service has both, and answers its own refusals in the GraphQL error shape
//! with the contract's codes. `GET` answers the GraphiQL page.

use crate::engine::Engine;
use crate::error::FanoutError;
use crate::identity::Caller;
use async_graphql::http::GraphiQLSource;
use async_graphql::{BatchRequest, BatchResponse, Executor, Request};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use http::{header, Method, StatusCode};
use std::convert::Infallible;
use std::task::{Context, Poll};
use tracing::Instrument;

/// The GraphQL endpoint as a `tower::Service`.
#[derive(Clone)]
pub struct FanoutGraphQL<E> {
    executor: E,
    engine: Engine,
}

impl<E: Executor> FanoutGraphQL<E> {
    /// Serves `executor` (an async-graphql `Schema`) under `engine`'s limits.
    pub fn new(executor: E, engine: Engine) -> Self {
        Self { executor, engine }
    }

    async fn handle(self, request: http::Request<Body>) -> Response {
        if request.method() == Method::GET {
            let page = GraphiQLSource::build()
                .endpoint(request.uri().path())
                .finish();
            return axum::response::Html(page).into_response();
        }
        if request.method() != Method::POST {
            return StatusCode::METHOD_NOT_ALLOWED.into_response();
        }
        let (parts, body) = request.into_parts();
        let caller = parts
            .extensions
            .get::<Caller>()
            .copied()
            .unwrap_or_else(|| self.engine.identify(&parts.headers));
        let fanout = self.engine.begin_request(caller);
        crate::metrics::request(caller == Caller::Internal);
        let http = &self.engine.config().http;
        let batch = match read_body(body, http.max_body_bytes)
            .await
            .and_then(|bytes| parse_batch(&bytes, http.max_batch_operations))
        {
            Ok(batch) => batch,
            Err(err) => return error_response(&err),
        };
        let operations = batch.iter().count();
        fanout.expect_operations(operations);
        let span = tracing::info_span!(
            "graphql.request",
            caller = ?caller,
            operations,
            reads = tracing::field::Empty,
        );
        let response = self
            .executor
            .execute_batch(batch.data(fanout.clone()))
            .instrument(span.clone())
            .await;
        span.record("reads", fanout.budget().used());
        graphql_response(response)
    }
}

impl<E: Executor> tower::Service<http::Request<Body>> for FanoutGraphQL<E> {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(request).await) })
    }
}

/// The body, or `PAYLOAD_TOO_LARGE` past `max` bytes (checked against
/// `Content-Length` first, then while reading).
async fn read_body(body: Body, max: usize) -> Result<bytes::Bytes, FanoutError> {
    match axum::body::to_bytes(body, max).await {
        Ok(bytes) => Ok(bytes),
        Err(err) => {
            let too_large = std::error::Error::source(&err)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            Err(if too_large {
                FanoutError::PayloadTooLarge { max }
            } else {
                FanoutError::BadRequest {
                    message: format!("could not read the request body: {err}"),
                }
            })
        }
    }
}

/// One operation or a non-empty batch of at most `max` operations.
pub fn parse_batch(body: &[u8], max: usize) -> Result<BatchRequest, FanoutError> {
    let bad = |message: String| FanoutError::BadRequest { message };
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    let batch = match first {
        Some(b'[') => {
            let requests: Vec<Request> = serde_json::from_slice(body)
                .map_err(|e| bad(format!("not a batch of GraphQL requests: {e}")))?;
            match requests.len() {
                0 => Err(bad("an empty batch has nothing to run".into())),
                n if n > max => Err(FanoutError::BatchTooLarge { max }),
                _ => Ok(BatchRequest::Batch(requests)),
            }
        }
        Some(b'{') => serde_json::from_slice::<Request>(body)
            .map(BatchRequest::Single)
            .map_err(|e| bad(format!("not a GraphQL request: {e}"))),
        _ => Err(bad(
            "the body must be a GraphQL request object or a JSON array of them".into(),
        )),
    }?;
    if batch.iter().any(|r| r.query.trim().is_empty()) {
        return Err(bad(
            "not a GraphQL request: \"query\" is missing or empty".into()
        ));
    }
    Ok(batch)
}

/// A whole-request refusal, in the GraphQL error shape, with its status.
pub fn error_response(err: &FanoutError) -> Response {
    let mut response = (err.http_status(), axum::Json(err.to_response_body())).into_response();
    if let FanoutError::RateLimited { retry_after_secs } = err {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, (*retry_after_secs).into());
    }
    response
}

fn graphql_response(batch: BatchResponse) -> Response {
    let mut headers = http::HeaderMap::new();
    for (name, value) in batch.http_headers_iter() {
        headers.append(name, value);
    }
    let mut response = axum::Json(&batch).into_response();
    response.headers_mut().extend(headers);
    response
}
