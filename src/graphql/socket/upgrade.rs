//! The upgrade: an HTTP request that asks for a WebSocket answered
//! `101 Switching Protocols` in one of the two subprotocols, the socket's
//! frames bounded, and the connection handed to its driver (`driver.rs`).
//!
//! **Cross-site.** A page on any site may open a WebSocket to any host, and
//! the browser sends the visitor's cookies with the upgrade and no CORS
//! preflight; the page then reads every answer, and anything runs over a
//! socket, mutations included — and every read it makes is paid from its
//! visitor's per-IP limit and read quota. So an upgrade whose `Origin`
//! (every browser sends one) is neither the endpoint's own (its `Host`) nor
//! one listed in `http.cors_allowed_origins` (`"*"` does not count: CORS
//! never lets it carry cookies) is refused with 400 `BAD_REQUEST`, whatever
//! `http.csrf_get` says (it rules plain `GET`s, whose answers CORS keeps
//! from the page; a socket's it does not). An upgrade without `Origin` (not
//! a browser) is served.
//!
//! **Another name for this server.** A page whose own name is pointed at
//! this server's address (DNS rebinding) is its own origin in the browser's
//! eyes: its `Origin` and `Host` agree. With `http.allowed_hosts` set, an
//! upgrade whose `Host` is not listed is refused with 400 `BAD_REQUEST`.

use super::driver::{Driver, READ_BUFFER};
use super::message;
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
    let http = &engine.config().http;
    if let Err(refused) = check_host(&parts, http).and_then(|()| check_origin(&parts, http)) {
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

/// The host a request names: its `Host` header, else its URI's authority
/// (HTTP/2).
fn host(parts: &http::request::Parts) -> Option<&str> {
    match parts.headers.get(http::header::HOST) {
        Some(host) => host.to_str().ok(),
        None => parts.uri.authority().map(|a| a.as_str()),
    }
}

/// Refuses an upgrade naming a host `http.allowed_hosts` does not list
/// (see the module docs).
fn check_host(
    parts: &http::request::Parts,
    http: &crate::config::HttpConfig,
) -> Result<(), Rejection> {
    let host = host(parts);
    if http.allows_host(host) {
        return Ok(());
    }
    let shown: String = host.unwrap_or_default().chars().take(100).collect();
    Err(Rejection::BadRequest {
        message: format!("the host {shown:?} is not one of http.allowed_hosts"),
    })
}

/// Refuses an upgrade a page on another site sent (see the module docs).
fn check_origin(
    parts: &http::request::Parts,
    http: &crate::config::HttpConfig,
) -> Result<(), Rejection> {
    let Some(origin) = parts.headers.get(http::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let host = host(parts);
    let own = origin
        .split_once("://")
        .is_some_and(|(_, authority)| host.is_some_and(|h| h.eq_ignore_ascii_case(authority)));
    let listed =
        (http.cors_allowed_origins.iter()).any(|o| o != "*" && o.eq_ignore_ascii_case(origin));
    if own || listed {
        return Ok(());
    }
    let shown: String = origin.chars().take(100).collect();
    Err(Rejection::BadRequest {
        message: format!(
            "this WebSocket has been blocked as a possible cross-site request forgery: \
             its Origin ({shown}) is neither this endpoint's nor in http.cors_allowed_origins"
        ),
    })
}
