//! One GraphQL POST, in process: the request built as a client would send
//! it, handed to a `Router` with `tower::ServiceExt::oneshot` (no socket).

use axum::body::{Body, Bytes};
use axum::Router;
use http::{HeaderMap, StatusCode};
use serde_json::Value;
use std::net::SocketAddr;
use tower::ServiceExt;

/// What came back.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// `POST /graphql` with a JSON content type, `headers`, and, with `peer`,
/// the TCP peer as axum's `ConnectInfo` (as a server with connect info sets it).
pub fn graphql_request(
    body: impl Into<String>,
    headers: &[(&str, &str)],
    peer: Option<SocketAddr>,
) -> http::Request<Body> {
    let mut request = http::Request::post("/graphql").header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut request = request.body(Body::from(body.into())).unwrap();
    if let Some(peer) = peer {
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
    }
    request
}

/// The router's `/metrics` page (Prometheus text).
pub async fn metrics_page(router: &Router) -> String {
    let request = http::Request::get("/metrics").body(Body::empty()).unwrap();
    String::from_utf8_lossy(&call(router, request).await.body).into_owned()
}

/// Sends `request` to `router` in process; the whole answer.
pub async fn call(router: &Router, request: http::Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    Answer {
        status,
        headers,
        body,
    }
}

/// The TCP peer of [`post`], as a server with connect info would record it.
pub const PEER: &str = "127.0.0.1:40000";

/// POSTs `body` to `router`'s `/graphql` in process, with `headers`, from
/// [`PEER`].
pub async fn post(router: &Router, body: impl Into<String>, headers: &[(&str, &str)]) -> Answer {
    call(
        router,
        graphql_request(body, headers, Some(PEER.parse().unwrap())),
    )
    .await
}
