//! A subscribe's admission check — the per-IP limit, which asks a shared
//! backend (Redis) — is slow only for that subscribe: while it waits, the
//! same socket still answers pings and writes its other subscriptions'
//! events, and the subscribe starts once its check answers.
//!
//! The check is a gate the test holds: it reports when a check is waiting
//! and lets it through when told (no sleeps).

use async_graphql::{Context, EmptyMutation, Object, Schema, Subscription};
use fanout_budget::config::FailureMode;
use fanout_budget::error::Unavailable;
use fanout_budget::inbound::{Decision, InboundLimiter, RateLimitLayer};
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::ws::{connect_from, init, receive, send, subscribe};
use futures::future::BoxFuture;
use futures::Stream;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Generous: a frame that flows arrives in milliseconds; one that a stalled
/// socket holds back never does.
const FLOWS_WITHIN: Duration = Duration::from_secs(10);

/// A shared limiter whose first `free` checks answer at once; each later
/// one reports that it waits and waits for a permit of `gate`, and reports
/// when it is dropped before it answered. Let through while `down`, it
/// answers as a shared backend that is unreachable.
struct Gated {
    free: AtomicUsize,
    waiting: mpsc::UnboundedSender<()>,
    dropped: mpsc::UnboundedSender<()>,
    gate: Arc<Semaphore>,
    down: Arc<AtomicBool>,
}

/// Reports its drop unless disarmed.
struct OnDrop(Option<mpsc::UnboundedSender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(dropped) = self.0.take() {
            let _ = dropped.send(());
        }
    }
}

impl InboundLimiter for Gated {
    fn check(&self, _key: IpAddr) -> BoxFuture<'_, Result<Decision, Unavailable>> {
        Box::pin(async move {
            let free = self.free.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
            if free.is_err() {
                let mut unanswered = OnDrop(Some(self.dropped.clone()));
                let _ = self.waiting.send(());
                self.gate.acquire().await.expect("open").forget();
                unanswered.0 = None;
                if self.down.load(SeqCst) {
                    let message = "connection refused".into();
                    return Err(Unavailable { message });
                }
            }
            Ok(Decision::Allow {
                remaining: 100,
                reset: Duration::ZERO,
            })
        })
    }
}

struct Query;

#[Object]
impl Query {
    async fn hello(&self) -> u64 {
        1
    }
}

/// The ticks the test sends, and a word each time a subscriber listens.
struct Ticks {
    sender: broadcast::Sender<u64>,
    listening: mpsc::UnboundedSender<()>,
}

struct Ticking;

