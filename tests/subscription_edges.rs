//! Subscriptions at their edges, over a real WebSocket on loopback.
//!
//! Operations that fail: an operation refused before it
//! runs (it does not validate, or the engine's admission refuses it) is
//! answered with graphql-transport-ws's `error` message — errors without a
//! path, no `next`, no `complete` — while an operation that ran and failed
//! (a non-null root field's error, which has a path) is a `next` then
//! `complete`, as is every such answer in the legacy protocol.
//!
//! The guard: a cyclic or deeply nested subscribe is refused before it
//! runs, and the socket goes on.
//!
//! A socket whose task panics gives its connection slot back.
//!
//! Persisted queries: a subscribe may carry Apollo's
//! `extensions.persistedQuery` as a request over HTTP may — a text kept
//! by its hash runs from the hash alone, and holds the weight of that text
//! in the memory pool.
//!
//! Pricing: with `budget.refuse_over_estimate` and a cost table, an
//! operation whose worst case exceeds what one event may read is refused
//! before it runs over a socket as over HTTP; with a read quota, an event
//! reserves its priced worst case, not its whole budget.

mod common;

use async_graphql::{EmptyMutation, Schema, Subscription};
use common::{Base, Query, Upstream};
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const LIMIT: Duration = Duration::from_secs(20);

struct Subscription;

/// Holds an event of `held` while it resolves: `entered` once its field
/// runs, which then waits for `release`.
#[derive(Default)]
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

struct Held;

#[async_graphql::Object]
impl Held {
    /// Waits at the gate (priced one read).
    async fn value(&self, ctx: &async_graphql::Context<'_>) -> u64 {
        let gate = ctx.data_unchecked::<std::sync::Arc<Gate>>();
        gate.entered.notify_one();
        gate.release.notified().await;
        1
    }
}

#[Subscription]
impl Subscription {
    /// `n` numbers, one event each.
    async fn count(&self, n: u64) -> impl Stream<Item = u64> {
        futures::stream::iter(0..n)
    }

    /// One event, held at the gate while it resolves.
    async fn held(&self) -> impl Stream<Item = Held> {
        futures::stream::iter([Held])
    }

    /// Never an event, until the client stops it.
    async fn quiet(&self) -> impl Stream<Item = u64> {
        futures::stream::pending()
    }

    /// Panics while its first event resolves.
    async fn boom(&self) -> impl Stream<Item = u64> {
        futures::stream::iter([0]).map(|_| panic!("a resolver that panics"))
    }

    /// One event whose (non-null) root field fails.
    async fn failing(&self) -> impl Stream<Item = async_graphql::Result<u64>> {
        futures::stream::iter([Err("the source failed".into())])
    }
}

struct Server {
    address: String,
    gate: std::sync::Arc<Gate>,
    upstream: Upstream,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn server() -> Server {
    server_with(Config::default(), None).await
}

async fn server_with(config: Config, costs: Option<CostTable>) -> Server {
    let gate = std::sync::Arc::new(Gate::default());
    let upstream = Upstream::start().await;
    let engine = match costs {
        Some(costs) => Engine::builder(config.clone()).costs(costs).build(),
        None => Engine::new(config.clone()),
    };
    let schema = Schema::build(Query, EmptyMutation, Subscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.base()))
        .data(gate.clone())
        .finish();
    let router = axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let task = tokio::spawn(async move {
        let _ = serving.await;
    });
    Server {
        address,
        gate,
        upstream,
        task,
    }
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(server: &Server, protocol: &str) -> Socket {
    let mut request = format!("ws://{}/graphql", server.address)
        .into_client_request()
        .unwrap();
    (request.headers_mut()).insert("sec-websocket-protocol", protocol.parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    send(&mut socket, json!({ "type": "connection_init" })).await;
    assert_eq!(receive(&mut socket).await["type"], "connection_ack");
    socket
}

async fn send(socket: &mut Socket, message: Value) {
    let text = message.to_string();
    socket.send(Message::text(text)).await.unwrap();
}

/// The next protocol message (keep-alives skipped).
async fn receive(socket: &mut Socket) -> Value {
    let until = tokio::time::Instant::now() + LIMIT;
    loop {
        let frame = tokio::time::timeout_at(until, socket.next())
            .await
            .expect("a message within the limit");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["type"] != "ping" && value["type"] != "ka" {
                    return value;
                }
            }
            Some(Ok(Message::Close(frame))) => panic!("closed: {frame:?}"),
            Some(Ok(_)) => {}
            other => panic!("the socket ended: {other:?}"),
        }
    }
}

