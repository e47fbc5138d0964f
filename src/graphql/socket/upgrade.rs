//! The upgrade: an HTTP request that asks for a WebSocket answered
//! `101 Switching Protocols` in one of the two subprotocols, the socket's
//! frames bounded, and the connection handed to its driver (`driver.rs`).

use super::driver::{Driver, READ_BUFFER};
use super::message::{self, Protocol};
use crate::engine::Engine;
use crate::error::Rejection;
use async_graphql::Executor;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response as HttpResponse};

/// Whether `request` asks for a WebSocket.
pub(crate) fn is_upgrade(request: &http::Request<axum::body::Body>) -> bool {
    request
        .headers()
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Answers a WebSocket upgrade request: `101 Switching Protocols`, and the
/// connection served by `executor` under `engine`'s bounds.
pub(crate) async fn upgrade<E: Executor>(
    executor: E,
    engine: Engine,
    request: http::Request<axum::body::Body>,
) -> HttpResponse {
    let (mut parts, _body) = request.into_parts();
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let s = &engine.config().subscriptions;
    let upgrade = upgrade
        .protocols(message::SUBPROTOCOLS)
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(0)
        .max_message_size(s.max_message_bytes)
        .max_frame_size(s.max_message_bytes);
    let protocol = upgrade
        .selected_protocol()
        .and_then(|name| name.to_str().ok())
        .and_then(Protocol::from_subprotocol);
    let Some(protocol) = protocol else {
        return Rejection::BadRequest {
            message: "a GraphQL WebSocket speaks graphql-transport-ws or graphql-ws \
                      (Sec-WebSocket-Protocol)"
                .into(),
        }
        .unread();
    };
    let driver = Driver::new(executor, engine, protocol, parts);
    upgrade.on_upgrade(move |socket| driver.run(socket))
}
