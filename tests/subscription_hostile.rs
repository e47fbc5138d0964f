//! Hostile clients of the WebSocket endpoint, against a real server
//! (`fanout_budget::inbound::serve`) over loopback: a client that stops
//! reading while events flow (memory measured in a child process under an
//! address-space limit), a thousand connections from one address,
//! connections that never initialise, malformed and oversized frames, an
//! event that would read past `budget.max_reads`, a graceful shutdown with
//! sockets open, and the accounting of shared polls under random churn.
//!
//! `cargo test --test subscription_hostile -- --nocapture` prints the
//! figures.

mod common;

use async_graphql::{Context, EmptyMutation, Schema, Subscription};
use common::{Base, Item, Query, Upstream};
use fanout_budget::config::SubscriptionsConfig;
use fanout_budget::graphql::{FanoutConnection, SharedPoll};
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::child;
use fanout_testkit::ws::{connect_from, receive, send, subscribe, until_complete};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const LIMIT: Duration = Duration::from_secs(30);

struct Subscription;

#[Subscription]
impl Subscription {
    /// Events of `size` bytes, as fast as they are taken, without end.
    async fn big(&self, size: usize) -> impl Stream<Item = String> {
        futures::stream::repeat_with(move || "x".repeat(size))
    }

    /// Never an event, until the client stops it.
    async fn quiet(&self) -> impl Stream<Item = u64> {
        futures::stream::pending()
    }

    /// `n` events of three items each (three reads per event when their
    /// `detail` is asked for).
    async fn triples(&self, n: u64) -> impl Stream<Item = Vec<Item>> {
        futures::stream::iter(0..n).map(|k| (3 * k + 1..3 * k + 4).map(|id| Item { id }).collect())
    }

    /// `/item/{id}` polled, shared by every subscriber on this server.
    async fn polled(
        &self,
        ctx: &Context<'_>,
        id: u64,
    ) -> async_graphql::Result<impl Stream<Item = u64>> {
        let connection = ctx.data::<FanoutConnection>()?.clone();
        let polls = ctx.data::<SharedPoll<u64, u64>>()?;
        let url: fanout_budget::reqwest::Url =
            format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        Ok(polls.subscribe(id, &connection, move |operation| {
            let url = url.clone();
            async move {
                let _answer = operation.upstream().read(Read::get(url)).await;
                0
            }
        }))
    }
}

type SubSchema = Schema<Query, EmptyMutation, Subscription>;

struct Server {
    addr: SocketAddr,
    upstream: Upstream,
    polls: SharedPoll<u64, u64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(mut config: Config) -> Server {
    let upstream = Upstream::start().await;
    let engine = Engine::new(config.clone());
    let polls = SharedPoll::new(Duration::from_millis(50));
    let schema: SubSchema = Schema::build(Query, EmptyMutation, Subscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.base()))
        .data(polls.clone())
        .finish();
    let router =
        axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine.clone()));
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(2048).unwrap();
    let addr = listener.local_addr().unwrap();
    config.http.max_connections = config.http.max_connections.max(1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = fanout_budget::inbound::serve(listener, router, &config).with_graceful_shutdown(
        async move {
            let _ = stopped.await;
        },
    );
    let task = tokio::spawn(serving);
    Server {
        addr,
        upstream,
        polls,
        stop: Some(stop),
        task,
    }
}

type Socket = WebSocketStream<TcpStream>;

async fn connect(server: &Server) -> Socket {
    connect_from(server.addr, Ipv4Addr::LOCALHOST)
        .await
        .unwrap()
}

/// A client served: initialised, and a query over the socket answered.
async fn served(socket: &mut Socket) {
    init(socket).await;
    probe(socket).await;
}

/// A query over an initialised socket answered.
async fn probe(socket: &mut Socket) {
    subscribe(socket, "probe", "{ item(id: 3) { id } }").await;
    let events = until_complete(socket, "probe").await;
    assert_eq!(events[0]["payload"]["data"]["item"]["id"], 3, "{events:?}");
}

async fn init(socket: &mut Socket) {
    fanout_testkit::ws::init(socket, json!({})).await;
}

