//! The inbound request's span, `graphql.request`: the trace's HTTP SERVER
//! span in OpenTelemetry's conventions (`telemetry`, the `otel` feature),
//! and the log's span of the request.
//!
//! Opened once the request is known to be a GraphQL one (not a WebSocket,
//! not GraphiQL), so every such request has one, refused or answered: its
//! name (`POST /graphql`: the route, never the path a client chose), the
//! method, the matched route, the TCP peer; then the caller class, the
//! operations and reads as they become known; last the status, `error`
//! for a 5xx. An inbound `traceparent` is its parent.

use crate::inbound::Caller;
use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath};
use std::net::SocketAddr;
use tracing::field::Empty;
use tracing::Span;

/// The span of `request`, a GraphQL `GET` (`get`) or `POST`.
pub(super) fn open(request: &http::Request<Body>, get: bool) -> Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let span = tracing::info_span!(
        "graphql.request",
        otel.name = match (get, route) {
            (true, Some(route)) => format!("GET {route}"),
            (false, Some(route)) => format!("POST {route}"),
            (true, None) => "GET".to_owned(),
            (false, None) => "POST".to_owned(),
        },
        otel.kind = "server",
        http.request.method = if get { "GET" } else { "POST" },
        http.route = route,
        http.response.status_code = Empty,
        otel.status_code = Empty,
        client.address = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|peer| tracing::field::display(peer.0.ip())),
        fanout.caller = Empty,
        fanout.operations = Empty,
        fanout.reads = Empty,
    );
    #[cfg(feature = "otel")]
    crate::telemetry::adopt_parent(&span, request.headers());
    span
}

/// Who is calling: `public` or `internal`.
pub(super) fn caller(span: &Span, caller: Caller) {
    span.record(
        "fanout.caller",
        match caller {
            Caller::Internal => "internal",
            Caller::Public => "public",
        },
    );
}

/// The answer's status.
pub(super) fn close(span: &Span, status: http::StatusCode) {
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
}
