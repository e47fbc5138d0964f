//! The protocol's state machine, driven without a socket.

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
