//! One connection's driver: a task that does the connection's I/O — reads
//! the client's frames, writes one frame at a time, keeps the timers, runs
//! each subscription's admission check and its events — and hands what
//! happens to the protocol's state machine (`machine.rs`), doing what it
//! answers (the walk is in `socket.rs`).
//!
//! Nothing it waits for stalls the rest: a subscribe's admission check (the
//! per-IP limit, which may ask Redis) is polled beside the subscriptions'
//! events, so while it waits the socket still writes, answers pings and
//! reads the client's messages.

use super::connection::FanoutConnection;
use super::machine::{Action, EventFrame, Keepalive, Machine, Refusal};
use super::outbox::Outbox;
use super::standing::Standing;
use super::subscriptions::{Ready, Subscriptions, SUBSCRIPTION_WEIGHT};
use crate::engine::Engine;
use crate::error::{operation_error, OperationError, Rejection, SocketClose};
use crate::inbound::identity::Caller;
use crate::inbound::limiter::SocketLimit;
use crate::inbound::serve::ConnectionLease;
use crate::memory::{MemoryPool, PoolBytes};
use async_graphql::{Data, Executor, Request, Response};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::future::BoxFuture;
use futures::stream::{SplitSink, StreamExt};
use futures::{FutureExt, SinkExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Bytes tungstenite reads at a time (its default, 128 KiB, would be most
/// of an idle connection's memory).
pub(super) const READ_BUFFER: usize = 4096;

/// Keep-alive intervals without a word from the client before it is closed.
const SILENT_INTERVALS: u32 = 3;

/// One connection's state, driven by one task.
pub(super) struct Driver<E> {
    executor: E,
    engine: Engine,
    /// The protocol's state.
    machine: Machine,
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
    subscriptions: Subscriptions,
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
    Close(SocketClose),
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
        protocol: super::message::Protocol,
        mut parts: http::request::Parts,
    ) -> Self {
        let lease = parts.extensions.remove::<ConnectionLease>();
        // A `FanoutLayer`'s scope for the upgrade request itself: each event
        // has its own.
        parts.extensions.remove::<crate::request::FanoutRequest>();
        let limit = parts.extensions.remove::<SocketLimit>();
        let caller = (parts.extensions.get::<Caller>().copied())
            .unwrap_or_else(|| engine.identify(&parts.headers));
        let s = &engine.config().subscriptions;
        let machine = Machine::new(protocol, s.max_per_connection);
        let memory = engine.socket_share(&parts);
        let outbox = Outbox::new(s.max_pending_events, memory.clone());
        Self {
            executor,
            engine,
            machine,
            caller,
            parts,
            lease,
            limit,
            session: None,
            subscriptions: Subscriptions::default(),
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
        let mut closing: Option<SocketClose> = None;
        // Its place among the sockets (`subscriptions.max_connections`),
        // and what it holds however it is used (`standing.rs`).
        let place = self.engine.socket_place();
        let standing = Standing::open(self.memory.clone(), &self.parts.headers);
        if place.is_none() {
            closing = Some(SocketClose::SocketsFull);
        } else if standing.is_none() {
            closing = Some(SocketClose::ShareFull);
        }
        self.standing = standing;
        let mut ping_due = false;
        let init_by = Instant::now() + s.init_timeout();
        let mut keepalive = tokio::time::interval_at(Instant::now() + s.keepalive(), s.keepalive());
        let lease = self.lease.clone();
        loop {
            if let Some(idle) = sink.take() {
                let frame = match closing {
                    Some(close) => {
                        let (code, reason) = close.frame();
                        let reason = reason.into();
                        Some((Message::Close(Some(CloseFrame { code, reason })), None))
                    }
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
            let initialised = self.machine.initialised();
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
                    self.machine.wanted(wanted).map_or(Next::Go, Next::Close)
                }
                () = tokio::time::sleep_until(init_by), if !initialised && closing.is_none() => {
                    self.machine.init_timeout().map_or(Next::Go, Next::Close)
                }
                _ = keepalive.tick(), if closing.is_none() => {
                    let silent = self.heard.elapsed() > s.keepalive() * SILENT_INTERVALS;
                    match self.machine.keepalive(silent) {
                        Keepalive::Close(close) => Next::Close(close),
                        Keepalive::Ping { ka } => {
                            ping_due = true;
                            if let Some(ka) = ka {
                                self.small(ka);
                            }
                            Next::Go
                        }
                    }
                }
                message = incoming.next(), if reading => self.on_frame(message),
                ready = self.subscriptions.next(), if resolving => {
                    match ready {
                        Ready::Checked { id, payload, checked } => self.on_checked(id, payload, checked),
                        Ready::Event { at, first, event } => {
                            self.on_event(at, first, event);
                            // A subscription whose events are always ready
                            // would otherwise keep this task running for
                            // good: the runtime's other tasks (and its
                            // timers, the write timeout's included) would
                            // wait.
                            tokio::task::coop::consume_budget().await;
                        }
                    }
                    Next::Go
                }
            };
            match next {
                Next::Go => {}
                Next::Close(close) => closing = Some(close),
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
            Some(Err(_)) => Next::Close(SocketClose::Malformed),
            Some(Ok(message)) if !self.holds(&message) => Next::Close(SocketClose::ShareFull),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => Next::Go,
            Some(Ok(Message::Text(text))) => self.on_message(text.as_bytes()),
            Some(Ok(Message::Binary(bytes))) => self.on_message(&bytes),
        }
    }

    /// One protocol message: what the machine answers, done.
    fn on_message(&mut self, bytes: &[u8]) -> Next {
        match self.machine.message(bytes) {
            Action::Nothing => Next::Go,
            Action::Reply(frame) => {
                self.small(frame);
                Next::Go
            }
            Action::Refuse(frame) => {
                crate::metrics::subscription_refused();
                self.small(frame);
                Next::Go
            }
            Action::Init { token, ack } => {
                self.init(token.as_deref());
                self.small(ack);
                Next::Go
            }
            Action::Start { id, payload } => {
                self.start(id, payload);
                Next::Go
            }
            Action::Stop { id, reply } => {
                self.subscriptions.stop(&id);
                self.outbox.forget(&id);
                if let Some(reply) = reply {
                    self.small(reply);
                }
                self.idle_if_none();
                Next::Go
            }
            Action::Close(close) => Next::Close(close),
            Action::End => Next::End,
        }
    }

    /// `connection_init`: the caller fixed (`token`: the payload's internal
    /// token) and the connection's scope opened.
    fn init(&mut self, token: Option<&str>) {
        let caller = match (self.caller, token) {
            (Caller::Internal, _) => Caller::Internal,
            (Caller::Public, Some(token)) => self.engine.identify_token(token),
            (Caller::Public, None) => Caller::Public,
        };
        let connection =
            FanoutConnection::open(&self.engine, caller, &self.parts, self.memory.clone());
        // The caller is fixed: the upgrade's headers are no longer needed
        // (a client may have sent 360 KB of them).
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
    }

    /// Subscription `id` started with `payload`: a public caller's
    /// operation is a request of its client's, under the per-IP limit like
    /// one sent over HTTP — checked beside everything else the socket does,
    /// what the parsed subscribe holds (`held::waiting`) taken from the pool
    /// meanwhile; then it runs.
    fn start(&mut self, id: String, payload: Box<Request>) {
        let Some(limit) = self.limit.clone() else {
            return self.run_subscription(id, payload);
        };
        let weight = SUBSCRIPTION_WEIGHT + id.len() + super::held::waiting(&payload);
        let Some(held) = self.memory.lease(weight) else {
            let full = crate::error::refused(&self.overloaded());
            return self.answer_refused(&id, &full);
        };
        let check = async move { limit.check().await }.boxed();
        self.subscriptions.checking(id, check, payload, held);
        if let Some(lease) = &self.lease {
            lease.busy();
        }
    }

    /// The admission check of subscription `id` answered `checked`.
    fn on_checked(&mut self, id: String, payload: Box<Request>, checked: Result<(), Rejection>) {
        match checked {
            Ok(()) => self.run_subscription(id, payload),
            Err(refused) => {
                let message = refused.to_string();
                let frame = self.machine.refused_at_check(&id, &message, refused.code());
                self.small(frame);
                self.idle_if_none();
            }
        }
    }

    /// Runs subscription `id`, admitted: a persisted query's hash is looked
    /// up (or its text checked and kept) as `FanoutGraphQL` does over HTTP,
    /// what the driver keeps of it is taken from the pool, and the operation
    /// runs on the executor with the connection in its session data.
    fn run_subscription(&mut self, id: String, mut payload: Box<Request>) {
        let session = self.session.clone().expect("started once initialised");
        if let Err(refusal) = self.engine.persisted().resolve(&mut payload) {
            let answer = Response::from_errors(vec![operation_error(&refusal)]);
            self.answer_refused(&id, &answer);
            return self.idle_if_none();
        }
        let Some(held) = self.memory.lease(SUBSCRIPTION_WEIGHT + id.len()) else {
            let full = crate::error::refused(&self.overloaded());
            self.answer_refused(&id, &full);
            return self.idle_if_none();
        };
        let events = self.executor.execute_stream(*payload, Some(session));
        self.subscriptions.running(id, events, held);
        if let Some(lease) = &self.lease {
            lease.busy();
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

    /// An event of the subscription at `at` (`first`: its first), or its
    /// end.
    fn on_event(&mut self, at: usize, first: bool, event: Option<Response>) {
        let id = self.subscriptions.id(at);
        let protocol = self.machine.protocol();
        let frame = self.machine.event(id, first, event.as_ref());
        drop(event);
        match frame {
            EventFrame::Next(text) => {
                let full = self.overloaded();
                let overloaded = || protocol.next(id, &crate::error::refused(&full));
                if !self.outbox.event(id, text, overloaded) {
                    crate::metrics::subscription_event_dropped();
                }
            }
            // Refused before it ran: its `error` is its last message.
            EventFrame::Refused(error) => {
                let id = self.subscriptions.remove(at);
                if !self.outbox.finish(&id, error) {
                    let full = crate::error::refused(&self.overloaded());
                    let small = protocol.refused(&id, &full).unwrap_or_default();
                    self.outbox.finish_small(&id, small);
                }
                self.idle_if_none();
            }
            EventFrame::Complete(complete) => {
                let id = self.subscriptions.remove(at);
                self.outbox.finish_small(&id, complete);
                self.idle_if_none();
            }
        }
    }

    /// Answers subscribe `id`, refused before it ran with `answer`: an
    /// `error` message, or in the legacy protocol `data` then `complete`
    /// (a small one saying `OVERLOADED` when the pool cannot hold it).
    fn answer_refused(&mut self, id: &str, answer: &Response) {
        let protocol = self.machine.protocol();
        let full = crate::error::refused(&self.overloaded());
        match self.machine.refused(id, answer) {
            Refusal::Error(error) => {
                if !self.outbox.reply(error) {
                    self.small(protocol.refused(id, &full).unwrap_or_default());
                }
            }
            Refusal::DataThenComplete(data, complete) => {
                if !self.outbox.reply(data) {
                    self.small(protocol.next(id, &full));
                }
                self.small(complete);
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
