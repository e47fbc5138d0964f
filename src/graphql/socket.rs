//! GraphQL subscriptions over WebSocket: one connection, one scope.
//!
//! A WebSocket connection is one inbound HTTP request (the upgrade) that
//! lives for hours. [`FanoutGraphQL`](crate::FanoutGraphQL) serves it at the
//! GraphQL endpoint itself (a `GET` with `Upgrade: websocket`), and
//! [`FanoutSubscription`](crate::graphql::FanoutSubscription) serves it beside a stock
//! service under [`FanoutLayer`](crate::FanoutLayer). Both subprotocols,
//! `graphql-transport-ws` and the legacy `graphql-ws` (`message.rs`).
//!
//! How one connection is served ([`upgrade`], then `Driver::run`, one task):
//!
//! 1. **The upgrade.** The subprotocol is chosen (none of the two: 400),
//!    frames are bounded by `subscriptions.max_message_bytes` (a larger one
//!    closes the connection, 4400), and the connection keeps its place in
//!    [`serve`](crate::inbound::serve)'s table (`ConnectionLease`): it still
//!    counts against `http.max_connections` and its client's share, idle (no
//!    subscription) it may be closed for a newcomer, and it is closed when
//!    the server stops.
//! 2. **`connection_init`** within `subscriptions.init_timeout_ms` (else
//!    4408; a second one 4429): the caller is fixed — the upgrade request's
//!    internal-token header, or the payload's `"x-internal-token"`, exact
//!    matches only — and the connection's scope opens
//!    ([`FanoutConnection`], `connection.rs`: a read budget that refills).
//! 3. **`subscribe`** (before the ack: 4401; an id already active: 4409;
//!    past `subscriptions.max_per_connection`: an `error` for that id,
//!    `TOO_MANY_SUBSCRIPTIONS`, the others untouched): the operation runs on
//!    the executor with the connection in its session data. The engine's
//!    extension admits it once and runs **each event in a scope of its own**
//!    opened on the connection (`extension.rs`): its own de-duplication,
//!    deadline and answer memory, its reads paid by the connection.
//! 4. **Writing** (`outbox.rs`): one frame at a time, each within
//!    `http.write_timeout_ms` (else the connection ends); meanwhile events go
//!    on resolving, at most `subscriptions.max_pending_events` waiting per
//!    subscription (the oldest dropped), their bytes held in the memory pool.
//!    Each event spends from the task's cooperative budget (tokio's
//!    `coop`), so a subscription whose stream is always ready yields the
//!    thread to the runtime's other tasks and timers like any I/O does.
//! 5. **Keep-alive**: a ping every `subscriptions.keepalive_ms` (a WebSocket
//!    ping frame, which every client answers, and the legacy protocol's
//!    `ka`); a client heard from in none of three is closed (1001).

mod connection;
mod message;
mod outbox;
mod poll;
mod service;

pub use connection::FanoutConnection;
pub use poll::SharedPoll;
pub use service::FanoutSubscription;

use crate::engine::Engine;
use crate::error::Rejection;
use crate::inbound::identity::Caller;
use crate::inbound::serve::{ConnectionLease, Wanted};
use async_graphql::{Data, Executor, Response};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response as HttpResponse};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, SplitSink, StreamExt};
use futures::SinkExt;
use message::{close, ClientMessage, Protocol};
use outbox::Outbox;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

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
    let lease = parts.extensions.remove::<ConnectionLease>();
    let caller = (parts.extensions.get::<Caller>().copied())
        .unwrap_or_else(|| engine.identify(&parts.headers));
    let outbox = Outbox::new(s.max_pending_events, engine.memory_pool().clone());
    let driver = Driver {
        executor,
        engine,
        protocol,
        caller,
        parts,
        lease,
        session: None,
        subscriptions: Vec::new(),
        turn: 0,
        outbox,
        heard: Instant::now(),
    };
    upgrade.on_upgrade(move |socket| driver.run(socket))
}

/// Bytes tungstenite reads at a time (its default, 128 KiB, would be most
/// of an idle connection's memory).
const READ_BUFFER: usize = 4096;

/// Keep-alive intervals without a word from the client before it is closed.
const SILENT_INTERVALS: u32 = 3;

/// One active subscription.
struct Subscription {
    id: String,
    events: BoxStream<'static, Response>,
}

