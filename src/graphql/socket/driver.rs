//! One connection's driver: a task that reads the client's messages,
//! resolves its subscriptions' events and writes one frame at a time (the
//! walk is in `socket.rs`).

use super::connection::FanoutConnection;
use super::message::{self, close, ClientMessage, Protocol};
use super::outbox::Outbox;
use super::standing::Standing;
use crate::engine::Engine;
use crate::error::{operation_error, OperationError};
use crate::inbound::identity::Caller;
use crate::inbound::limiter::SocketLimit;
use crate::inbound::serve::{ConnectionLease, Wanted};
use crate::memory::{MemoryPool, PoolBytes};
use async_graphql::{Data, Executor, Response};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, SplitSink, StreamExt};
use futures::SinkExt;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// Bytes tungstenite reads at a time (its default, 128 KiB, would be most
/// of an idle connection's memory).
pub(super) const READ_BUFFER: usize = 4096;

/// Keep-alive intervals without a word from the client before it is closed.
const SILENT_INTERVALS: u32 = 3;

/// One active subscription.
struct Subscription {
    id: String,
    events: BoxStream<'static, Response>,
    /// Whether an event of it has been answered yet.
    answered: bool,
    /// What the driver keeps of it while active — its id, its stream's
    /// box and its place here — in its client's share of the sockets'
    /// pool (its operation's document, variables and text are held by the
    /// extension, `held.rs`).
    _held: PoolBytes,
}

/// The longest subscription id taken (graphql-ws sends UUIDs: 36 bytes).
const MAX_ID_BYTES: usize = 128;

/// What the driver keeps of an active subscription besides its id: its
/// entry here, and the boxed stream async-graphql hands it.
const SUBSCRIPTION_WEIGHT: usize = 512;

/// One connection's state, driven by one task.
pub(super) struct Driver<E> {
    executor: E,
    engine: Engine,
    protocol: Protocol,
    /// The caller the upgrade request's headers say.
    caller: Caller,
    /// The upgrade request: its client keys the read quota.
    parts: http::request::Parts,
    lease: Option<ConnectionLease>,
    /// The client's per-IP limit, which counts each operation (none for an
    /// internal caller, or outside the rate-limit layer).
    limit: Option<SocketLimit>,
    /// The session data, with the connection's scope, once initialised.
    session: Option<Arc<Data>>,
    subscriptions: Vec<Subscription>,
    /// Which subscription is polled first next time (fairness).
    turn: usize,
    outbox: Outbox,
    /// Its client's share of the sockets' pool (`subscriptions.max_bytes`):
    /// its subscriptions, their events resolving and waiting.
    memory: Arc<MemoryPool>,
    /// What it holds however it is used (`standing.rs`), once it runs.
    standing: Option<Standing>,
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
    /// The driver of a connection upgraded by the request whose parts are
    /// `parts`: the caller its headers say (or the rate-limit layer found),
    /// its place in `serve`'s table and its client's per-IP limit, if they
    /// came with it.
    pub(super) fn new(
        executor: E,
        engine: Engine,
        protocol: Protocol,
        mut parts: http::request::Parts,
    ) -> Self {
        let lease = parts.extensions.remove::<ConnectionLease>();
        // A `FanoutLayer`'s scope for the upgrade request itself: each event
        // has its own.
        parts.extensions.remove::<crate::request::FanoutRequest>();
        let limit = parts.extensions.remove::<SocketLimit>();
        let caller = (parts.extensions.get::<Caller>().copied())
            .unwrap_or_else(|| engine.identify(&parts.headers));
        let max_pending = engine.config().subscriptions.max_pending_events;
        let memory = engine.socket_share(&parts);
        let outbox = Outbox::new(max_pending, memory.clone());
        Self {
            executor,
            engine,
            protocol,
            caller,
            parts,
            lease,
            limit,
            session: None,
            subscriptions: Vec::new(),
            turn: 0,
            outbox,
            memory,
            standing: None,
            heard: Instant::now(),
        }
    }

