//! The protocol as a state machine, apart from the socket: what the client
//! sent and what the connection's timers say go in, what the connection
//! does comes out ([`Action`]: frames to write, subscriptions to start and
//! stop, a close with its code). Nothing here reads, writes, waits or runs
//! anything: the driver (`driver.rs`) does, and tells the machine what came
//! of it (an event, a subscription's end, an admission refused).
//!
//! The machine knows which ids are taken — from `subscribe` until the
//! subscription's last frame (`complete`, or `error`), its admission check
//! included — so a second `subscribe` with a taken id closes the
//! connection (4409), and `subscriptions.max_per_connection` counts them
//! all.

use super::message::{self, ClientMessage, Protocol};
use crate::error::{SocketClose, SocketRefusal};
use crate::inbound::serve::Wanted;
use async_graphql::{Request, Response};

/// The longest subscription id taken (graphql-ws sends UUIDs: 36 bytes).
const MAX_ID_BYTES: usize = 128;

/// One connection's protocol state.
pub(super) struct Machine {
    protocol: Protocol,
    /// `connection_init` came (and was acknowledged).
    initialised: bool,
    /// The ids of the subscriptions started and not yet over.
    taken: Vec<String>,
    /// `subscriptions.max_per_connection`.
    max_per_connection: usize,
}

/// What the connection does after a message.
#[derive(Debug)]
pub(super) enum Action {
    /// Nothing.
    Nothing,
    /// Write this (small) frame.
    Reply(String),
    /// A subscribe refused at once (`TOO_MANY_SUBSCRIPTIONS`): write this
    /// frame.
    Refuse(String),
    /// Fix the caller — the upgrade's, or the one `token` (the payload's
    /// internal token) names — open the connection's scope, then write
    /// `ack`.
    Init {
        /// The payload's internal token, if any.
        token: Option<String>,
        /// `connection_ack`.
        ack: String,
    },
    /// Start subscription `id` (its id now taken): check its admission,
    /// then run `payload`.
    Start {
        /// Its id.
        id: String,
        /// The operation.
        payload: Box<Request>,
    },
    /// Stop subscription `id` — its stream, or its admission still checked —
    /// and drop its waiting frames; then write `reply`, if any.
    Stop {
        /// Its id.
        id: String,
        /// The legacy protocol's `complete`.
        reply: Option<String>,
    },
    /// Close the connection.
    Close(SocketClose),
    /// The client ended the connection.
    End,
}

/// What a keep-alive tick does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Keepalive {
    /// Send a WebSocket ping frame, and `ka` (the legacy protocol's own
    /// keep-alive, once initialised).
    Ping {
        /// The legacy `ka`.
        ka: Option<String>,
    },
    /// The client went silent: close.
    Close(SocketClose),
}

/// The frame an event of a subscription makes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EventFrame {
    /// An event: `next` (`data` in the legacy protocol).
    Next(String),
    /// The operation was refused before it ran: its `error`, the last frame
    /// (its id is free again).
    Refused(String),
    /// The subscription is over: `complete` (its id is free again).
    Complete(String),
}

/// The frames answering a subscribe refused before it ran.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// graphql-transport-ws's `error`, the operation's last message.
    Error(String),
    /// The legacy protocol's: the answer as `data`, then `complete`.
    DataThenComplete(String, String),
}

impl Machine {
    /// A connection speaking `protocol`, at most `max_per_connection`
    /// subscriptions active.
    pub(super) fn new(protocol: Protocol, max_per_connection: usize) -> Self {
        Self {
            protocol,
            initialised: false,
            taken: Vec::new(),
            max_per_connection,
        }
    }

    /// The protocol spoken (its frames, `message.rs`).
    pub(super) fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether `connection_init` came.
    pub(super) fn initialised(&self) -> bool {
        self.initialised
    }

    /// Whether no subscription is started.
    pub(super) fn idle(&self) -> bool {
        self.taken.is_empty()
    }