/// One connection's state, driven by one task.
struct Driver<E> {
    executor: E,
    engine: Engine,
    protocol: Protocol,
    /// The caller the upgrade request's headers say.
    caller: Caller,
    /// The upgrade request: its client keys the read quota.
    parts: http::request::Parts,
    lease: Option<ConnectionLease>,
    /// The session data, with the connection's scope, once initialised.
    session: Option<Arc<Data>>,
    subscriptions: Vec<Subscription>,
    /// Which subscription is polled first next time (fairness).
    turn: usize,
    outbox: Outbox,
    /// When the client was last heard from.
    heard: Instant,
}

/// What happens to the connection after a message.
enum Next {
    Go,
    Close(u16, &'static str),
    End,
}

type Sink = SplitSink<WebSocket, Message>;

impl<E: Executor> Driver<E> {
    async fn run(mut self, socket: WebSocket) {
        let s = self.engine.config().subscriptions.clone();
        let write_timeout = self.engine.config().http.write_timeout();
        let (sink, mut incoming) = socket.split();
        let mut sink = Some(sink);
        let mut writing: Option<BoxFuture<'static, Option<Sink>>> = None;
        let mut closing: Option<(u16, &'static str)> = None;
        let mut ping_due = false;
        let init_by = Instant::now() + s.init_timeout();
        let mut keepalive = tokio::time::interval_at(Instant::now() + s.keepalive(), s.keepalive());
        let lease = self.lease.clone();
        loop {
            if let Some(idle) = sink.take() {
                let frame = match closing {
                    Some((code, reason)) => Some(Message::Close(Some(CloseFrame {
                        code,
                        reason: reason.into(),
                    }))),
                    None => self.outbox.next().map(|text| Message::Text(text.into())),
                };
                let frame = frame.or_else(|| {
                    std::mem::take(&mut ping_due).then(|| Message::Ping(bytes::Bytes::new()))
                });
                match frame {
                    Some(frame) => {
                        let last = matches!(frame, Message::Close(_));
                        writing = Some(Box::pin(write(idle, frame, write_timeout, last)));
                    }
                    None => sink = Some(idle),
                }
            }
            let reading = closing.is_none() && self.outbox.takes_replies();
            let resolving = closing.is_none() && !self.subscriptions.is_empty();
            let next = tokio::select! {
                biased;
                written = async { writing.as_mut().expect("guarded").await }, if writing.is_some() => {
                    writing = None;
                    match written {
                        Some(idle) => sink = Some(idle),
                        // Written the close frame, failed, or timed out.
                        None => break,
                    }
                    Next::Go
                }
                wanted = async { lease.as_ref().expect("guarded").wanted().await }, if lease.is_some() && closing.is_none() => {
                    match wanted {
                        Wanted::Stop => Next::Close(close::GOING_AWAY, "the server is stopping"),
                        Wanted::Slot if self.subscriptions.is_empty() => {
                            Next::Close(close::GOING_AWAY, "idle, and its slot is wanted")
                        }
                        Wanted::Slot => Next::Go,
                    }
                }
                () = tokio::time::sleep_until(init_by), if self.session.is_none() && closing.is_none() => {
                    Next::Close(close::INIT_TIMEOUT, "Connection initialisation timeout")
                }
                _ = keepalive.tick(), if closing.is_none() => {
                    if self.heard.elapsed() > s.keepalive() * SILENT_INTERVALS {
                        Next::Close(close::GOING_AWAY, "no word from the client")
                    } else {
                        ping_due = true;
                        if self.protocol == Protocol::Legacy && self.session.is_some() {
                            self.outbox.reply(self.protocol.keepalive());
                        }
                        Next::Go
                    }
                }
                message = incoming.next(), if reading => self.on_frame(message),
                (at, event) = next_event(&mut self.subscriptions, &mut self.turn), if resolving => {
                    self.on_event(at, event);
                    // A subscription whose events are always ready would
                    // otherwise keep this task running for good: the
                    // runtime's other tasks (and its timers, the write
                    // timeout's included) would wait.
                    tokio::task::coop::consume_budget().await;
                    Next::Go
                }
            };
            match next {
                Next::Go => {}
                Next::Close(code, reason) => closing = Some((code, reason)),
                Next::End => break,
            }
        }
        // Every subscription's stream is dropped with the driver.
    }

    /// One frame from the client.
    fn on_frame(&mut self, frame: Option<Result<Message, axum::Error>>) -> Next {
        self.heard = Instant::now();
        match frame {
            None | Some(Ok(Message::Close(_))) => Next::End,
            // Too large (tungstenite stops reading it at the bound), or not
            // a WebSocket frame at all.
            Some(Err(_)) => Next::Close(close::BAD_MESSAGE, "message too large or malformed"),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => Next::Go,
            Some(Ok(Message::Text(text))) => self.on_message(text.as_bytes()),
            Some(Ok(Message::Binary(bytes))) => self.on_message(&bytes),
        }
    }

    /// One protocol message.
    fn on_message(&mut self, bytes: &[u8]) -> Next {
        let Ok(message) = ClientMessage::from_bytes(bytes) else {
            return Next::Close(close::BAD_MESSAGE, "not a message of the protocol");
        };
        match message {
            ClientMessage::ConnectionInit { payload } => {
                if self.session.is_some() {
                    return Next::Close(close::TOO_MANY_INITS, "Too many initialisation requests");
                }
                let caller = match (self.caller, message::init_token(payload.as_ref())) {
                    (Caller::Internal, _) => Caller::Internal,
                    (Caller::Public, Some(token)) => self.engine.identify_token(token),
                    (Caller::Public, None) => Caller::Public,
                };
                let connection = FanoutConnection::open(&self.engine, caller, &self.parts);
                let mut data = Data::default();
                data.insert(connection);
                self.session = Some(Arc::new(data));
                self.outbox.reply(self.protocol.ack());
                Next::Go
            }
            ClientMessage::Start { id, payload } => {
                let Some(session) = &self.session else {
                    return Next::Close(close::UNAUTHORIZED, "Unauthorized");
                };
                if self.subscriptions.iter().any(|s| s.id == id) {
                    return Next::Close(
                        close::DUPLICATE_ID,
                        "Subscriber for this id already exists",
                    );
                }
                let max = self.engine.config().subscriptions.max_per_connection;
                if self.subscriptions.len() >= max {
                    crate::metrics::subscription_refused();
                    let message = format!("at most {max} active subscriptions on one connection");
                    let refusal = self.protocol.error(&id, &message, TOO_MANY_SUBSCRIPTIONS);
                    self.outbox.reply(refusal);
                    return Next::Go;
                }
                let events = self.executor.execute_stream(payload, Some(session.clone()));
                self.subscriptions.push(Subscription { id, events });
                if let Some(lease) = &self.lease {
                    lease.busy();
                }
                Next::Go
            }
            ClientMessage::Stop { id } => {
                let before = self.subscriptions.len();
                self.subscriptions.retain(|s| s.id != id);
                if self.subscriptions.len() < before {
                    self.outbox.forget(&id);
                    if self.protocol.confirms_stop() {
                        self.outbox.reply(self.protocol.complete(&id));
                    }
                    self.idle_if_none();
                }
                Next::Go
            }
            ClientMessage::ConnectionTerminate => Next::End,
            ClientMessage::Ping { .. } => {
                if let Some(pong) = self.protocol.pong() {
                    self.outbox.reply(pong);
                }
                Next::Go
            }
            ClientMessage::Pong { .. } => Next::Go,
        }
    }

    /// An event of the subscription at `at`, or its end.
    fn on_event(&mut self, at: usize, event: Option<Response>) {
        let id = &self.subscriptions[at].id;
        match event {
            Some(response) => {
                let text = self.protocol.next(id, &response);
                if !self.outbox.event(id, text) {
                    crate::metrics::subscription_event_dropped();
                }
            }
            None => {
                let id = self.subscriptions.swap_remove(at).id;
                self.outbox.finish(&id, self.protocol.complete(&id));
                self.idle_if_none();
            }
        }
    }

    fn idle_if_none(&self) {
        if let (true, Some(lease)) = (self.subscriptions.is_empty(), &self.lease) {
            lease.idle();
        }
    }
}

/// The code of a subscribe past `subscriptions.max_per_connection`.
pub(crate) const TOO_MANY_SUBSCRIPTIONS: &str = "TOO_MANY_SUBSCRIPTIONS";

/// The next event of any subscription (or its end), polling them from
/// `turn` on so that none starves the others.
async fn next_event(
    subscriptions: &mut [Subscription],
    turn: &mut usize,
) -> (usize, Option<Response>) {
    std::future::poll_fn(|cx| {
        let n = subscriptions.len();
        for k in 0..n {
            let at = (*turn + k) % n;
            if let Poll::Ready(event) = subscriptions[at].events.poll_next_unpin(cx) {
                *turn = at + 1;
                return Poll::Ready((at, event));
            }
        }
        Poll::Pending
    })
    .await
}

/// Writes `frame` within `timeout`: the sink back, or `None` when the write
/// failed, timed out, or was the `last` (a close).
async fn write(mut sink: Sink, frame: Message, timeout: Duration, last: bool) -> Option<Sink> {
    match tokio::time::timeout(timeout, sink.send(frame)).await {
        Ok(Ok(())) if !last => Some(sink),
        _ => None,
    }
}
