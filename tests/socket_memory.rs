//! What sockets hold, against what they are charged, and that they never
//! take what HTTP requests need.
//!
//! - **Charged what it holds**: in a child process under an address-space
//!   limit, sockets of 16 subscriptions each, of an attacker's shapes —
//!   1,999 aliases, 999 fields of one key, a 60 KB comment, a 60 KB
//!   variable, a one-field subscription — are opened; the resident memory
//!   they add is compared with what the sockets' pool was charged
//!   (`Engine::socket_bytes`): at most 1.5 times it.
//! - **One root field**: a subscription naming 999 root fields is a
//!   validation error, and starts nothing.
//! - **Sockets apart from requests**: with the sockets' pool full of
//!   padded subscriptions from 13 addresses, HTTP from a fourteenth answers
//!   200 (p99 under 1 s) and a client's own share stops it before the pool.
//!
//! `cargo test --test socket_memory -- --nocapture` prints the figures.

mod common;

use async_graphql::{EmptyMutation, Object, Schema, Subscription};
use common::Query;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::child;
use fanout_testkit::ws::{receive, send};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// Subscriptions active now, across the server.
#[derive(Clone, Default)]
struct Active(Arc<AtomicUsize>);

/// A stream that never yields, counted while it lives.
struct Quiet {
    active: Active,
}

impl Drop for Quiet {
    fn drop(&mut self) {
        self.active.0.fetch_sub(1, Relaxed);
    }
}

impl Stream for Quiet {
    type Item = Watched;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Watched>> {
        std::task::Poll::Pending
    }
}

struct Watched;

#[Object]
impl Watched {
    async fn id(&self) -> u64 {
        1
    }
    async fn name(&self) -> &str {
        "x"
    }
}

struct Subscription;

#[Subscription]
impl Subscription {
    /// Never an event; counted in [`Active`] while subscribed.
    async fn watch(
        &self,
        ctx: &async_graphql::Context<'_>,
        tag: Option<String>,
    ) -> impl Stream<Item = Watched> {
        let _ = tag;
        let active = ctx.data_unchecked::<Active>().clone();
        active.0.fetch_add(1, Relaxed);
        Quiet { active }
    }

    /// One event of `size` bytes, then none.
    async fn big(&self, size: usize) -> impl Stream<Item = String> {
        futures::stream::once(async move { "x".repeat(size) }).chain(futures::stream::pending())
    }

    /// A second root field, to be refused beside `watch`.
    async fn other(&self) -> impl Stream<Item = u64> {
        futures::stream::pending()
    }
}

struct Server {
    addr: SocketAddr,
    engine: Engine,
    active: Active,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(config: Config) -> Server {
    let engine = Engine::new(config.clone());
    let active = Active::default();
    let schema = Schema::build(Query, EmptyMutation, Subscription)
        .extension(FanoutExtension::new(&engine))
        .data(active.clone())
        .finish();
    let router =
        axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine.clone()));
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(2048).unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, router, &config);
    let task = tokio::spawn(async move { serving.await });
    Server {
        addr,
        engine,
        active,
        task,
    }
}

type Socket = WebSocketStream<TcpStream>;

/// An initialised `graphql-transport-ws` connection from loopback address `from`.
async fn connect(addr: SocketAddr, from: Ipv4Addr) -> Socket {
    let mut socket = fanout_testkit::ws::connect_from(addr, from).await.unwrap();
    fanout_testkit::ws::init(&mut socket, json!({})).await;
    socket
}