    /// One protocol message (a text or binary frame's bytes).
    pub(super) fn message(&mut self, bytes: &[u8]) -> Action {
        let Ok(message) = ClientMessage::from_bytes(bytes) else {
            return Action::Close(SocketClose::NotAMessage);
        };
        let protocol = self.protocol;
        match message {
            ClientMessage::ConnectionInit { payload } => {
                if self.initialised {
                    return Action::Close(SocketClose::TooManyInits);
                }
                self.initialised = true;
                let token = message::init_token(payload.as_ref()).map(str::to_owned);
                let ack = protocol.ack();
                Action::Init { token, ack }
            }
            ClientMessage::Start { id, payload } => {
                if !self.initialised {
                    return Action::Close(SocketClose::Unauthorized);
                }
                if id.len() > MAX_ID_BYTES {
                    return Action::Close(SocketClose::IdTooLong);
                }
                if self.taken.contains(&id) {
                    return Action::Close(SocketClose::DuplicateId);
                }
                if self.taken.len() >= self.max_per_connection {
                    let refusal = SocketRefusal::TooManySubscriptions {
                        max: self.max_per_connection,
                    };
                    let error = protocol.error(&id, &refusal.message(), refusal.code());
                    return Action::Refuse(error);
                }
                self.taken.push(id.clone());
                let payload = Box::new(payload);
                Action::Start { id, payload }
            }
            ClientMessage::Stop { id } => {
                if !self.free(&id) {
                    return Action::Nothing;
                }
                let reply = protocol.confirms_stop().then(|| protocol.complete(&id));
                Action::Stop { id, reply }
            }
            ClientMessage::ConnectionTerminate => Action::End,
            ClientMessage::Ping { .. } => protocol.pong().map_or(Action::Nothing, Action::Reply),
            ClientMessage::Pong { .. } => Action::Nothing,
        }
    }

    /// A keep-alive interval passed; `silent`: the client was heard from in
    /// none of the last three.
    pub(super) fn keepalive(&self, silent: bool) -> Keepalive {
        if silent {
            return Keepalive::Close(SocketClose::Silent);
        }
        let legacy = self.protocol == Protocol::Legacy && self.initialised;
        let ka = legacy.then(|| self.protocol.keepalive());
        Keepalive::Ping { ka }
    }

    /// `subscriptions.init_timeout_ms` passed: closed, unless initialised.
    pub(super) fn init_timeout(&self) -> Option<SocketClose> {
        (!self.initialised).then_some(SocketClose::InitTimeout)
    }

    /// The connection table wants this socket's slot (`inbound/serve.rs`):
    /// closed when the server stops, or for a newcomer when idle.
    pub(super) fn wanted(&self, wanted: Wanted) -> Option<SocketClose> {
        match wanted {
            Wanted::Stop => Some(SocketClose::ServerStopping),
            Wanted::Slot if self.idle() => Some(SocketClose::SlotWanted),
            Wanted::Slot => None,
        }
    }

    /// Subscription `id`'s event (`None`: its stream ended); `first`: the
    /// first it made, which, when its operation was refused before it ran,
    /// is answered as a refusal (`Protocol::refused`).
    pub(super) fn event(&mut self, id: &str, first: bool, event: Option<&Response>) -> EventFrame {
        let protocol = self.protocol;
        let Some(response) = event else {
            self.free(id);
            return EventFrame::Complete(protocol.complete(id));
        };
        let refused = if first {
            protocol.refused(id, response)
        } else {
            None
        };
        match refused {
            Some(error) => {
                self.free(id);
                EventFrame::Refused(error)
            }
            None => EventFrame::Next(protocol.next(id, response)),
        }
    }

    /// Subscription `id` refused before it ran with `answer` (a persisted
    /// query not found, the sockets' memory full): its id is free again.
    pub(super) fn refused(&mut self, id: &str, answer: &Response) -> Refusal {
        self.free(id);
        let protocol = self.protocol;
        match protocol.refused(id, answer) {
            Some(error) => Refusal::Error(error),
            None => Refusal::DataThenComplete(protocol.next(id, answer), protocol.complete(id)),
        }
    }

    /// Subscription `id` refused by its admission check, `code` and
    /// `message`: its `error` frame; its id is free again.
    pub(super) fn refused_at_check(&mut self, id: &str, message: &str, code: &str) -> String {
        self.free(id);
        self.protocol.error(id, message, code)
    }

    /// Frees `id`; whether it was taken.
    fn free(&mut self, id: &str) -> bool {
        let at = self.taken.iter().position(|taken| taken == id);
        at.map(|at| self.taken.swap_remove(at)).is_some()
    }
}

#[cfg(test)]
mod tests;