fn config(subscriptions: SubscriptionsConfig) -> Config {
    let mut config = Config::default();
    config.subscriptions = subscriptions;
    config
}

// ---------------------------------------------------------------- a.

const STALLED_EVENT: usize = 256 << 10;
const STALLED_SPACE_MIB: u64 = 2048;
const STALLED_GROWTH_MIB: f64 = 48.0;

/// In the child: one client subscribes to 256 KiB events produced as fast
/// as they are taken (a stream always ready) and never reads; meanwhile
/// others are served — on a current-thread runtime, so a connection that
/// kept its thread would starve them and the timers; the stalled one is
/// closed by the write timeout. Reports the resident memory gained while
/// it stalled.
fn stalled_reader() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut config = config(SubscriptionsConfig::default());
        config.http.write_timeout_ms = 1500;
        let server = start(config).await;
        // Warm up: a client served before the measure.
        served(&mut connect(&server).await).await;
        let before = child::rss_mib();
        child::reset_peak();
        let mut stalled = connect(&server).await;
        init(&mut stalled).await;
        subscribe(
            &mut stalled,
            "big",
            &format!("subscription {{ big(size: {STALLED_EVENT}) }}"),
        )
        .await;
        // It never reads again. Another client is served meanwhile, while
        // the stalled one's writes wait.
        let started = Instant::now();
        for _ in 0..3 {
            let mut other = connect(&server).await;
            tokio::time::timeout(Duration::from_secs(5), served(&mut other))
                .await
                .expect("another client served while one stalls");
        }
        // Held well past the write timeout, then read: what the kernel kept,
        // then the end (no close frame: the write never finished).
        tokio::time::sleep_until((started + Duration::from_secs(4)).into()).await;
        let peak = child::peak_mib() - before;
        let mut frames = 0u64;
        let ended = tokio::time::timeout(LIMIT, async {
            loop {
                match stalled.next().await {
                    Some(Ok(Message::Text(_))) => frames += 1,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the stalled connection was closed");
        child::report(format!("{peak:.1} {frames}"));
        // And the server still serves.
        served(&mut connect(&server).await).await;
    });
}

#[test]
fn a_client_that_stops_reading_holds_bounded_memory_and_is_closed_by_the_write_timeout() {
    if child::case().is_some() {
        return stalled_reader();
    }
    let run = child::run(
        "a_client_that_stops_reading_holds_bounded_memory_and_is_closed_by_the_write_timeout",
        "stalled",
        STALLED_SPACE_MIB,
        Duration::from_secs(120),
    );
    assert!(run.success, "the child {}: {}", run.ended, run.output);
    let report = run.reports.first().expect("a report");
    let mut figures = report.split(' ');
    let peak: f64 = figures.next().unwrap().parse().unwrap();
    let frames: u64 = figures.next().unwrap().parse().unwrap();
    println!(
        "stalled reader: peak RSS gained {peak:.1} MiB; {frames} events of 256 KiB read back \
         after the write timeout (the kernel's buffers)"
    );
    assert!(
        peak < STALLED_GROWTH_MIB,
        "{peak:.1} MiB gained while one client did not read"
    );
}

// ---------------------------------------------------------------- b.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_from_one_address_get_its_share_and_another_address_is_served() {
    let mut config = config(SubscriptionsConfig::default());
    config.http.max_connections = 100;
    config.http.max_connections_per_client = 20;
    let server = start(config).await;
    let crowd = Ipv4Addr::new(127, 0, 0, 2);
    let attempts = futures::future::join_all((0..1000).map(|_| async {
        let attempt = tokio::time::timeout(LIMIT, async {
            let mut socket = connect_from(server.addr, crowd).await?;
            send(&mut socket, json!({ "type": "connection_init" })).await;
            match receive(&mut socket).await {
                Ok(ack) if ack["type"] == "connection_ack" => Ok(socket),
                other => Err(format!("{other:?}")),
            }
        });
        attempt.await.unwrap_or_else(|_| Err("timed out".into()))
    }))
    .await;
    let (open, refused): (Vec<_>, Vec<_>) = attempts.into_iter().partition(Result::is_ok);
    println!(
        "1,000 connections from one address: {} served, {} refused",
        open.len(),
        refused.len()
    );
    assert_eq!(open.len(), 20, "the client's share: {:?}", &refused[..3]);
    // Another address is served while they are open.
    let mut other = connect_from(server.addr, Ipv4Addr::new(127, 0, 0, 3))
        .await
        .unwrap();
    served(&mut other).await;
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_counts_upgraded_sockets() {
    let mut config = config(SubscriptionsConfig::default());
    config.http.max_connections = 8;
    // The table's own accounting: sockets may take all of it here.
    config.subscriptions.max_connections = 8;
    let server = start(config).await;
    // Eight sockets, each with a subscription (so none is idle and closed
    // for a newcomer), from eight addresses.
    let mut sockets = Vec::new();
    for k in 0..8u8 {
        let mut socket = connect_from(server.addr, Ipv4Addr::new(127, 0, 1, k + 1))
            .await
            .unwrap();
        init(&mut socket).await;
        subscribe(&mut socket, "q", "subscription { quiet }").await;
        sockets.push(socket);
    }
    // The ninth waits for a slot.
    let ninth = tokio::spawn({
        let addr = server.addr;
        async move { connect_from(addr, Ipv4Addr::new(127, 0, 1, 100)).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !ninth.is_finished(),
        "a ninth connection waits while eight sockets hold the table"
    );
    // One socket closes: its slot goes to the ninth.
    let mut first = sockets.remove(0);
    first.close(None).await.unwrap();
    drop(first);
    let mut ninth = tokio::time::timeout(LIMIT, ninth)
        .await
        .expect("served once a socket closed")
        .unwrap()
        .unwrap();
    served(&mut ninth).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_socket_is_closed_for_a_newcomer_when_the_table_is_full() {
    let mut config = config(SubscriptionsConfig::default());
    config.http.max_connections = 2;
    // The table's own accounting: sockets may take all of it here.
    config.subscriptions.max_connections = 2;
    let server = start(config).await;
    let mut busy = connect_from(server.addr, Ipv4Addr::new(127, 0, 2, 1))
        .await
        .unwrap();
    init(&mut busy).await;
    subscribe(&mut busy, "q", "subscription { quiet }").await;
    let mut idle = connect_from(server.addr, Ipv4Addr::new(127, 0, 2, 1))
        .await
        .unwrap();
    init(&mut idle).await;
    // A newcomer from an address holding none.
    let mut newcomer = tokio::time::timeout(
        Duration::from_secs(10),
        connect_from(server.addr, Ipv4Addr::new(127, 0, 2, 2)),
    )
    .await
    .expect("the newcomer is served")
    .unwrap();
    assert_eq!(receive(&mut idle).await, Err(Some(1001)), "idle, closed");
    served(&mut newcomer).await;
    // The busy one is untouched.
    send(&mut busy, json!({ "type": "complete", "id": "q" })).await;
    probe(&mut busy).await;
}

// ---------------------------------------------------------------- c.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_initialise_are_closed_at_the_timeout_and_free_their_slots() {
    let mut config = config(SubscriptionsConfig::default().init_timeout_ms(8000));
    config.http.max_connections = 201;
    // The table's own accounting: sockets may take all of it here.
    config.subscriptions.max_connections = 201;
    config.http.max_connections_per_client = 1000;
    let server = start(config).await;
    let silent = Ipv4Addr::new(127, 0, 3, 1);
    let opened = Instant::now();
    let mut sockets =
        futures::future::try_join_all((0..200).map(|_| connect_from(server.addr, silent)))
            .await
            .unwrap();
    // A normal client is served while 200 wait for their timeout.
    let mut normal = connect_from(server.addr, Ipv4Addr::new(127, 0, 3, 2))
        .await
        .unwrap();
    init(&mut normal).await;
    subscribe(&mut normal, "t", "subscription { triples(n: 2) { id } }").await;
    assert_eq!(until_complete(&mut normal, "t").await.len(), 2);
    assert!(
        opened.elapsed() < Duration::from_millis(8000),
        "served before the silent ones' timeout ({:?})",
        opened.elapsed()
    );
    let codes = futures::future::join_all(sockets.iter_mut().map(receive)).await;
    let closed_after = opened.elapsed();
    assert!(
        codes.iter().all(|c| *c == Err(Some(4408))),
        "{:?}",
        &codes[..3]
    );
    assert!(
        closed_after >= Duration::from_millis(7900),
        "{closed_after:?}"
    );
    drop(sockets);
    // Nothing held after: 200 more from the same address (which no idle
    // socket is closed for) all get a slot at once.
    let again = tokio::time::timeout(
        Duration::from_secs(10),
        futures::future::try_join_all((0..200).map(|_| connect_from(server.addr, silent))),
    )
    .await
    .expect("the slots are free again")
    .unwrap();
    assert_eq!(again.len(), 200);
}

// ---------------------------------------------------------------- d.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_close_with_4400_and_the_server_goes_on() {
    let server = start(config(
        SubscriptionsConfig::default().max_message_bytes(1024),
    ))
    .await;
    let garbage: Vec<u8> = (0..600u32).map(|k| (k * 7919 % 251) as u8).collect();
    let cases: Vec<(&str, Message, bool)> = vec![
        ("binary garbage", Message::binary(garbage.clone()), false),
        (
            "a frame past the bound",
            Message::text("x".repeat(4096)),
            true,
        ),
        (
            "a binary frame past the bound",
            Message::binary(vec![0u8; 4096]),
            true,
        ),
        (
            "invalid JSON",
            Message::text("{\"type\": \"subscribe\", "),
            true,
        ),
        (
            "an unknown type",
            Message::text(r#"{"type":"gimme"}"#),
            true,
        ),
        (
            "a subscribe without a payload",
            Message::text(r#"{"type":"subscribe","id":"1"}"#),
            true,
        ),
        (
            "a subscribe without an id",
            Message::text(r#"{"type":"subscribe","payload":{"query":"{ __typename }"}}"#),
            true,
        ),
        ("a JSON array", Message::text("[1,2,3]"), false),
    ];
    for (what, frame, initialised) in cases {
        let mut socket = connect(&server).await;
        if initialised {
            init(&mut socket).await;
        }
        socket.send(frame).await.unwrap();
        assert_eq!(receive(&mut socket).await, Err(Some(4400)), "{what}");
    }
    // A megabyte: the server closes while the client is still sending, so
    // the client may see a reset rather than the close frame; either way
    // the connection ends.
    let mut socket = connect(&server).await;
    init(&mut socket).await;
    let _ = socket.send(Message::binary(vec![0u8; 1 << 20])).await;
    let ended = receive(&mut socket).await;
    assert!(matches!(ended, Err(None | Some(4400))), "{ended:?}");
    // Bytes that are not a WebSocket frame at all (a reserved opcode).
    let mut raw = TcpStream::connect(server.addr).await.unwrap();
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let head = format!(
        "GET /graphql HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: graphql-transport-ws\r\n\r\n"
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    raw.write_all(&[0x83, 0x80, 1, 2, 3, 4]).await.unwrap();
    raw.write_all(&garbage).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(LIMIT, async {
        use tokio::io::AsyncReadExt;
        let _ = raw.read_to_end(&mut answer).await;
    })
    .await;
    assert!(read.is_ok(), "the connection ended");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let frame = &answer[head_end..];
    assert_eq!(frame.first(), Some(&0x88), "a close frame: {frame:?}");
    assert_eq!(
        frame.get(2..4),
        Some(&4400u16.to_be_bytes()[..]),
        "{frame:?}"
    );
    // The server is fine.
    served(&mut connect(&server).await).await;
}

// ---------------------------------------------------------------- e.

#[tokio::test]
async fn a_subscription_event_past_max_reads_is_delivered_exhausted_at_the_fields_past_it() {
    let mut config = config(SubscriptionsConfig::default().burst(1000));
    config.budget.max_reads = 2;
    let server = start(config).await;
    let mut socket = connect(&server).await;
    init(&mut socket).await;
    subscribe(
        &mut socket,
        "t",
        "subscription { triples(n: 3) { id detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "t").await;
    assert_eq!(events.len(), 3, "every event delivered: {events:?}");
    for event in &events {
        let payload = &event["payload"];
        let items = payload["data"]["triples"].as_array().unwrap();
        let read: Vec<_> = items.iter().filter(|i| i["detail"].is_object()).collect();
        assert_eq!(read.len(), 2, "two of three read: {payload}");
        let codes: Vec<_> = payload["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["extensions"]["code"].clone())
            .collect();
        assert_eq!(codes, [json!("FANOUT_BUDGET_EXHAUSTED")], "{payload}");
        assert_eq!(payload["extensions"]["fanout"]["operationReads"], 2);
    }
    assert_eq!(server.upstream.requests(), 6, "two reads per event");
}

// ---------------------------------------------------------------- f.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_closes_open_sockets_with_1001_in_bounded_time() {
    let mut server = start(config(SubscriptionsConfig::default())).await;
    let mut sockets = Vec::new();
    for k in 0..10 {
        let mut socket = connect(&server).await;
        if k % 3 != 0 {
            init(&mut socket).await;
        }
        if k % 3 == 1 {
            subscribe(&mut socket, "q", "subscription { quiet }").await;
        }
        sockets.push(socket);
    }
    // A subscription mid-flight too.
    subscribe(&mut sockets[2], "big", "subscription { big(size: 100) }").await;
    let asked = Instant::now();
    server.stop.take().unwrap().send(()).unwrap();
    let (task, addr) = (&mut server.task, server.addr);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the server completes with sockets open")
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    println!("graceful shutdown with 10 sockets open: {took:?}");
    for (k, socket) in sockets.iter_mut().enumerate() {
        let code = loop {
            match receive(socket).await {
                Ok(_) => continue,
                Err(code) => break code,
            }
        };
        assert_eq!(code, Some(1001), "socket {k}");
    }
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

// ---------------------------------------------------------------- g.

/// A small deterministic generator (xorshift64*), so a failing seed
/// replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_churn_on_shared_polls_charges_exactly_the_requests_sent() {
    for seed in [0x5eed_u64, 0xfee1_900d, 42] {
        let server = start(config(SubscriptionsConfig::default().burst(100_000))).await;
        let mut rng = Rng(seed);
        let mut sockets = Vec::new();
        for _ in 0..12 {
            let mut socket = connect(&server).await;
            init(&mut socket).await;
            sockets.push(socket);
        }
        // The id subscribed on each (connection, slot), if any.
        let mut active: Vec<[Option<String>; 2]> = vec![[None, None]; sockets.len()];
        for step in 0..150 {
            let (c, slot) = (rng.below(12) as usize, rng.below(2) as usize);
            match active[c][slot].take() {
                Some(id) => send(&mut sockets[c], json!({ "type": "complete", "id": id })).await,
                None => {
                    let key = rng.below(3);
                    // A fresh id each time (a stop may still be in flight).
                    let id = format!("s{slot}-{step}");
                    let query = format!("subscription {{ polled(id: {key}) }}");
                    subscribe(&mut sockets[c], &id, &query).await;
                    active[c][slot] = Some(id);
                }
            }
            if rng.below(4) == 0 {
                tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
            }
        }
        for (socket, slots) in sockets.iter_mut().zip(&mut active) {
            for id in slots.iter_mut().filter_map(Option::take) {
                send(socket, json!({ "type": "complete", "id": id })).await;
            }
        }
        fanout_testkit::until(
            "every poll stops with its last subscriber",
            LIMIT,
            async || server.polls.keys() == 0,
        )
        .await;
        let mut charged = 0;
        for socket in &mut sockets {
            subscribe(socket, "used", "{ __typename }").await;
            let events = until_complete(socket, "used").await;
            charged += events[0]["payload"]["extensions"]["fanout"]["used"]
                .as_u64()
                .unwrap();
        }
        let sent = server.upstream.requests();
        println!("seed {seed:#x}: {sent} polls sent, {charged} charged");
        assert!(sent > 0, "seed {seed:#x}: some polls ran");
        assert_eq!(charged, sent, "seed {seed:#x}");
    }
}