/// Waits (bounded) until `active` subscriptions are active on `server`.
async fn until_active(server: &Server, active: usize) {
    let by = Instant::now() + Duration::from_secs(60);
    while server.active.0.load(Relaxed) != active {
        assert!(
            Instant::now() < by,
            "{} of {active} subscriptions active",
            server.active.0.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shape an attacker subscribes with: its text and variables.
fn shape(name: &str) -> (String, Value) {
    match name {
        "aliases" => {
            let aliases: String = (0..1999).map(|k| format!("a{k}: id ")).collect();
            (
                format!("subscription {{ watch {{ {aliases} }} }}"),
                json!({}),
            )
        }
        "fields" => {
            let fields = "id ".repeat(999);
            (
                format!("subscription {{ watch {{ {fields} }} }}"),
                json!({}),
            )
        }
        "comment" => (
            format!(
                "# {}\nsubscription {{ watch {{ id }} }}",
                "x".repeat(60_000)
            ),
            json!({}),
        ),
        "variable" => (
            "subscription($t: String) { watch(tag: $t) { id } }".to_string(),
            json!({ "t": "x".repeat(60_000) }),
        ),
        "small" => ("subscription { watch { id name } }".to_string(), json!({})),
        other => panic!("no shape {other}"),
    }
}

const SHAPES: [&str; 5] = ["aliases", "fields", "comment", "variable", "small"];
const PER_SOCKET: usize = 16;

fn quiet_config() -> Config {
    let mut config = Config::default();
    // What is measured is what each holds, not the bound.
    config.subscriptions.max_bytes = 4 << 30;
    config.subscriptions.max_bytes_per_client = 4 << 30;
    config.http.max_connections_per_client = 1024;
    config.rate_limit.requests_per_minute = 1_000_000;
    config
}

/// In the child: `sockets` sockets of 16 subscriptions of `name`; reports
/// the resident memory they added and what they were charged, in bytes.
fn held_and_charged(name: &str, sockets: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = start(quiet_config()).await;
        let mut open = Vec::new();
        for _ in 0..sockets {
            open.push(connect(server.addr, Ipv4Addr::LOCALHOST).await);
        }
        // A warm-up subscription, stopped: what the first one allocates for good.
        let (query, variables) = shape(name);
        let payload = json!({ "query": query, "variables": variables });
        let warm = &mut open[0];
        send(
            warm,
            json!({"id": "w", "type": "subscribe", "payload": payload}),
        )
        .await;
        until_active(&server, 1).await;
        send(warm, json!({"id": "w", "type": "complete"})).await;
        until_active(&server, 0).await;
        child::trim_heap();
        let before = child::rss_mib();
        // The connections' own (their bases, the warm-up's message read).
        let standing = server.engine.socket_bytes();
        for socket in &mut open {
            for k in 0..PER_SOCKET {
                let message = json!({"id": k.to_string(), "type": "subscribe", "payload": payload});
                send(socket, message).await;
            }
        }
        until_active(&server, sockets * PER_SOCKET).await;
        child::trim_heap();
        let held = (child::rss_mib() - before) * 1_048_576.0;
        let charged = server.engine.socket_bytes() - standing;
        child::report(format!("{held:.0} {charged}"));
        drop(open);
        until_active(&server, 0).await;
    });
}

#[test]
fn subscriptions_hold_at_most_one_and_a_half_times_their_charge() {
    if let Some(case) = child::case() {
        let (name, sockets) = case.split_once(' ').unwrap();
        return held_and_charged(name, sockets.parse().unwrap());
    }
    let mut failures = Vec::new();
    for name in SHAPES {
        // Enough subscriptions to hold tens of MiB, far above the noise.
        let sockets = if name == "small" { 64 } else { 8 };
        let run = child::run(
            "subscriptions_hold_at_most_one_and_a_half_times_their_charge",
            &format!("{name} {sockets}"),
            4096,
            Duration::from_secs(180),
        );
        assert!(
            run.success,
            "{name}: the child {}: {}",
            run.ended, run.output
        );
        let report = run.reports.first().expect("a report");
        let (held, charged) = report.split_once(' ').unwrap();
        let (held, charged): (f64, f64) = (held.parse().unwrap(), charged.parse().unwrap());
        let n = (sockets * PER_SOCKET) as f64;
        println!(
            "{name}: {n} subscriptions hold {:.1} KiB each, charged {:.1} KiB ({:.2}×)",
            held / n / 1024.0,
            charged / n / 1024.0,
            held / charged
        );
        if held > 1.5 * charged {
            failures.push(format!(
                "{name}: held {held:.0} > 1.5 × charged {charged:.0}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[tokio::test]
async fn a_subscription_with_more_than_one_root_field_is_a_validation_error() {
    let server = start(quiet_config()).await;
    let mut socket = connect(server.addr, Ipv4Addr::LOCALHOST).await;
    let many: String = (0..999).map(|k| format!("w{k}: watch {{ id }} ")).collect();
    let base = server.engine.socket_bytes();
    let mut largest = 0;
    for (id, query) in [
        ("aliased", format!("subscription {{ {many} }}")),
        ("two", "subscription { watch { id } other }".to_string()),
        // async-graphql starts a stream per selection, same key or not.
        (
            "repeated",
            format!("subscription {{ {} }}", "watch { id } ".repeat(990)),
        ),
        (
            "fragment",
            "subscription { ...F } fragment F on Subscription { watch { id } other }".to_string(),
        ),
    ] {
        let message = json!({"id": id, "type": "subscribe", "payload": {"query": query}});
        largest = largest.max(message.to_string().len());
        send(&mut socket, message).await;
        let answer = receive(&mut socket).await.unwrap();
        assert_eq!(answer["type"], "error", "{id}: {answer}");
        assert_eq!(answer["id"], id);
        assert_eq!(
            answer["payload"][0]["extensions"]["code"], "GRAPHQL_VALIDATION_FAILED",
            "{id}: {answer}"
        );
        assert!(
            (answer["payload"][0]["message"].as_str().unwrap())
                .contains("must select only one top level field"),
            "{answer}"
        );
    }
    assert_eq!(server.active.0.load(Relaxed), 0, "no stream started");
    // Nothing held beyond the connection's own: its base, and its largest
    // message read and frame written.
    let held = server.engine.socket_bytes();
    assert!(held <= base + largest + 4096, "{held} held, {base} base");
    // One root field still subscribes.
    let message = json!({"id": "one", "type": "subscribe",
        "payload": {"query": "subscription { watch { id } }"}});
    send(&mut socket, message).await;
    until_active(&server, 1).await;
}

/// Padded subscriptions from 13 addresses fill the sockets' pool; the
/// fourteenth address's HTTP requests are all answered 200 within 1 s, and
/// each client was stopped at its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_full_of_padded_subscriptions_never_refuse_http() {
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = 1_000_000;
    // A small requests' pool, so that sockets charged to it would show.
    config.http.max_inflight_bytes = 8 << 20;
    config.subscriptions.max_bytes = 32 << 20;
    config.subscriptions.max_bytes_per_client = 4 << 20;
    let server = start(config).await;
    let padded = format!(
        "# {}\nsubscription {{ watch {{ id }} }}",
        "x".repeat(60_000)
    );
    // Each socket sends 16 padded subscribes, then a probe query: once the
    // probe is answered, every subscribe before it is active or was refused
    // `OVERLOADED`; a socket its client's share cannot hold (its base, or
    // the message it sent) is closed 1013.
    let mut sockets = Vec::new();
    let (mut refused, mut closed) = (0, 0);
    for client in 0..13u8 {
        let from = Ipv4Addr::new(127, 0, 1, client + 1);
        for _ in 0..16 {
            let mut socket = fanout_testkit::ws::connect_from(server.addr, from)
                .await
                .unwrap();
            let mut messages = vec![json!({"type": "connection_init", "payload": {}})];
            messages.extend((0..PER_SOCKET).map(
                |k| json!({"id": k.to_string(), "type": "subscribe", "payload": {"query": padded}}),
            ));
            messages.push(json!({"id": "probe", "type": "subscribe",
                "payload": {"query": "{ item(id: 1) { id } }"}}));
            for message in messages {
                let text = Message::text(message.to_string());
                if socket.send(text).await.is_err() {
                    break;
                }
            }
            loop {
                match receive(&mut socket).await {
                    Ok(answer) if answer["id"] == "probe" => {
                        if answer["type"] == "complete" || answer["type"] == "error" {
                            break;
                        }
                    }
                    Ok(answer) if answer["type"] == "connection_ack" => {}
                    Ok(answer) => {
                        assert_eq!(answer["type"], "error", "{answer}");
                        assert_eq!(answer["payload"][0]["extensions"]["code"], "OVERLOADED");
                        refused += 1;
                    }
                    Err(code) => {
                        // 1013; or reset, the server having closed with
                        // our subscribes still unread.
                        assert!(matches!(code, None | Some(1013)), "closed {code:?}");
                        closed += 1;
                        break;
                    }
                }
            }
            sockets.push(socket);
        }
    }
    let active = server.active.0.load(Relaxed);
    println!("{active} active, {refused} refused, {closed} sockets closed 1013");
    assert!(refused + closed > 0, "the pool filled");
    let held = server.engine.socket_bytes();
    println!(
        "{active} padded subscriptions active; the sockets hold {:.1} MiB",
        held as f64 / 1_048_576.0
    );
    assert!(held <= 32 << 20);
    // HTTP from a fourteenth address: every request answered 200 promptly.
    let client = fanout_budget::reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(Ipv4Addr::new(127, 0, 2, 1)))
        .build()
        .unwrap();
    let mut times = Vec::new();
    for _ in 0..100 {
        let started = Instant::now();
        let response = client
            .post(format!("http://{}/graphql", server.addr))
            .header("content-type", "application/json")
            .body(r#"{"query":"{ a: item(id: 1) { id } b: item(id: 2) { id } }"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert!(body["errors"].is_null(), "{body}");
        times.push(started.elapsed());
    }
    times.sort();
    let p99 = times[98];
    println!("HTTP beside them: p99 {p99:?}");
    assert!(p99 < Duration::from_secs(1), "p99 {p99:?}");
    drop(sockets);
}

/// A frame written stays charged as long as its socket is open (the
/// WebSocket's write buffer keeps its size), and one the client's share
/// cannot hold is replaced by a small `OVERLOADED` one.
#[tokio::test]
async fn the_largest_frame_written_stays_charged_and_one_past_the_share_is_replaced() {
    let mut config = quiet_config();
    config.subscriptions.max_bytes_per_client = 4 << 20;
    let server = start(config).await;
    let mut socket = connect(server.addr, Ipv4Addr::LOCALHOST).await;
    let base = server.engine.socket_bytes();
    let subscribe = |id: &str, size: usize| {
        json!({"id": id, "type": "subscribe",
            "payload": {"query": format!("subscription {{ big(size: {size}) }}")}})
    };
    send(&mut socket, subscribe("a", 2_000_000)).await;
    let event = receive(&mut socket).await.unwrap();
    assert_eq!(
        event["payload"]["data"]["big"].as_str().map(str::len),
        Some(2_000_000)
    );
    send(&mut socket, json!({"id": "a", "type": "complete"})).await;
    // A query after it, answered: the event's frame is written by then.
    send(
        &mut socket,
        json!({"id": "q", "type": "subscribe",
        "payload": {"query": "{ item(id: 1) { id } }"}}),
    )
    .await;
    let answers = fanout_testkit::ws::until_complete(&mut socket, "q").await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let held = server.engine.socket_bytes();
    assert!(
        held >= base + 2_000_000,
        "the write buffer's 2 MB stay charged: {held} held, {base} base"
    );
    send(&mut socket, subscribe("b", 3_000_000)).await;
    let event = receive(&mut socket).await.unwrap();
    assert_eq!(event["id"], "b");
    assert_eq!(
        event["payload"]["errors"][0]["extensions"]["code"],
        "OVERLOADED",
        "past the 4 MiB share with the 2 MB kept: {}",
        event.to_string().chars().take(300).collect::<String>()
    );
}

/// Validation errors are capped at 100 (and one saying so): 21,000 unknown
/// directives in a 42 KB text made a 2.7 MB `error` frame.
#[tokio::test]
async fn an_answer_carries_at_most_a_hundred_validation_errors() {
    let server = start(quiet_config()).await;
    let mut socket = connect(server.addr, Ipv4Addr::LOCALHOST).await;
    let query = format!("subscription {{ watch {{ id {} }} }}", "@a".repeat(21_000));
    send(
        &mut socket,
        json!({"id": "d", "type": "subscribe", "payload": {"query": query}}),
    )
    .await;
    let answer = receive(&mut socket).await.unwrap();
    assert_eq!(answer["type"], "error", "{}", answer.to_string().len());
    let errors = answer["payload"].as_array().unwrap();
    assert_eq!(errors.len(), 101);
    assert!(
        errors[100]["message"]
            .as_str()
            .unwrap()
            .contains("Too many validation errors"),
        "{}",
        errors[100]
    );
    assert!(
        answer.to_string().len() < 64 << 10,
        "{} bytes",
        answer.to_string().len()
    );
}

/// Busy sockets never hold every place of the connection table: two
/// addresses' 16 sockets, each with a subscription, in a table of 16 — half
/// of it is theirs at most, the rest closed 1013, and HTTP from a third
/// address is answered (it waited for a place for good before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_sockets_never_take_every_connection_slot() {
    let mut config = quiet_config();
    config.http.max_connections = 16;
    config.http.max_connections_per_client = 8;
    let server = start(config).await;
    let mut sockets = Vec::new();
    let mut closed = 0;
    for client in 1..=2u8 {
        for _ in 0..8 {
            let from = Ipv4Addr::new(127, 0, 3, client);
            let mut socket = fanout_testkit::ws::connect_from(server.addr, from)
                .await
                .unwrap();
            let init = json!({"type": "connection_init", "payload": {}});
            let _ = socket.send(Message::text(init.to_string())).await;
            match receive(&mut socket).await {
                Ok(ack) => {
                    assert_eq!(ack["type"], "connection_ack");
                    let watch = json!({"id": "w", "type": "subscribe",
                        "payload": {"query": "subscription { watch { id } }"}});
                    send(&mut socket, watch).await;
                    sockets.push(socket);
                }
                Err(code) => {
                    assert!(matches!(code, None | Some(1013)), "closed {code:?}");
                    closed += 1;
                }
            }
        }
    }
    until_active(&server, 8).await;
    assert_eq!(closed, 8, "half the table is the sockets' at most");
    let response = fanout_budget::reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(Ipv4Addr::new(127, 0, 3, 3)))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .post(format!("http://{}/graphql", server.addr))
        .header("content-type", "application/json")
        .body(r#"{"query":"{ item(id: 1) { id } }"}"#)
        .send()
        .await
        .expect("answered beside the busy sockets");
    assert_eq!(response.status(), 200);
    drop(sockets);
}