#[Subscription]
impl Ticking {
    /// Every tick the test sends from now on.
    async fn ticks(&self, ctx: &Context<'_>) -> impl Stream<Item = u64> {
        let ticks = ctx.data_unchecked::<Ticks>();
        let receiver = ticks.sender.subscribe();
        let _ = ticks.listening.send(());
        futures::stream::unfold(receiver, |mut receiver| async move {
            let tick = receiver.recv().await.ok()?;
            Some((tick, receiver))
        })
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// The next message within [`FLOWS_WITHIN`], or what held it back.
async fn flows(socket: &mut Socket, what: &str) -> Value {
    match tokio::time::timeout(FLOWS_WITHIN, receive(socket)).await {
        Ok(Ok(message)) => message,
        Ok(Err(code)) => panic!("closed ({code:?}) waiting for {what}"),
        Err(_) => panic!("{what} did not come while another subscribe's check waited"),
    }
}

/// A connection to `address` from loopback speaking `protocol`.
async fn connect_as(address: std::net::SocketAddr, protocol: &str) -> Socket {
    if protocol == "graphql-transport-ws" {
        return connect_from(address, Ipv4Addr::LOCALHOST).await.unwrap();
    }
    let mut request = format!("ws://{address}/graphql")
        .into_client_request()
        .unwrap();
    let header = protocol.parse().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", header);
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (socket, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    socket
}

/// A server whose per-IP limit is [`Gated`] (the upgrade and the first
/// `free - 1` subscribes pass at once), and a socket on it, initialised.
struct Fixture {
    socket: Socket,
    /// A word each time a check waits at the gate.
    waiting: mpsc::UnboundedReceiver<()>,
    /// A word each time a waiting check is dropped unanswered.
    dropped: mpsc::UnboundedReceiver<()>,
    gate: Arc<Semaphore>,
    ticks: broadcast::Sender<u64>,
    /// A word each time a subscription listens to the ticks.
    listening: mpsc::UnboundedReceiver<()>,
    /// Checks let through answer as if Redis were down (`failure_mode =
    /// "closed"`: refused).
    down: Arc<AtomicBool>,
    engine: Engine,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn fixture(free: usize) -> Fixture {
    fixture_with(free, Config::default(), "graphql-transport-ws").await
}

/// [`fixture`] with `config`, its socket speaking `protocol`.
async fn fixture_with(free: usize, config: Config, protocol: &str) -> Fixture {
    let engine = Engine::new(config.clone());
    let (waiting_tx, waiting) = mpsc::unbounded_channel();
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let down = Arc::new(AtomicBool::new(false));
    let limiter = Gated {
        free: AtomicUsize::new(free),
        waiting: waiting_tx,
        dropped: dropped_tx,
        gate: gate.clone(),
        down: down.clone(),
    };
    let (ticks, _) = broadcast::channel(16);
    let (listening_tx, listening) = mpsc::unbounded_channel();
    let schema = Schema::build(Query, EmptyMutation, Ticking)
        .extension(FanoutExtension::new(&engine))
        .data(Ticks {
            sender: ticks.clone(),
            listening: listening_tx,
        })
        .finish();
    let layer =
        RateLimitLayer::new(&config.rate_limit).shared(Arc::new(limiter), FailureMode::Closed);
    let router = axum::Router::new()
        .route_service("/graphql", FanoutGraphQL::new(schema, engine.clone()))
        .route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let server = tokio::spawn(async move {
        let _ = serving.await;
    });
    let mut socket = connect_as(address, protocol).await;
    init(&mut socket, json!({})).await;
    Fixture {
        socket,
        waiting,
        dropped,
        gate,
        ticks,
        listening,
        down,
        engine,
        server,
    }
}

#[tokio::test]
async fn a_slow_admission_check_stalls_neither_pongs_nor_other_subscriptions() {
    // The upgrade and the first subscribe pass at once.
    let mut f = fixture(2).await;
    let Fixture {
        socket,
        waiting,
        gate,
        ticks: sender,
        listening,
        ..
    } = &mut f;
    let socket = &mut *socket;
    subscribe(socket, "a", "subscription { ticks }").await;
    listening.recv().await.expect("a listens");

    // b's check waits at the gate.
    subscribe(socket, "b", "subscription { ticks }").await;
    waiting.recv().await.expect("b's check waits");

    // Meanwhile the socket answers a ping …
    send(socket, json!({ "type": "ping" })).await;
    let pong = flows(socket, "a pong").await;
    assert_eq!(pong, json!({ "type": "pong" }));
    // … and writes a's events.
    sender.send(1).unwrap();
    let event = flows(socket, "a's event").await;
    assert_eq!(event["type"], "next", "{event}");
    assert_eq!(event["id"], "a", "{event}");
    assert_eq!(event["payload"]["data"]["ticks"], 1, "{event}");

    // Its check answered, b starts.
    gate.add_permits(1);
    listening.recv().await.expect("b listens");
    sender.send(2).unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let event = flows(socket, "the second tick").await;
        assert_eq!(event["type"], "next", "{event}");
        assert_eq!(event["payload"]["data"]["ticks"], 2, "{event}");
        ids.push(event["id"].as_str().unwrap().to_owned());
    }
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
}

#[tokio::test]
async fn a_subscribe_stopped_while_its_check_waits_is_dropped_with_its_check_and_its_id_freed() {
    // The upgrade passes at once.
    let mut f = fixture(1).await;
    subscribe(&mut f.socket, "b", "subscription { ticks }").await;
    f.waiting.recv().await.expect("b's check waits");
    send(&mut f.socket, json!({ "type": "complete", "id": "b" })).await;
    let dropped = tokio::time::timeout(FLOWS_WITHIN, f.dropped.recv()).await;
    assert!(
        matches!(dropped, Ok(Some(()))),
        "the stopped subscribe's check goes with it"
    );
    // Its id is free: b again, its check let through, runs.
    f.gate.add_permits(1);
    subscribe(&mut f.socket, "b", "subscription { ticks }").await;
    f.waiting.recv().await.expect("b's new check");
    f.listening.recv().await.expect("b listens");
    f.ticks.send(7).unwrap();
    let event = flows(&mut f.socket, "b's event").await;
    assert_eq!(event["type"], "next", "{event}");
    assert_eq!(event["id"], "b", "{event}");
    assert_eq!(event["payload"]["data"]["ticks"], 7, "{event}");
}

// ---- What a waiting subscribe holds, and what a hostile client does
// ---- while checks wait.

/// Items of the list a hostile subscribe sends as a variable: each a
/// 2-byte `0,` in its frame, a whole `Value` once parsed.
const ITEMS: usize = 30_000;

/// A subscribe (`start` in the legacy protocol) as `id` whose frame
/// (60 KB, under `max_message_bytes`) parses into [`ITEMS`] values.
fn large(protocol: &str, id: &str) -> Value {
    let ty = if protocol == "graphql-ws" {
        "start"
    } else {
        "subscribe"
    };
    let variables = json!({ "v": vec![0; ITEMS] });
    let payload = json!({ "query": "subscription { ticks }", "variables": variables });
    json!({ "type": ty, "id": id, "payload": payload })
}

/// The code of a refusal, as either protocol frames it (an `error`'s
/// payload, a list in graphql-transport-ws, one error in the legacy
/// protocol; or the legacy `data` of an answer refused before it ran).
fn code(message: &Value) -> &str {
    let payload = &message["payload"];
    let error = match payload {
        Value::Array(errors) => &errors[0],
        _ if payload["errors"].is_array() => &payload["errors"][0],
        _ => payload,
    };
    error["extensions"]["code"].as_str().unwrap_or_default()
}

/// A `ping` and its `pong`: every message sent before it has been acted on
/// (the driver reads one message at a time); what came meanwhile.
async fn settle(socket: &mut Socket) -> Vec<Value> {
    send(socket, json!({ "type": "ping" })).await;
    let mut before = Vec::new();
    loop {
        let message = flows(socket, "a pong").await;
        if message["type"] == "pong" {
            return before;
        }
        before.push(message);
    }
}

/// What the socket holds once it has read a message larger than any the
/// test sends (a socket keeps what its largest message needed,
/// `standing.rs`): the baseline its subscribes' charges go back to.
async fn warmed(f: &mut Fixture, protocol: &str) -> usize {
    let before = f.engine.socket_bytes();
    let pad = "x".repeat(62_000);
    send(
        &mut f.socket,
        json!({ "type": "ping", "payload": { "pad": pad } }),
    )
    .await;
    if protocol == "graphql-transport-ws" {
        assert_eq!(flows(&mut f.socket, "a pong").await["type"], "pong");
    }
    let until = tokio::time::Instant::now() + FLOWS_WITHIN;
    loop {
        let held = f.engine.socket_bytes();
        if held > before + 60_000 {
            return held;
        }
        assert!(tokio::time::Instant::now() < until, "the padded ping read");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a socket keeps of the largest frame it wrote (`standing.rs`: its
/// write buffer stays that large) after the warm-up: its refusals and
/// `complete`s, a few hundred bytes — less than what any subscription is
/// charged, so a charge that stays is seen.
const WRITTEN: usize = 400;

/// What the sockets' pool holds once it is back to `base` (give or take
/// the largest frame written, [`WRITTEN`]) — the driver gives back as it
/// drops what it held — or after [`FLOWS_WITHIN`].
async fn held_back_to(engine: &Engine, base: usize) -> usize {
    let until = tokio::time::Instant::now() + FLOWS_WITHIN;
    loop {
        let held = engine.socket_bytes();
        if (base..=base + WRITTEN).contains(&held) || tokio::time::Instant::now() > until {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts the sockets' pool goes back to `base` ([`held_back_to`]).
async fn assert_back_to(engine: &Engine, base: usize, after: &str) {
    let held = held_back_to(engine, base).await;
    assert!(
        (base..=base + WRITTEN).contains(&held),
        "{after}: {held} held, {base} before"
    );
}

#[tokio::test]
async fn waiting_subscribes_are_charged_what_their_frames_hold_bounded_by_the_share() {
    // The upgrade passes at once; every subscribe's check waits.
    let mut f = fixture(1).await;
    let share = Config::default().subscriptions.max_bytes_per_client;
    let base = warmed(&mut f, "graphql-transport-ws").await;
    send(&mut f.socket, large("graphql-transport-ws", "s0")).await;
    f.waiting.recv().await.expect("s0's check waits");
    let parsed = ITEMS * std::mem::size_of::<async_graphql::Value>();
    let charged = f.engine.socket_bytes() - base;
    assert!(
        charged >= parsed,
        "a waiting subscribe holds its {ITEMS} parsed values ({parsed} bytes) and is charged {charged}"
    );
    // More, each 60 KB on the wire: refused OVERLOADED once the share is
    // spent, before `max_per_connection` (16) would refuse them.
    let mut waiting = vec!["s0".to_owned()];
    let refused = loop {
        let id = format!("s{}", waiting.len());
        assert!(
            waiting.len() < 16,
            "16 waiting subscribes of {parsed} bytes each"
        );
        send(&mut f.socket, large("graphql-transport-ws", &id)).await;
        let answered = settle(&mut f.socket).await;
        if let Some(refused) = answered.into_iter().find(|m| m["id"] == id.as_str()) {
            break refused;
        }
        waiting.push(id);
    };
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(code(&refused), "OVERLOADED", "{refused}");
    assert!(
        f.engine.socket_bytes() <= share,
        "the share bounds what waits"
    );
    // Each stopped, its charge goes back.
    for id in &waiting {
        send(&mut f.socket, json!({ "type": "complete", "id": id })).await;
    }
    settle(&mut f.socket).await;
    assert_back_to(&f.engine, base, "all stopped").await;
}

#[tokio::test]
async fn a_waiting_subscribes_charge_goes_back_when_admitted_refused_or_its_socket_closes() {
    let mut f = fixture(1).await;
    let base = warmed(&mut f, "graphql-transport-ws").await;
    // Admitted: it runs, and once stopped nothing of it stays.
    send(&mut f.socket, large("graphql-transport-ws", "a")).await;
    f.waiting.recv().await.expect("a's check waits");
    assert!(f.engine.socket_bytes() > base);
    f.gate.add_permits(1);
    f.listening.recv().await.expect("a listens");
    send(&mut f.socket, json!({ "type": "complete", "id": "a" })).await;
    settle(&mut f.socket).await;
    assert_back_to(&f.engine, base, "admitted, then stopped").await;
    // Refused by its check (Redis down, `failure_mode = "closed"`).
    f.down.store(true, SeqCst);
    send(&mut f.socket, large("graphql-transport-ws", "b")).await;
    f.waiting.recv().await.expect("b's check waits");
    f.gate.add_permits(1);
    let refused = flows(&mut f.socket, "b's refusal").await;
    assert_eq!(
        (refused["type"].as_str(), refused["id"].as_str()),
        (Some("error"), Some("b"))
    );
    assert_eq!(code(&refused), "UNAVAILABLE", "{refused}");
    assert_back_to(&f.engine, base, "refused at its check").await;
    // Its id is free again, and the socket's close drops the next one's
    // check with everything the socket held.
    send(&mut f.socket, large("graphql-transport-ws", "b")).await;
    f.waiting.recv().await.expect("b's second check waits");
    f.socket.close(None).await.unwrap();
    let dropped = tokio::time::timeout(FLOWS_WITHIN, f.dropped.recv()).await;
    assert!(
        matches!(dropped, Ok(Some(()))),
        "the check goes with its socket"
    );
    assert_back_to(&f.engine, 0, "the socket closed").await;
}

#[tokio::test]
async fn a_duplicate_id_while_its_check_waits_closes_4409_and_drops_the_check() {
    let mut f = fixture(1).await;
    send(&mut f.socket, large("graphql-transport-ws", "a")).await;
    f.waiting.recv().await.expect("a's check waits");
    subscribe(&mut f.socket, "a", "subscription { ticks }").await;
    let closed = tokio::time::timeout(FLOWS_WITHIN, receive(&mut f.socket)).await;
    assert!(matches!(closed, Ok(Err(Some(4409)))), "{closed:?}");
    let dropped = tokio::time::timeout(FLOWS_WITHIN, f.dropped.recv()).await;
    assert!(
        matches!(dropped, Ok(Some(()))),
        "the check goes with its socket"
    );
    assert_back_to(&f.engine, 0, "the socket closed").await;
}

#[tokio::test]
async fn waiting_checks_count_toward_max_per_connection_until_they_end() {
    let mut config = Config::default();
    config.subscriptions.max_per_connection = 2;
    let mut f = fixture_with(1, config, "graphql-transport-ws").await;
    for id in ["a", "b"] {
        subscribe(&mut f.socket, id, "subscription { ticks }").await;
        f.waiting.recv().await.expect("its check waits");
    }
    subscribe(&mut f.socket, "c", "subscription { ticks }").await;
    let refused = flows(&mut f.socket, "c's refusal").await;
    assert_eq!(refused["id"], "c", "{refused}");
    assert_eq!(code(&refused), "TOO_MANY_SUBSCRIPTIONS", "{refused}");
    // a's check refused (Redis down): its place is free for c.
    f.down.store(true, SeqCst);
    f.gate.add_permits(1);
    let refused = flows(&mut f.socket, "a's refusal").await;
    assert_eq!(
        (refused["id"].as_str(), code(&refused)),
        (Some("a"), "UNAVAILABLE")
    );
    f.down.store(false, SeqCst);
    subscribe(&mut f.socket, "c", "subscription { ticks }").await;
    f.waiting.recv().await.expect("c's check waits");
    f.gate.add_permits(2);
    for _ in 0..2 {
        f.listening.recv().await.expect("b and c listen");
    }
}

#[tokio::test]
async fn a_silent_client_is_closed_while_its_checks_wait_and_they_go_with_it() {
    let mut config = Config::default();
    config.subscriptions.keepalive_ms = 100;
    let mut f = fixture_with(1, config, "graphql-transport-ws").await;
    send(&mut f.socket, large("graphql-transport-ws", "a")).await;
    f.waiting.recv().await.expect("a's check waits");
    // The client reads nothing (it answers no ping) and sends nothing.
    let dropped = tokio::time::timeout(FLOWS_WITHIN, f.dropped.recv()).await;
    assert!(
        matches!(dropped, Ok(Some(()))),
        "a silent client's checks are dropped"
    );
    assert_back_to(&f.engine, 0, "the socket closed").await;
}

#[tokio::test]
async fn the_legacy_protocol_charges_stops_and_refuses_a_waiting_start() {
    let mut f = fixture_with(1, Config::default(), "graphql-ws").await;
    let base = warmed(&mut f, "graphql-ws").await;
    send(&mut f.socket, large("graphql-ws", "a")).await;
    f.waiting.recv().await.expect("a's check waits");
    let parsed = ITEMS * std::mem::size_of::<async_graphql::Value>();
    assert!(
        f.engine.socket_bytes() - base >= parsed,
        "charged what it holds"
    );
    // `stop`: answered `complete`, its check dropped, its charge back.
    send(&mut f.socket, json!({ "type": "stop", "id": "a" })).await;
    let complete = flows(&mut f.socket, "a's complete").await;
    assert_eq!(complete, json!({ "type": "complete", "id": "a" }));
    let dropped = tokio::time::timeout(FLOWS_WITHIN, f.dropped.recv()).await;
    assert!(
        matches!(dropped, Ok(Some(()))),
        "the stopped start's check goes"
    );
    assert_back_to(&f.engine, base, "stopped").await;
    // Refused at its check (Redis down): an `error`, its charge back.
    f.down.store(true, SeqCst);
    send(&mut f.socket, large("graphql-ws", "a")).await;
    f.waiting.recv().await.expect("a's second check waits");
    f.gate.add_permits(1);
    let refused = flows(&mut f.socket, "a's refusal").await;
    assert_eq!(
        (refused["type"].as_str(), code(&refused)),
        (Some("error"), "UNAVAILABLE")
    );
    assert_back_to(&f.engine, base, "refused at its check").await;
}
