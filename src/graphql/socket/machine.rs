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
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn machine(protocol: Protocol) -> Machine {
        Machine::new(protocol, 2)
    }

    fn send(machine: &mut Machine, message: Value) -> Action {
        machine.message(message.to_string().as_bytes())
    }

    fn init(machine: &mut Machine) {
        let init = json!({ "type": "connection_init" });
        assert!(matches!(
            send(machine, init),
            Action::Init { token: None, .. }
        ));
    }

    fn subscribe(machine: &mut Machine, id: &str) -> Action {
        let payload = json!({ "query": "subscription { ticks }" });
        let ty = match machine.protocol() {
            Protocol::TransportWs => "subscribe",
            Protocol::Legacy => "start",
        };
        send(machine, json!({ "type": ty, "id": id, "payload": payload }))
    }

    fn closed(action: Action) -> (u16, &'static str) {
        match action {
            Action::Close(close) => close.frame(),
            other => panic!("not closed: {other:?}"),
        }
    }

    fn json_of(frame: &str) -> Value {
        serde_json::from_str(frame).unwrap()
    }

    #[test]
    fn init_is_acknowledged_once_with_the_payloads_token() {
        let mut m = machine(Protocol::TransportWs);
        assert!(!m.initialised());
        let init = json!({ "type": "connection_init", "payload": { "x-internal-token": "t" } });
        match send(&mut m, init.clone()) {
            Action::Init { token, ack } => {
                assert_eq!(token.as_deref(), Some("t"));
                assert_eq!(json_of(&ack), json!({ "type": "connection_ack" }));
            }
            other => panic!("{other:?}"),
        }
        assert!(m.initialised());
        assert_eq!(m.init_timeout(), None);
        assert_eq!(closed(send(&mut m, init)).0, 4429);
    }

    #[test]
    fn violations_close_with_their_codes() {
        let mut m = machine(Protocol::TransportWs);
        assert_eq!(m.init_timeout(), Some(SocketClose::InitTimeout));
        assert_eq!(m.init_timeout().unwrap().frame().0, 4408);
        assert_eq!(closed(subscribe(&mut m, "a")).0, 4401, "before the ack");
        assert_eq!(closed(m.message(b"{not json")).0, 4400);
        init(&mut m);
        assert_eq!(closed(subscribe(&mut m, &"x".repeat(129))).0, 4400);
        assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
        assert_eq!(closed(subscribe(&mut m, "a")).0, 4409, "a taken id");
    }

    #[test]
    fn past_max_per_connection_one_is_refused_and_its_id_stays_free() {
        let mut m = machine(Protocol::TransportWs);
        init(&mut m);
        assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
        assert!(matches!(subscribe(&mut m, "b"), Action::Start { .. }));
        let Action::Refuse(error) = subscribe(&mut m, "c") else {
            panic!("not refused");
        };
        let error = json_of(&error);
        assert_eq!(error["type"], "error");
        assert_eq!(error["id"], "c");
        assert_eq!(
            error["payload"][0]["extensions"]["code"],
            "TOO_MANY_SUBSCRIPTIONS"
        );
        // b refused by its admission check: its id, and a place, are free.
        let frame = m.refused_at_check("b", "too many requests", "RATE_LIMITED");
        assert_eq!(
            json_of(&frame)["payload"][0]["extensions"]["code"],
            "RATE_LIMITED"
        );
        assert!(matches!(subscribe(&mut m, "c"), Action::Start { .. }));
        assert!(matches!(subscribe(&mut m, "b"), Action::Refuse(_)));
    }

    #[test]
    fn a_stop_frees_its_id_and_only_the_legacy_protocol_confirms_it() {
        for (protocol, stop, confirms) in [
            (Protocol::TransportWs, "complete", false),
            (Protocol::Legacy, "stop", true),
        ] {
            let mut m = machine(protocol);
            init(&mut m);
            assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
            assert!(!m.idle());
            match send(&mut m, json!({ "type": stop, "id": "a" })) {
                Action::Stop { id, reply } => {
                    assert_eq!(id, "a");
                    assert_eq!(reply.is_some(), confirms, "{protocol:?}");
                }
                other => panic!("{other:?}"),
            }
            assert!(m.idle());
            let again = send(&mut m, json!({ "type": stop, "id": "a" }));
            assert!(matches!(again, Action::Nothing), "not taken any more");
            assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
        }
    }

    #[test]
    fn pings_keepalives_and_the_end() {
        let mut m = machine(Protocol::TransportWs);
        let Action::Reply(pong) = send(&mut m, json!({ "type": "ping" })) else {
            panic!("no pong");
        };
        assert_eq!(json_of(&pong), json!({ "type": "pong" }));
        assert!(matches!(
            send(&mut m, json!({ "type": "pong" })),
            Action::Nothing
        ));
        assert_eq!(m.keepalive(false), Keepalive::Ping { ka: None });
        assert_eq!(m.keepalive(true), Keepalive::Close(SocketClose::Silent));
        assert_eq!(SocketClose::Silent.frame().0, 1001);
        let terminate = json!({ "type": "connection_terminate" });
        assert!(matches!(send(&mut m, terminate), Action::End));

        let mut legacy = machine(Protocol::Legacy);
        assert_eq!(legacy.keepalive(false), Keepalive::Ping { ka: None });
        init(&mut legacy);
        let Keepalive::Ping { ka: Some(ka) } = legacy.keepalive(false) else {
            panic!("no ka");
        };
        assert_eq!(json_of(&ka), json!({ "type": "ka" }));
    }

    #[test]
    fn an_idle_connection_gives_its_slot_and_every_one_goes_when_the_server_stops() {
        let mut m = machine(Protocol::TransportWs);
        init(&mut m);
        assert_eq!(m.wanted(Wanted::Slot), Some(SocketClose::SlotWanted));
        assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
        assert_eq!(m.wanted(Wanted::Slot), None);
        assert_eq!(m.wanted(Wanted::Stop), Some(SocketClose::ServerStopping));
    }

    #[test]
    fn events_are_next_a_first_answer_refused_before_running_is_the_last_frame() {
        let refused = Response::from_errors(vec![async_graphql::ServerError::new(
            "does not validate",
            None,
        )]);
        let ran = Response::new(async_graphql::Value::from(1));
        for protocol in [Protocol::TransportWs, Protocol::Legacy] {
            let mut m = machine(protocol);
            init(&mut m);
            assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
            let EventFrame::Next(next) = m.event("a", true, Some(&ran)) else {
                panic!("not an event");
            };
            assert_eq!(json_of(&next)["id"], "a");
            // Not its first: an answer without data is an event.
            assert!(matches!(
                m.event("a", false, Some(&refused)),
                EventFrame::Next(_)
            ));
            let first = m.event("a", true, Some(&refused));
            match protocol {
                Protocol::TransportWs => {
                    let EventFrame::Refused(error) = first else {
                        panic!("{first:?}");
                    };
                    assert_eq!(json_of(&error)["type"], "error");
                    assert!(m.idle(), "its id is free");
                }
                Protocol::Legacy => {
                    assert!(matches!(first, EventFrame::Next(_)));
                    let end = m.event("a", false, None);
                    let EventFrame::Complete(complete) = end else {
                        panic!("{end:?}");
                    };
                    assert_eq!(json_of(&complete), json!({ "type": "complete", "id": "a" }));
                    assert!(m.idle());
                }
            }
        }
    }

    #[test]
    fn a_subscribe_refused_before_it_ran_is_an_error_or_legacy_data_then_complete() {
        let answer = Response::from_errors(vec![async_graphql::ServerError::new(
            "PersistedQueryNotFound",
            None,
        )]);
        let mut m = machine(Protocol::TransportWs);
        init(&mut m);
        assert!(matches!(subscribe(&mut m, "a"), Action::Start { .. }));
        let Refusal::Error(error) = m.refused("a", &answer) else {
            panic!("no error");
        };
        assert_eq!(json_of(&error)["type"], "error");
        assert!(m.idle());

        let mut legacy = machine(Protocol::Legacy);
        init(&mut legacy);
        assert!(matches!(subscribe(&mut legacy, "a"), Action::Start { .. }));
        let Refusal::DataThenComplete(data, complete) = legacy.refused("a", &answer) else {
            panic!("not data then complete");
        };
        assert_eq!(json_of(&data)["type"], "data");
        assert_eq!(json_of(&complete)["type"], "complete");
        assert!(legacy.idle());
    }
}