    /// Serves the connection until it closes.
    pub(super) async fn run(mut self, socket: WebSocket) {
        let s = self.engine.config().subscriptions.clone();
        let write_timeout = self.engine.config().http.write_timeout();
        let (sink, mut incoming) = socket.split();
        let mut sink = Some(sink);
        let mut writing: Option<BoxFuture<'static, (Option<Sink>, Option<PoolBytes>)>> = None;
        let mut closing: Option<(u16, &'static str)> = None;
        // Its place among the sockets (`subscriptions.max_connections`),
        // and what it holds however it is used (`standing.rs`).
        let place = self.engine.socket_place();
        let standing = Standing::open(self.memory.clone(), &self.parts.headers);
        if place.is_none() {
            closing = Some((close::TRY_AGAIN_LATER, SOCKETS_FULL));
        } else if standing.is_none() {
            closing = Some((close::TRY_AGAIN_LATER, SHARE_FULL));
        }
        self.standing = standing;
        let mut ping_due = false;
        let init_by = Instant::now() + s.init_timeout();
        let mut keepalive = tokio::time::interval_at(Instant::now() + s.keepalive(), s.keepalive());
        let lease = self.lease.clone();
        loop {
            if let Some(idle) = sink.take() {
                let frame = match closing {
                    Some((code, reason)) => Some((
                        Message::Close(Some(CloseFrame {
                            code,
                            reason: reason.into(),
                        })),
                        None,
                    )),
                    None => (self.outbox.next())
                        .map(|frame| (Message::Text(frame.text.into()), frame.held)),
                };
                let frame = frame.or_else(|| {
                    std::mem::take(&mut ping_due)
                        .then(|| (Message::Ping(bytes::Bytes::new()), None))
                });
                match frame {
                    Some((frame, held)) => {
                        let last = matches!(frame, Message::Close(_));
                        let write = write(idle, frame, write_timeout, last, held);
                        writing = Some(Box::pin(write));
                    }
                    None => sink = Some(idle),
                }
            }
            let reading = closing.is_none() && self.outbox.takes_replies();
            let resolving = closing.is_none() && !self.subscriptions.is_empty();
            let next = tokio::select! {
                biased;
                (written, held) = async { writing.as_mut().expect("guarded").await }, if writing.is_some() => {
                    writing = None;
                    if let Some(standing) = &mut self.standing {
                        standing.written(held);
                    }
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
                            self.small(self.protocol.keepalive());
                        }
                        Next::Go
                    }
                }
                message = incoming.next(), if reading => self.on_frame(message).await,
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
    async fn on_frame(&mut self, frame: Option<Result<Message, axum::Error>>) -> Next {
        self.heard = Instant::now();
        match frame {
            None | Some(Ok(Message::Close(_))) => Next::End,
            // Too large (tungstenite stops reading it at the bound), or not
            // a WebSocket frame at all.
            Some(Err(_)) => Next::Close(close::BAD_MESSAGE, "message too large or malformed"),
            Some(Ok(message)) if !self.holds(&message) => {
                Next::Close(close::TRY_AGAIN_LATER, SHARE_FULL)
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => Next::Go,
            Some(Ok(Message::Text(text))) => self.on_message(text.as_bytes()).await,
            Some(Ok(Message::Binary(bytes))) => self.on_message(&bytes).await,
        }
    }

    /// One protocol message.
    async fn on_message(&mut self, bytes: &[u8]) -> Next {
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
                let connection =
                    FanoutConnection::open(&self.engine, caller, &self.parts, self.memory.clone());
                // The caller is fixed: the upgrade's headers are no longer
                // needed (a client may have sent 360 KB of them).
                self.parts.headers = http::HeaderMap::new();
                if let Some(standing) = &mut self.standing {
                    standing.headers_dropped();
                }
                let mut data = Data::default();
                data.insert(connection);
                self.session = Some(Arc::new(data));
                if caller == Caller::Internal {
                    // Exempt from the per-IP limit, as over HTTP.
                    self.limit = None;
                }
                self.small(self.protocol.ack());
                Next::Go
            }
            ClientMessage::Start { id, payload } => {
                let Some(session) = &self.session else {
                    return Next::Close(close::UNAUTHORIZED, "Unauthorized");
                };
                if id.len() > MAX_ID_BYTES {
                    return Next::Close(close::BAD_MESSAGE, "a subscription id past 128 bytes");
                }
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
                    self.small(self.protocol.error(&id, &message, TOO_MANY_SUBSCRIPTIONS));
                    return Next::Go;
                }
                // Each operation is a request of the client's, under the
                // per-IP limit like one sent over HTTP.
                let session = session.clone();
                if let Some(limit) = &self.limit {
                    if let Err(refused) = limit.check().await {
                        let message = refused.to_string();
                        self.small(self.protocol.error(&id, &message, refused.code()));
                        return Next::Go;
                    }
                }
                // A persisted query's hash is looked up (or its text
                // checked and kept) as `FanoutGraphQL` does over HTTP,
                // before the text it runs is weighed.
                let mut payload = payload;
                if let Err(refusal) = self.engine.persisted().resolve(&mut payload) {
                    let answer = Response::from_errors(vec![operation_error(&refusal)]);
                    self.answer_refused(&id, &answer);
                    return Next::Go;
                }
                let Some(held) = self.memory.lease(SUBSCRIPTION_WEIGHT + id.len()) else {
                    let full = crate::error::refused(&self.overloaded());
                    self.answer_refused(&id, &full);
                    return Next::Go;
                };
                let events = self.executor.execute_stream(payload, Some(session));
                self.subscriptions.push(Subscription {
                    id,
                    events,
                    answered: false,
                    _held: held,
                });
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
                        self.small(self.protocol.complete(&id));
                    }
                    self.idle_if_none();
                }
                Next::Go
            }
            ClientMessage::ConnectionTerminate => Next::End,
            ClientMessage::Ping { .. } => {
                if let Some(pong) = self.protocol.pong() {
                    self.small(pong);
                }
                Next::Go
            }
            ClientMessage::Pong { .. } => Next::Go,
        }
    }

    /// Whether the connection's share holds what reading `message` needed
    /// (`standing.rs`).
    fn holds(&mut self, message: &Message) -> bool {
        let bytes = match message {
            Message::Text(text) => text.len(),
            Message::Binary(bytes) | Message::Ping(bytes) | Message::Pong(bytes) => bytes.len(),
            Message::Close(_) => 0,
        };
        (self.standing.as_mut()).is_none_or(|standing| standing.read(bytes))
    }

    /// An event of the subscription at `at`, or its end.
    fn on_event(&mut self, at: usize, event: Option<Response>) {
        let answered = std::mem::replace(&mut self.subscriptions[at].answered, true);
        let id = &self.subscriptions[at].id;
        let refused = match &event {
            Some(response) if !answered => self.protocol.refused(id, response),
            _ => None,
        };
        if let Some(error) = refused {
            // Refused before it ran: its `error` is its last message.
            let id = self.subscriptions.swap_remove(at).id;
            if !self.outbox.finish(&id, error) {
                let full = crate::error::refused(&self.overloaded());
                let small = self.protocol.refused(&id, &full).unwrap_or_default();
                self.outbox.finish_small(&id, small);
            }
            self.idle_if_none();
            return;
        }
        match event {
            Some(response) => {
                let protocol = self.protocol;
                let text = protocol.next(id, &response);
                drop(response);
                let full = self.overloaded();
                let overloaded = || protocol.next(id, &crate::error::refused(&full));
                if !self.outbox.event(id, text, overloaded) {
                    crate::metrics::subscription_event_dropped();
                }
            }
            None => {
                let id = self.subscriptions.swap_remove(at).id;
                let complete = self.protocol.complete(&id);
                self.outbox.finish_small(&id, complete);
                self.idle_if_none();
            }
        }
    }

    /// Answers subscribe `id`, refused before it ran with `answer`: an
    /// `error` message, or in the legacy protocol `data` then `complete`.
    fn answer_refused(&mut self, id: &str, answer: &Response) {
        let protocol = self.protocol;
        let full = crate::error::refused(&self.overloaded());
        match protocol.refused(id, answer) {
            Some(error) => {
                if !self.outbox.reply(error) {
                    self.small(protocol.refused(id, &full).unwrap_or_default());
                }
            }
            None => {
                if !self.outbox.reply(protocol.next(id, answer)) {
                    self.small(protocol.next(id, &full));
                }
                self.small(protocol.complete(id));
            }
        }
    }

    /// Queues a small reply (an ack, a pong, a short refusal), which waits
    /// whether or not the pool holds it: nothing the client waits for is
    /// dropped.
    fn small(&mut self, text: String) {
        self.outbox.reply_small(text);
    }

    /// What a frame or a subscription the client's share cannot hold is
    /// answered with.
    fn overloaded(&self) -> OperationError {
        OperationError::Overloaded {
            max: self.memory.max(),
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
/// failed, timed out, or was the `last` (a close); and `held`, the pool's
/// bytes the frame held while it was written (`standing.rs` keeps the
/// largest: the write buffer stays that large).
async fn write(
    mut sink: Sink,
    frame: Message,
    timeout: Duration,
    last: bool,
    held: Option<PoolBytes>,
) -> (Option<Sink>, Option<PoolBytes>) {
    match tokio::time::timeout(timeout, sink.send(frame)).await {
        Ok(Ok(())) if !last => (Some(sink), held),
        _ => (None, held),
    }
}

/// Why a connection is closed 1013: its client's share of the sockets'
/// memory is full.
const SHARE_FULL: &str = "this client's sockets hold their share of memory";

/// Why a connection is closed 1013: `subscriptions.max_connections` are open.
const SOCKETS_FULL: &str = "the server holds all the sockets it may";
