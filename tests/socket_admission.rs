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
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, Semaphore};

/// Generous: a frame that flows arrives in milliseconds; one that a stalled
/// socket holds back never does.
const FLOWS_WITHIN: Duration = Duration::from_secs(10);

/// A shared limiter whose first `free` checks answer at once; each later
/// one reports that it waits and waits for a permit of `gate`, and reports
/// when it is dropped before it answered.
struct Gated {
    free: AtomicUsize,
    waiting: mpsc::UnboundedSender<()>,
    dropped: mpsc::UnboundedSender<()>,
    gate: Arc<Semaphore>,
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
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn fixture(free: usize) -> Fixture {
    let config = Config::default();
    let engine = Engine::new(config.clone());
    let (waiting_tx, waiting) = mpsc::unbounded_channel();
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let limiter = Gated {
        free: AtomicUsize::new(free),
        waiting: waiting_tx,
        dropped: dropped_tx,
        gate: gate.clone(),
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
    let mut socket = connect_from(address, Ipv4Addr::LOCALHOST).await.unwrap();
    init(&mut socket, json!({})).await;
    Fixture {
        socket,
        waiting,
        dropped,
        gate,
        ticks,
        listening,
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
