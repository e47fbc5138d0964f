//! The upgrade: an HTTP request that asks for a WebSocket answered
//! `101 Switching Protocols` in one of the two subprotocols, the socket's
//! frames bounded, and the connection handed to its driver (`driver.rs`).
//!
//! **Cross-site.** A page on any site may open a WebSocket to any host, and
//! the browser sends the visitor's cookies with the upgrade and no CORS
//! preflight; the page then reads every answer, and anything runs over a
//! socket, mutations included. So, under `http.csrf_get`'s default
//! (`"require_preflight"`: an app with ambient credentials), an upgrade
//! whose `Origin` (every browser sends one) is neither the endpoint's own
//! (its `Host`) nor one listed in `http.cors_allowed_origins` (`"*"` does
//! not count: CORS never lets it carry cookies) is refused with 400
//! `BAD_REQUEST`, as a cross-site `GET` is. An upgrade without `Origin`
//! (not a browser) is served; `"allow"` serves every one.

use super::driver::{Driver, READ_BUFFER};
use super::message;
use crate::config::CsrfGet;
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
    if let Err(refused) = check_origin(&parts.headers, &engine.config().http) {
        return refused.unread();
    }
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    // The client's first choice, not the server's: axum's `protocols` keeps
    // the client's list as a set and picks by the server's order.
    let Some((name, protocol)) = message::choose(&parts.headers) else {
        return Rejection::BadRequest {
            message: "a GraphQL WebSocket speaks graphql-transport-ws or graphql-ws \
                      (Sec-WebSocket-Protocol)"
                .into(),
        }
        .unread();
    };
    let mut upgrade = upgrade;
    upgrade.set_selected_protocol(http::HeaderValue::from_static(name));
    let s = &engine.config().subscriptions;
    let upgrade = upgrade
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(0)
        .max_message_size(s.max_message_bytes)
        .max_frame_size(s.max_message_bytes);
    let driver = Driver::new(executor, engine, protocol, parts);
    upgrade.on_upgrade(move |socket| driver.run(socket))
}

/// Refuses an upgrade a page on another site sent (see the module docs).
fn check_origin(
    headers: &http::HeaderMap,
    http: &crate::config::HttpConfig,
) -> Result<(), Rejection> {
    if http.csrf_get_or_default() == CsrfGet::Allow {
        return Ok(());
    }
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let own = origin
        .split_once("://")
        .is_some_and(|(_, authority)| host.is_some_and(|h| h.eq_ignore_ascii_case(authority)));
    let listed =
        (http.cors_allowed_origins.iter()).any(|o| o != "*" && o.eq_ignore_ascii_case(origin));
    if own || listed {
        return Ok(());
    }
    Err(Rejection::BadRequest {
        message: format!(
            "this WebSocket has been blocked as a possible cross-site request forgery: \
             its Origin ({origin}) is neither this endpoint's nor in http.cors_allowed_origins"
        ),
    })
}