/// Every message until (and with) subscription `marker`'s last (`complete`
/// or `error`): the messages of the operations sent before it, in order.
async fn until_complete_of(socket: &mut Socket, marker: &str) -> Vec<Value> {
    let mut messages = Vec::new();
    loop {
        let message = receive(socket).await;
        let last = message["type"] == "complete" || message["type"] == "error";
        let done = message["id"] == marker && last;
        messages.push(message);
        if done {
            return messages;
        }
    }
}

fn subscribe(id: &str, query: &str, ty: &str) -> Value {
    json!({ "type": ty, "id": id, "payload": { "query": query } })
}

/// The messages of `id` among `messages`, by type.
fn types_of(messages: &[Value], id: &str) -> Vec<String> {
    (messages.iter())
        .filter(|m| m["id"] == id)
        .map(|m| m["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn an_operation_that_does_not_validate_is_an_error_message_without_next_or_complete() {
    let server = server().await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    let ty = "subscribe";
    // A field the schema does not have (async-graphql's validation), and a
    // required variable missing (the engine's admission).
    send(&mut socket, subscribe("bad", "subscription { nope }", ty)).await;
    let missing = "subscription ($n: Int!) { count(n: $n) }";
    send(&mut socket, subscribe("novar", missing, ty)).await;
    // After both, an operation that runs: its `complete` marks the end.
    send(
        &mut socket,
        subscribe("ok", "subscription { count(n: 1) }", ty),
    )
    .await;
    let messages = until_complete_of(&mut socket, "ok").await;
    for id in ["bad", "novar"] {
        assert_eq!(types_of(&messages, id), ["error"], "{id}: {messages:#?}");
        let error = messages.iter().find(|m| m["id"] == id).unwrap();
        let errors = error["payload"].as_array().expect("an array of errors");
        assert!(!errors.is_empty(), "{error}");
        for e in errors {
            assert!(e["message"].is_string(), "{error}");
            assert!(e.get("path").is_none(), "no path: {error}");
        }
    }
    assert_eq!(types_of(&messages, "ok"), ["next", "complete"]);
    // The id is free again once its `error` is sent.
    send(
        &mut socket,
        subscribe("bad", "subscription { count(n: 1) }", ty),
    )
    .await;
    let messages = until_complete_of(&mut socket, "bad").await;
    assert_eq!(types_of(&messages, "bad"), ["next", "complete"]);
}

#[tokio::test]
async fn an_operation_that_ran_and_failed_at_its_root_field_is_a_next_then_complete() {
    let server = server().await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    let ty = "subscribe";
    send(
        &mut socket,
        subscribe("sub", "subscription { failing }", ty),
    )
    .await;
    let messages = until_complete_of(&mut socket, "sub").await;
    assert_eq!(types_of(&messages, "sub"), ["next", "complete"]);
    assert_eq!(
        messages[0]["payload"]["errors"][0]["path"],
        json!(["failing"])
    );
    assert!(messages[0]["payload"]["extensions"]["fanout"].is_object());
    // A query over the socket whose non-null root field fails.
    send(&mut socket, subscribe("q", "{ exhausted }", ty)).await;
    let messages = until_complete_of(&mut socket, "q").await;
    assert_eq!(types_of(&messages, "q"), ["next", "complete"]);
    let payload = &messages[0]["payload"];
    assert_eq!(payload["errors"][0]["path"], json!(["exhausted"]));
    assert_eq!(payload["data"], Value::Null);
}

#[tokio::test]
async fn the_legacy_protocol_answers_an_invalid_operation_with_data_then_complete() {
    let server = server().await;
    let mut socket = connect(&server, "graphql-ws").await;
    send(
        &mut socket,
        subscribe("bad", "subscription { nope }", "start"),
    )
    .await;
    let messages = until_complete_of(&mut socket, "bad").await;
    assert_eq!(types_of(&messages, "bad"), ["data", "complete"]);
    assert!(messages[0]["payload"]["errors"][0]["message"].is_string());
}

#[tokio::test]
async fn an_operation_priced_past_what_an_event_may_read_is_refused_before_it_runs() {
    let mut config = Config::default();
    config.budget.max_reads = 3;
    config.budget.refuse_over_estimate = true;
    let costs = CostTable::new().field("Query", "items", FieldCost::reads(1));
    let server = server_with(config, Some(costs)).await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    // Four reads at worst, one event may read three.
    let over = "{ a: items(first: 1) { id } b: items(first: 2) { id } \
                c: items(first: 3) { id } d: items(first: 4) { id } }";
    send(&mut socket, subscribe("over", over, "subscribe")).await;
    let within = "{ a: items(first: 1) { id } }";
    send(&mut socket, subscribe("within", within, "subscribe")).await;
    let messages = until_complete_of(&mut socket, "within").await;
    assert_eq!(types_of(&messages, "over"), ["error"], "{messages:#?}");
    let error = messages.iter().find(|m| m["id"] == "over").unwrap();
    let refusal = &error["payload"][0]["extensions"];
    assert_eq!(refusal["code"], "FANOUT_ESTIMATE_EXCEEDS_BUDGET", "{error}");
    assert_eq!(
        (&refusal["requested"], &refusal["limit"]),
        (&json!(4), &json!(3))
    );
    assert_eq!(types_of(&messages, "within"), ["next", "complete"]);
    assert_eq!(server.upstream.requests(), 1, "only the one within");
}

#[tokio::test]
async fn in_measure_mode_an_operation_priced_past_an_event_runs_whole() {
    let mut config = Config::default();
    config.budget.max_reads = 3;
    config.budget.refuse_over_estimate = true;
    config.budget.mode = fanout_budget::config::LimitMode::Measure;
    let costs = CostTable::new().field("Query", "items", FieldCost::reads(1));
    let server = server_with(config, Some(costs)).await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    let over = "{ a: items(first: 1) { id } b: items(first: 2) { id } \
                c: items(first: 3) { id } d: items(first: 4) { id } }";
    send(&mut socket, subscribe("over", over, "subscribe")).await;
    let messages = until_complete_of(&mut socket, "over").await;
    assert_eq!(
        types_of(&messages, "over"),
        ["next", "complete"],
        "{messages:#?}"
    );
    let event = &messages[0]["payload"];
    assert!(event["errors"].is_null(), "nothing refused: {event}");
    assert_eq!(
        event["data"]["d"].as_array().map(Vec::len),
        Some(4),
        "{event}"
    );
}

#[tokio::test]
async fn a_socket_whose_task_panics_gives_its_connection_slot_back() {
    let mut config = Config::default();
    config.http.max_connections_per_client = 1;
    let server = server_with(config, None).await;
    for round in 0..3 {
        // Each socket is served only if the one before gave its slot back.
        let mut socket = connect(&server, "graphql-transport-ws").await;
        send(
            &mut socket,
            subscribe("b", "subscription { boom }", "subscribe"),
        )
        .await;
        let until = tokio::time::Instant::now() + LIMIT;
        loop {
            let frame = tokio::time::timeout_at(until, socket.next()).await;
            match frame.expect("the socket ends within the limit") {
                Some(Ok(Message::Text(text))) => {
                    assert!(!text.contains("\"next\""), "round {round}: {text}")
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
}

fn persisted(id: &str, query: Option<&str>, hash: &str) -> Value {
    let extensions = json!({ "persistedQuery": { "version": 1, "sha256Hash": hash } });
    let mut payload = json!({ "extensions": extensions });
    if let Some(query) = query {
        payload["query"] = json!(query);
    }
    json!({ "type": "subscribe", "id": id, "payload": payload })
}

#[tokio::test]
async fn a_persisted_query_runs_over_the_socket_from_its_hash() {
    use sha2::Digest;
    let server = server().await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    let query = "subscription { count(n: 2) }";
    let hash = format!("{:x}", sha2::Sha256::digest(query.as_bytes()));
    // The text with its hash: kept.
    send(&mut socket, persisted("text", Some(query), &hash)).await;
    let messages = until_complete_of(&mut socket, "text").await;
    assert_eq!(types_of(&messages, "text"), ["next", "next", "complete"]);
    // The hash alone: the kept text runs.
    send(&mut socket, persisted("hash", None, &hash)).await;
    let messages = until_complete_of(&mut socket, "hash").await;
    assert_eq!(
        types_of(&messages, "hash"),
        ["next", "next", "complete"],
        "{messages:#?}"
    );
    assert_eq!(messages[1]["payload"]["data"]["count"], 1);
    // A hash never sent with its text: Apollo's code, so its link resends.
    let unknown = "0".repeat(64);
    send(&mut socket, persisted("unknown", None, &unknown)).await;
    let wrong = persisted("wrong", Some("subscription { count(n: 1) }"), &hash);
    send(&mut socket, wrong).await;
    send(
        &mut socket,
        subscribe("end", "subscription { count(n: 1) }", "subscribe"),
    )
    .await;
    let messages = until_complete_of(&mut socket, "end").await;
    for (id, code) in [
        ("unknown", "PERSISTED_QUERY_NOT_FOUND"),
        ("wrong", "PERSISTED_QUERY_HASH_MISMATCH"),
    ] {
        assert_eq!(types_of(&messages, id), ["error"], "{messages:#?}");
        let error = messages.iter().find(|m| m["id"] == id).unwrap();
        assert_eq!(error["payload"][0]["extensions"]["code"], code, "{error}");
    }
}

#[tokio::test]
async fn an_event_reserves_its_priced_worst_case_on_the_read_quota_not_its_budget() {
    let mut config = Config::default();
    config.quota.reads = 10;
    config.budget.max_reads = 8;
    let costs = CostTable::new()
        .field("Held", "value", FieldCost::reads(1))
        .field("Query", "items", FieldCost::reads(1));
    let server = server_with(config, Some(costs)).await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    send(
        &mut socket,
        subscribe("h", "subscription { held { value } }", "subscribe"),
    )
    .await;
    let entered = server.gate.entered.notified();
    tokio::time::timeout(LIMIT, entered)
        .await
        .expect("the event runs");
    // While the event (one read at worst) resolves, the same client asks
    // for three over HTTP: the quota of ten has nine for it, not two.
    let body = json!({ "query": "{ a: items(first: 1) { id } b: items(first: 2) { id } c: items(first: 3) { id } }" });
    let client = fanout_budget::reqwest::Client::new();
    let response = (client.post(format!("http://{}/graphql", server.address)))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send();
    let response = tokio::time::timeout(LIMIT, response)
        .await
        .unwrap()
        .unwrap();
    let answer: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert!(answer["errors"].is_null(), "{answer}");
    server.gate.release.notify_one();
    let messages = until_complete_of(&mut socket, "h").await;
    assert_eq!(types_of(&messages, "h"), ["next", "complete"]);
    assert_eq!(messages[0]["payload"]["data"]["held"]["value"], 1);
}

#[tokio::test]
async fn a_subscription_by_hash_holds_the_weight_of_the_text_it_runs() {
    use sha2::Digest;
    // About 21 KiB each (8.5 KiB, the 12 KiB text once, a small
    // document) in an 86 KiB share that the connection's own 29 KiB (its
    // base, and its largest message read, 12 KiB) leaves 57 of: two such
    // subscriptions fit, and a query beside them (9 KiB while it runs).
    let mut config = Config::default();
    config.subscriptions.max_bytes_per_client = 86 << 10;
    let server = server_with(config, None).await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    let query = format!("subscription {{ quiet }}\n#{}\n", "x".repeat(12 << 10));
    let hash = format!("{:x}", sha2::Sha256::digest(query.as_bytes()));
    send(&mut socket, persisted("text", Some(&query), &hash)).await;
    send(&mut socket, persisted("hash", None, &hash)).await;
    // The third, by its hash alone, finds no room.
    send(&mut socket, persisted("again", None, &hash)).await;
    send(
        &mut socket,
        subscribe("mark", "{ __typename }", "subscribe"),
    )
    .await;
    let messages = until_complete_of(&mut socket, "mark").await;
    assert_eq!(types_of(&messages, "again"), ["error"], "{messages:#?}");
    let refusal = messages.iter().find(|m| m["id"] == "again").unwrap();
    assert_eq!(refusal["payload"][0]["extensions"]["code"], "OVERLOADED");
    // Stopped, the one by hash gives its room back.
    send(&mut socket, json!({ "type": "complete", "id": "hash" })).await;
    send(&mut socket, persisted("after", None, &hash)).await;
    send(&mut socket, subscribe("end", "{ __typename }", "subscribe")).await;
    let messages = until_complete_of(&mut socket, "end").await;
    assert!(types_of(&messages, "after").is_empty(), "{messages:#?}");
}

#[tokio::test]
async fn a_cyclic_or_deeply_nested_subscribe_is_refused_before_it_runs_and_the_socket_goes_on() {
    let server = server().await;
    let mut socket = connect(&server, "graphql-transport-ws").await;
    let cyclic = "fragment A on Subscription { ...A } subscription { ...A }";
    let deep = format!(
        "subscription {{ {} quiet {} }}",
        "a { ".repeat(10_000),
        "} ".repeat(10_000)
    );
    send(&mut socket, subscribe("cyclic", cyclic, "subscribe")).await;
    send(&mut socket, subscribe("deep", &deep, "subscribe")).await;
    send(
        &mut socket,
        subscribe("end", "subscription { count(n: 1) }", "subscribe"),
    )
    .await;
    let messages = until_complete_of(&mut socket, "end").await;
    for id in ["cyclic", "deep"] {
        assert_eq!(types_of(&messages, id), ["error"], "{messages:#?}");
    }
    assert_eq!(types_of(&messages, "end"), ["next", "complete"]);
}
