//! Subscriptions over WebSocket: one scope per connection, a budget that
//! refills, each event resolved under the per-request bounds, and the
//! connection's own bounds — driven by a real WebSocket client over
//! loopback, through `fanout_budget::inbound::serve`.

mod common;

use async_graphql::{Context, EmptyMutation, Schema, Subscription};
use common::{Base, Item, Query, Upstream};
use fanout_budget::config::SubscriptionsConfig;
use fanout_budget::graphql::{FanoutConnection, SharedPoll};
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::ws::{init, receive, send, subscribe, until_complete};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const TOKEN: &str = "s3cret-internal";
const LIMIT: Duration = Duration::from_secs(20);

struct Subscription;

/// How many polls the shared poll ran (each answer is its number).
struct Polls(Arc<AtomicU64>);

#[Subscription]
impl Subscription {
    /// `n` items from `first` on, one event each; an event's `detail`
    /// reads its item (one read per event).
    async fn items(&self, first: u64, n: u64) -> impl Stream<Item = Item> {
        futures::stream::iter((first..first + n).map(|id| Item { id }))
    }

    /// One item, then nothing until the client stops it.
    async fn once(&self, id: u64) -> impl Stream<Item = Item> {
        futures::stream::iter([Item { id }]).chain(futures::stream::pending())
    }

    /// Never an event, until the client stops it.
    async fn quiet(&self) -> impl Stream<Item = u64> {
        futures::stream::pending()
    }

    /// `/item/{id}` polled, shared by every subscriber on this server: each
    /// event is the number of the poll that made it.
    async fn polled(
        &self,
        ctx: &Context<'_>,
        id: u64,
    ) -> async_graphql::Result<impl Stream<Item = u64>> {
        let connection = ctx.data::<FanoutConnection>()?.clone();
        let polls = ctx.data::<SharedPoll<u64, u64>>()?;
        let url: fanout_budget::reqwest::Url =
            format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let counter = ctx.data::<Polls>()?.0.clone();
        Ok(polls.subscribe(id, &connection, move |operation| {
            let (url, counter) = (url.clone(), counter.clone());
            async move {
                let _answer = operation.upstream().read(Read::get(url)).await;
                counter.fetch_add(1, SeqCst) + 1
            }
        }))
    }
}

type SubSchema = Schema<Query, EmptyMutation, Subscription>;

struct Server {
    address: String,
    upstream: Upstream,
    polls: SharedPoll<u64, u64>,
    polls_run: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn server(subscriptions: SubscriptionsConfig) -> Server {
    let mut config = Config::default();
    config.subscriptions = subscriptions;
    server_with(config).await
}

async fn server_with(mut config: Config) -> Server {
    config.rate_limit.internal_token = TOKEN.into();
    config.http.max_connections_per_client = 10_000;
    let upstream = Upstream::start().await;
    let engine = Engine::new(config.clone());
    let polls = SharedPoll::new(Duration::from_millis(200));
    let polls_run = Arc::new(AtomicU64::new(0));
    let schema: SubSchema = Schema::build(Query, EmptyMutation, Subscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.base()))
        .data(polls.clone())
        .data(Polls(polls_run.clone()))
        .finish();
    let router = axum::Router::new()
        .route_service("/graphql", FanoutGraphQL::new(schema, engine.clone()))
        .route_layer(fanout_budget::inbound::RateLimitLayer::new(
            &config.rate_limit,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let task = tokio::spawn(async move {
        let _ = serving.await;
    });
    Server {
        address,
        upstream,
        polls,
        polls_run,
        task,
    }
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(server: &Server, protocol: &str, headers: &[(&str, &str)]) -> Socket {
    connect_to(server, "/graphql", protocol, headers).await
}

async fn connect_to(
    server: &Server,
    path: &str,
    protocol: &str,
    headers: &[(&str, &str)],
) -> Socket {
    let mut request = format!("ws://{}{path}", server.address)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol.parse().unwrap());
    for (name, value) in headers {
        let name: http::HeaderName = name.parse().unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    let (socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        protocol,
        "the subprotocol asked for"
    );
    socket
}

fn config() -> SubscriptionsConfig {
    SubscriptionsConfig::default()
}

#[tokio::test]
async fn each_event_is_charged_to_the_connection_and_reports_its_budget() {
    let server = server(config().burst(10).reads_per_minute(1)).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "1",
        "subscription { items(first: 1, n: 3) { id detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "1").await;
    assert_eq!(events.len(), 3, "{events:?}");
    for (k, event) in events.iter().enumerate() {
        assert_eq!(event["type"], "next");
        let payload = &event["payload"];
        assert_eq!(
            payload["data"]["items"]["detail"]["value"],
            format!("item-{}", k + 1)
        );
        let fanout = &payload["extensions"]["fanout"];
        assert_eq!(fanout["limit"], 10, "the connection's burst: {fanout}");
        assert_eq!(
            fanout["used"],
            k as u64 + 1,
            "cumulative on the connection: {fanout}"
        );
        assert_eq!(fanout["operationReads"], 1, "the event's own: {fanout}");
        let remaining = fanout["remaining"].as_u64().unwrap();
        assert!(remaining <= 10 - (k as u64 + 1) + 1, "{fanout}");
    }
    assert_eq!(server.upstream.requests(), 3);
}

#[tokio::test]
async fn a_read_the_connection_cannot_pay_for_is_exhausted_at_its_field_and_the_event_still_comes()
{
    let (codes, sent, _) = over_its_burst(fanout_budget::config::LimitMode::Enforce).await;
    assert_eq!(codes.len(), 4, "every event delivered: {codes:?}");
    let exhausted: Vec<_> = codes.iter().filter(|c| !c.is_null()).collect();
    assert_eq!(
        exhausted,
        vec![&json!("FANOUT_BUDGET_EXHAUSTED"); 2],
        "{codes:?}"
    );
    assert_eq!(sent, 2, "no read past the bucket was sent");
}

/// The events of a subscription of four one-read events on a connection
/// whose bucket holds two, in `mode`: the codes at the reads' fields, the
/// requests sent, and each event's `extensions.fanout`.
async fn over_its_burst(mode: fanout_budget::config::LimitMode) -> (Vec<Value>, u64, Vec<Value>) {
    let server = server(config().burst(2).reads_per_minute(1).mode(mode)).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "a",
        "subscription { items(first: 1, n: 4) { id detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "a").await;
    let codes = (events.iter())
        .map(|e| e["payload"]["errors"][0]["extensions"]["code"].clone())
        .collect();
    let fanout = (events.iter())
        .map(|e| e["payload"]["extensions"]["fanout"].clone())
        .collect();
    (codes, server.upstream.requests(), fanout)
}

#[tokio::test]
async fn the_connection_budget_in_measure_mode_sends_and_counts_what_enforce_refused() {
    use fanout_budget::config::LimitMode;
    use metrics_exporter_prometheus::PrometheusBuilder;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _installed = metrics::set_global_recorder(recorder);
    let would_refuse = || {
        let page = handle.render();
        fanout_testkit::prometheus::value(
            &page,
            "fanout_would_refuse_total",
            &["limit=\"subscriptions\""],
        )
        .unwrap_or(0.0)
    };
    let (codes, sent, _) = over_its_burst(LimitMode::Enforce).await;
    let refused = codes
        .iter()
        .filter(|c| **c == "FANOUT_BUDGET_EXHAUSTED")
        .count();
    assert_eq!((refused, sent), (2, 2), "{codes:?}");
    assert_eq!(would_refuse(), 0.0);
    let (codes, sent, fanout) = over_its_burst(LimitMode::Measure).await;
    assert!(
        codes.iter().all(Value::is_null),
        "nothing refused: {codes:?}"
    );
    assert_eq!(sent, 4, "every read sent");
    assert_eq!(would_refuse(), refused as f64, "counted as enforce refused");
    let shown: u64 = fanout
        .iter()
        .filter_map(|f| f["wouldRefuse"].as_u64())
        .sum();
    assert_eq!(
        shown, refused as u64,
        "each event shows its own: {fanout:?}"
    );
    let last = fanout.last().unwrap();
    assert_eq!(last["used"], 4, "used counts the reads sent: {last}");
    assert_eq!(last["remaining"], 0, "never below 0: {last}");
}

#[tokio::test]
async fn an_event_reads_at_most_max_reads_whatever_the_connection_holds() {
    let mut config = Config::default();
    config.budget.max_reads = 2;
    config.subscriptions = self::config().burst(1000);
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "q",
        "{ items(first: 3) { id detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "q").await;
    let payload = &events[0]["payload"];
    assert_eq!(
        payload["extensions"]["fanout"]["operationReads"], 2,
        "{payload}"
    );
    let codes: Vec<_> = payload["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["extensions"]["code"].clone())
        .collect();
    assert_eq!(
        codes,
        vec![json!("FANOUT_BUDGET_EXHAUSTED"); 2],
        "{payload}"
    );
    assert_eq!(server.upstream.requests(), 2);
}

#[tokio::test]
async fn one_past_max_per_connection_is_refused_by_id_and_the_others_go_on() {
    let server = server(config().max_per_connection(2)).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(&mut socket, "q1", "subscription { quiet }").await;
    subscribe(&mut socket, "q2", "subscription { quiet }").await;
    subscribe(&mut socket, "q3", "subscription { quiet }").await;
    let refusal = receive(&mut socket).await.unwrap();
    assert_eq!(refusal["type"], "error");
    assert_eq!(refusal["id"], "q3");
    assert_eq!(
        refusal["payload"][0]["extensions"]["code"],
        "TOO_MANY_SUBSCRIPTIONS"
    );
    // Stopping one makes room; the others were untouched.
    send(&mut socket, json!({ "type": "complete", "id": "q1" })).await;
    subscribe(
        &mut socket,
        "n",
        "subscription { items(first: 5, n: 1) { id } }",
    )
    .await;
    let events = until_complete(&mut socket, "n").await;
    assert_eq!(events[0]["payload"]["data"]["items"]["id"], 5);
}

#[tokio::test]
async fn ten_thousand_subscribes_on_one_connection_hold_no_more_than_the_bound() {
    let server = server(config().max_per_connection(4)).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    let (mut sink, mut stream) = socket.split();
    let writer = tokio::spawn(async move {
        for n in 0..10_000 {
            let message = json!({ "type": "subscribe", "id": n.to_string(), "payload": { "query": "subscription { quiet }" } });
            if sink.send(Message::text(message.to_string())).await.is_err() {
                break;
            }
        }
        sink
    });
    let mut refused = 0;
    while refused < 10_000 - 4 {
        let Some(Ok(Message::Text(text))) =
            tokio::time::timeout(LIMIT, stream.next()).await.unwrap()
        else {
            continue;
        };
        let value: Value = serde_json::from_str(&text).unwrap();
        if value["type"] == "error" {
            assert_eq!(
                value["payload"][0]["extensions"]["code"],
                "TOO_MANY_SUBSCRIPTIONS"
            );
            refused += 1;
        }
    }
    drop(writer.await.unwrap());
    // Another client is served meanwhile.
    let mut other = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut other, json!({})).await;
    subscribe(
        &mut other,
        "1",
        "subscription { items(first: 1, n: 1) { id } }",
    )
    .await;
    assert_eq!(until_complete(&mut other, "1").await.len(), 1);
}

#[tokio::test]
async fn protocol_violations_close_with_their_codes() {
    let server = server(config().init_timeout_ms(300).max_message_bytes(1024)).await;
    // No connection_init in time.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    assert_eq!(receive(&mut socket).await, Err(Some(4408)));
    // A subscribe before the ack.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    subscribe(&mut socket, "1", "subscription { quiet }").await;
    assert_eq!(receive(&mut socket).await, Err(Some(4401)));
    // A second connection_init.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    send(&mut socket, json!({ "type": "connection_init" })).await;
    assert_eq!(receive(&mut socket).await, Err(Some(4429)));
    // An id already active.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(&mut socket, "same", "subscription { quiet }").await;
    subscribe(&mut socket, "same", "subscription { quiet }").await;
    assert_eq!(receive(&mut socket).await, Err(Some(4409)));
    // A message past max_message_bytes.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    let big = format!("subscription {{ quiet }} # {}", "x".repeat(4096));
    subscribe(&mut socket, "big", &big).await;
    assert_eq!(receive(&mut socket).await, Err(Some(4400)));
    // An id past 128 bytes.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(&mut socket, &"i".repeat(129), "subscription { quiet }").await;
    assert_eq!(receive(&mut socket).await, Err(Some(4400)));
    // Not a message of the protocol.
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    socket.send(Message::text("{not json")).await.unwrap();
    assert_eq!(receive(&mut socket).await, Err(Some(4400)));
}

#[tokio::test]
async fn the_internal_token_in_connection_init_gets_the_internal_budget_and_a_forged_one_nothing_more(
) {
    let server = server(config().burst(5).internal_burst(50)).await;
    for (payload, headers, limit) in [
        (json!({ "x-internal-token": TOKEN }), vec![], 50),
        (json!({ "x-internal-token": "forged" }), vec![], 5),
        (json!({}), vec![("x-internal-token", TOKEN)], 50),
        (json!({}), vec![("x-internal-token", "forged")], 5),
    ] {
        let mut socket = connect(&server, "graphql-transport-ws", &headers).await;
        init(&mut socket, payload.clone()).await;
        subscribe(
            &mut socket,
            "1",
            "subscription { items(first: 1, n: 1) { id } }",
        )
        .await;
        let events = until_complete(&mut socket, "1").await;
        let fanout = &events[0]["payload"]["extensions"]["fanout"];
        assert_eq!(fanout["limit"], limit, "{payload} {headers:?}: {fanout}");
    }
}

#[tokio::test]
async fn a_query_over_the_socket_is_one_event_of_the_connection() {
    let server = server(config()).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "q",
        "{ items(first: 3) { id detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "q").await;
    assert_eq!(events.len(), 1);
    let payload = &events[0]["payload"];
    assert_eq!(payload["data"]["items"].as_array().unwrap().len(), 3);
    assert_eq!(
        payload["extensions"]["fanout"]["operationReads"], 4,
        "the list and three items"
    );
    assert_eq!(payload["extensions"]["fanout"]["used"], 4);
}

#[tokio::test]
async fn the_legacy_protocol_is_served_too() {
    let server = server(config()).await;
    let mut socket = connect(&server, "graphql-ws", &[]).await;
    init(&mut socket, json!({})).await;
    let start = json!({ "type": "start", "id": "7", "payload": { "query": "subscription { items(first: 2, n: 2) { id } }" } });
    send(&mut socket, start).await;
    let events = until_complete(&mut socket, "7").await;
    let ids: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e["type"].clone(),
                e["payload"]["data"]["items"]["id"].clone(),
            )
        })
        .collect();
    assert_eq!(ids, [(json!("data"), json!(2)), (json!("data"), json!(3))]);
}

#[tokio::test]
async fn subscribers_of_one_key_share_one_poll_and_the_charges_add_up_to_the_requests_sent() {
    let server = server(config().burst(1000)).await;
    let mut sockets = Vec::new();
    for _ in 0..20 {
        let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
        init(&mut socket, json!({})).await;
        subscribe(&mut socket, "p", "subscription { polled(id: 7) }").await;
        sockets.push(socket);
    }
    // Every subscriber sees poll 3 or a later one.
    for socket in &mut sockets {
        loop {
            let event = receive(socket).await.unwrap();
            if event["payload"]["data"]["polled"].as_u64().unwrap() >= 3 {
                break;
            }
        }
    }
    for socket in &mut sockets {
        send(socket, json!({ "type": "complete", "id": "p" })).await;
    }
    fanout_testkit::until(
        "the poll stops with its last subscriber",
        LIMIT,
        async || server.polls.keys() == 0,
    )
    .await;
    let sent = server.upstream.seen.count("/item/7");
    let polls = server.polls_run.load(SeqCst);
    assert_eq!(
        sent, polls,
        "one request per poll for all twenty subscribers"
    );
    assert!(polls >= 3, "{polls}");
    // What each connection was charged, read back with a query (an event
    // that reads nothing).
    let mut charged = Vec::new();
    for socket in &mut sockets {
        subscribe(socket, "used", "{ __typename }").await;
        let events = until_complete(socket, "used").await;
        charged.push(
            events[0]["payload"]["extensions"]["fanout"]["used"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(
        charged.iter().sum::<u64>(),
        sent,
        "the reads charged across the connections add up to the requests sent: {charged:?}"
    );
    // Round-robin: the polls were paid by more than one connection.
    let payers = charged.iter().filter(|&&used| used > 0).count();
    assert!(payers >= 3.min(sent as usize), "paid in turn: {charged:?}");
}

#[tokio::test]
async fn a_subscriber_whose_read_quota_is_empty_never_makes_a_shared_poll_fail() {
    let mut config = Config::default();
    // One read an hour for the public client: its first poll spends it.
    config.quota.reads = 1;
    config.quota.period_secs = 3600;
    let server = server_with(config).await;
    let mut public = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut public, json!({})).await;
    subscribe(&mut public, "p", "subscription { polled(id: 9) }").await;
    assert_eq!(receive(&mut public).await.unwrap()["type"], "next");
    // The internal caller (no quota) subscribes too: the two pay in turn.
    let mut internal = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut internal, json!({ "x-internal-token": TOKEN })).await;
    subscribe(&mut internal, "p", "subscription { polled(id: 9) }").await;
    let polls = server.polls_run.load(SeqCst);
    fanout_testkit::until("five more polls", LIMIT, async || {
        server.polls_run.load(SeqCst) >= polls + 5
    })
    .await;
    drop((public, internal));
    fanout_testkit::until("the poll stops", LIMIT, async || server.polls.keys() == 0).await;
    // Every poll was sent: one the public client could not pay for was
    // paid by the other subscriber, not refused for everyone.
    let (sent, polls) = (
        server.upstream.seen.count("/item/9"),
        server.polls_run.load(SeqCst),
    );
    assert_eq!(sent, polls, "{sent} requests for {polls} polls");
}

#[tokio::test]
async fn the_same_client_shares_one_read_quota_over_http_and_websocket() {
    let mut config = Config::default();
    config.quota.reads = 3;
    config.quota.period_secs = 3600;
    config.subscriptions = self::config().burst(100);
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    // Two reads over the socket, from the client's quota of three.
    subscribe(
        &mut socket,
        "a",
        "subscription { items(first: 1, n: 2) { detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "a").await;
    assert!(
        events.iter().all(|e| e["payload"]["errors"].is_null()),
        "{events:?}"
    );
    let quota = &events[1]["payload"]["extensions"]["fanout"]["quota"];
    assert_eq!(quota["remaining"], 1, "{quota}");
    // Over HTTP the same client finds the one read left (an HTTP request
    // without a cost table reserves its budget: refused whole).
    let body = json!({ "query": "{ a: item(id: 8) { detail { value } } }" });
    let answer: Value = reqwest_post(&server.address, &body).await;
    let refusal = &answer["errors"][0]["extensions"];
    assert_eq!(refusal["code"], "QUOTA_EXHAUSTED", "{answer}");
    assert_eq!(refusal["remaining"], 1, "{answer}");
    // The socket spends it, then runs its events on nothing: delivered,
    // each read refused at its field.
    subscribe(
        &mut socket,
        "b",
        "subscription { items(first: 5, n: 2) { detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "b").await;
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0]["payload"]["data"]["items"]["detail"]["value"],
        "item-5"
    );
    assert_eq!(
        events[1]["payload"]["errors"][0]["extensions"]["code"], "FANOUT_BUDGET_EXHAUSTED",
        "{events:?}"
    );
    assert_eq!(
        server.upstream.requests(),
        3,
        "three reads in all, the quota"
    );
}

/// POSTs `body` to the server's `/graphql` over loopback.
async fn reqwest_post(address: &str, body: &Value) -> Value {
    let client = fanout_budget::reqwest::Client::new();
    let response = client
        .post(format!("http://{address}/graphql"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn an_event_gives_its_memory_back_when_it_is_answered_not_when_the_next_one_comes() {
    // Room for two requests' first blocks (64 KiB each), no more.
    let mut config = Config::default();
    config.http.max_inflight_bytes = 2 * 64 * 1024;
    let server = server_with(config).await;
    let mut sockets = Vec::new();
    for n in 0..6 {
        let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
        init(&mut socket, json!({})).await;
        // One event that reads, and the subscription stays open.
        let query = format!("subscription {{ once(id: {n}) {{ detail {{ value }} }} }}");
        subscribe(&mut socket, "once", &query).await;
        let event = receive(&mut socket).await.unwrap();
        assert!(event["payload"]["errors"].is_null(), "{event}");
        sockets.push(socket);
    }
    // Six answered events hold nothing: a request still fits.
    let answer = reqwest_post(
        &server.address,
        &json!({ "query": "{ item(id: 1) { detail { value } } }" }),
    )
    .await;
    assert!(answer["errors"].is_null(), "{answer}");
}

#[tokio::test]
async fn an_event_past_the_answer_bound_is_answered_with_its_code_and_the_connection_goes_on() {
    let mut config = Config::default();
    config.http.max_answer_bytes = 1000;
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "big",
        "subscription { items(first: 1, n: 2) { id detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "big").await;
    assert_eq!(events.len(), 2, "{events:?}");
    for event in &events {
        assert_eq!(
            event["payload"]["errors"][0]["extensions"]["code"], "RESPONSE_TOO_LARGE",
            "{event}"
        );
    }
    // The connection still serves.
    subscribe(&mut socket, "small", "{ __typename }").await;
    assert_eq!(until_complete(&mut socket, "small").await.len(), 1);
}

#[tokio::test]
async fn an_event_the_memory_pool_cannot_hold_is_replaced_by_one_saying_so() {
    // Room in the client's share of the sockets' pool for the connection
    // (16 KiB and its headers) and the subscription (about 9 KiB), not for
    // its event's first 64 KiB block.
    let mut config = Config::default();
    config.subscriptions.max_bytes_per_client = 33 << 10;
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(&mut socket, "x", "subscription { once(id: 1) { id } }").await;
    let event = receive(&mut socket).await.unwrap();
    assert_eq!(event["type"], "next");
    assert_eq!(
        event["payload"]["errors"][0]["extensions"]["code"], "OVERLOADED",
        "{event}"
    );
}

#[tokio::test]
async fn under_fanout_layer_the_companion_serves_subscriptions_on_the_same_path() {
    use fanout_budget::graphql::FanoutSubscription;
    use fanout_budget::FanoutLayer;
    let mut config = Config::default();
    config.subscriptions = self::config().burst(7);
    let upstream = Upstream::start().await;
    let engine = Engine::new(config.clone());
    let schema: SubSchema = Schema::build(Query, EmptyMutation, Subscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.base()))
        .finish();
    let router = axum::Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema.clone()))
        .route_service(
            "/graphql/ws",
            FanoutSubscription::new(schema, engine.clone()),
        )
        .layer(FanoutLayer::new(engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let task = tokio::spawn(async move {
        let _ = serving.await;
    });
    let server = Server {
        address,
        upstream,
        polls: SharedPoll::new(Duration::from_secs(1)),
        polls_run: Arc::default(),
        task,
    };
    let mut socket = connect_to(&server, "/graphql/ws", "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "1",
        "subscription { items(first: 1, n: 2) { detail { value } } }",
    )
    .await;
    let events = until_complete(&mut socket, "1").await;
    let used: Vec<_> = events
        .iter()
        .map(|e| e["payload"]["extensions"]["fanout"]["used"].clone())
        .collect();
    assert_eq!(used, [json!(1), json!(2)], "{events:?}");
    assert_eq!(events[0]["payload"]["extensions"]["fanout"]["limit"], 7);
    // The stock service still answers queries.
    let answer = reqwest_post(
        &server.address,
        &json!({ "query": "{ item(id: 3) { detail { value } } }" }),
    )
    .await;
    assert_eq!(
        answer["data"]["item"]["detail"]["value"], "item-3",
        "{answer}"
    );
}

#[tokio::test]
async fn each_operation_on_a_socket_is_a_request_under_the_per_ip_limit() {
    let mut config = Config::default();
    // The upgrade is one request; two operations more, then refused.
    config.rate_limit.requests_per_minute = 3;
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    for id in ["1", "2"] {
        subscribe(&mut socket, id, "{ __typename }").await;
        assert_eq!(until_complete(&mut socket, id).await.len(), 1);
    }
    subscribe(&mut socket, "3", "{ __typename }").await;
    let refusal = receive(&mut socket).await.unwrap();
    assert_eq!(
        (refusal["type"].as_str(), refusal["id"].as_str()),
        (Some("error"), Some("3")),
        "{refusal}"
    );
    assert_eq!(
        refusal["payload"][0]["extensions"]["code"], "RATE_LIMITED",
        "{refusal}"
    );
    // The same client over HTTP is limited too: the socket spent its requests.
    let answer = reqwest_post(&server.address, &json!({ "query": "{ __typename }" })).await;
    assert_eq!(
        answer["errors"][0]["extensions"]["code"], "RATE_LIMITED",
        "{answer}"
    );
    // An internal caller (the token in connection_init) is exempt. Its
    // upgrade carries no token header, so it is counted: a fresh server.
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = 1;
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({ "x-internal-token": TOKEN })).await;
    for n in 0..5 {
        let id = n.to_string();
        subscribe(&mut socket, &id, "{ __typename }").await;
        assert_eq!(
            until_complete(&mut socket, &id).await.len(),
            1,
            "operation {n}"
        );
    }
}

#[tokio::test]
async fn an_idle_subscription_gives_back_the_read_quota_its_last_event_reserved() {
    let mut config = Config::default();
    config.budget.max_reads = 5;
    config.quota.reads = 6;
    config.quota.period_secs = 3600;
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    // One event that reads once (it reserved its budget, five), then idle.
    subscribe(
        &mut socket,
        "o",
        "subscription { once(id: 1) { detail { value } } }",
    )
    .await;
    let event = receive(&mut socket).await.unwrap();
    assert_eq!(event["type"], "next", "{event}");
    assert_eq!(
        event["payload"]["extensions"]["fanout"]["operationReads"], 1,
        "{event}"
    );
    // The event is over: what it did not spend is back on the quota, so an
    // HTTP request from the same client reserves its five.
    let body = json!({ "query": "{ a: item(id: 8) { detail { value } } }" });
    let answer = reqwest_post(&server.address, &body).await;
    assert!(answer["errors"].is_null(), "{answer}");
    assert_eq!(answer["data"]["a"]["detail"]["value"], "item-8");
    drop(socket);
}

#[tokio::test]
async fn a_client_that_never_reads_cannot_fill_the_pool_with_finished_queries() {
    let mut config = Config::default();
    config.http.max_inflight_bytes = 8 << 20;
    // The connection is not cut for its stalled writes during the test.
    config.http.write_timeout_ms = 120_000;
    let server = server_with(config).await;
    // A client that reads nothing once acked, behind a small receive buffer
    // (the server's writes stall early).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket
        .connect(server.address.parse().unwrap())
        .await
        .unwrap();
    let mut request = format!("ws://{}/graphql", server.address)
        .into_client_request()
        .unwrap();
    let protocol = "graphql-transport-ws".parse().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol);
    let stream = MaybeTlsStream::Plain(stream);
    let (mut hostile, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    send(&mut hostile, json!({ "type": "connection_init" })).await;
    assert_eq!(
        receive(&mut hostile).await.unwrap()["type"],
        "connection_ack"
    );
    // Thousands of one-event queries, each with the longest id taken: every
    // one ends at once, its event and its `complete` left to write.
    let writer = tokio::spawn(async move {
        let mut sent = 0;
        for n in 0..3_000 {
            let id = format!("{n:0>128}");
            let message =
                json!({ "type": "subscribe", "id": id, "payload": { "query": "{ __typename }" } });
            let sending = hostile.send(Message::text(message.to_string()));
            // A send that stalls: the server stopped reading.
            match tokio::time::timeout(Duration::from_secs(3), sending).await {
                Ok(Ok(())) => sent += 1,
                _ => break,
            }
        }
        (sent, hostile)
    });
    let (sent, hostile) = writer.await.unwrap();
    // Meanwhile and after, another client's request finds memory in the
    // pool: what waits for the hostile client is bounded per connection.
    // Paced over 3 s (30 requests): as many as the per-IP limit lets one
    // address send, however fast the machine answers.
    let body = json!({ "query": "{ a: item(id: 8) { detail { value } } }" });
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    for _ in 0..30 {
        pace.tick().await;
        let answer = reqwest_post(&server.address, &body).await;
        assert!(
            answer["errors"].is_null(),
            "after {sent} subscribes from a client that reads nothing: {answer}"
        );
    }
    drop(hostile);
}

/// The upgrade's answer status for a request with these headers.
async fn upgrade_status(server: &Server, headers: &[(&str, &str)]) -> u16 {
    let mut request = format!("ws://{}/graphql", server.address)
        .into_client_request()
        .unwrap();
    let protocol = "graphql-transport-ws".parse().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol);
    for (name, value) in headers {
        let name: http::HeaderName = name.parse().unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((_, response)) => response.status().as_u16(),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_page_on_another_site_cannot_open_a_socket_with_its_visitors_cookies() {
    let mut config = Config::default();
    config.http.cors_allowed_origins = vec!["https://app.example".into()];
    let server = server_with(config).await;
    let same = format!("http://{}", server.address);
    // A browser names the page's origin; the library's default (as for a
    // cross-site GET, `http.csrf_get`) refuses another site's.
    let cookie = ("cookie", "session=visitor");
    assert_eq!(
        upgrade_status(&server, &[("origin", "https://evil.example"), cookie]).await,
        400,
        "a page on another site"
    );
    // Its own origin, an origin CORS allows, or no browser at all: served.
    for origin in [same.as_str(), "https://app.example"] {
        assert_eq!(
            upgrade_status(&server, &[("origin", origin), cookie]).await,
            101,
            "{origin}"
        );
    }
    assert_eq!(
        upgrade_status(&server, &[]).await,
        101,
        "no Origin: not a browser"
    );
    // `csrf_get = "allow"` (plain cross-site `GET`s run) does not open
    // sockets to other sites: a page would read every answer, and spend its
    // visitors' limits.
    let mut config = Config::default();
    config.http.csrf_get = Some(fanout_budget::config::CsrfGet::Allow);
    let open = server_with(config).await;
    assert_eq!(
        upgrade_status(&open, &[("origin", "https://evil.example")]).await,
        400
    );
    let same = format!("http://{}", open.address);
    assert_eq!(
        upgrade_status(&open, &[("origin", same.as_str())]).await,
        101
    );
    // A page whose name was pointed at this server (DNS rebinding) names
    // itself in both `Origin` and `Host`: refused once `allowed_hosts` is set.
    let mut config = Config::default();
    config.http.allowed_hosts = vec!["127.0.0.1".into()];
    let guarded = server_with(config).await;
    let port = guarded.address.rsplit_once(':').unwrap().1;
    let rebound = format!("evil.example:{port}");
    let page = format!("http://{rebound}");
    assert_eq!(
        upgrade_status(
            &guarded,
            &[("origin", page.as_str()), ("host", rebound.as_str())]
        )
        .await,
        400,
        "a rebound name"
    );
    let same = format!("http://{}", guarded.address);
    assert_eq!(
        upgrade_status(&guarded, &[("origin", same.as_str())]).await,
        101,
        "a listed name"
    );
}

#[tokio::test]
async fn each_active_subscription_holds_its_weight_in_the_sockets_pool() {
    // Room for the connection (16 KiB and its headers) and three
    // subscriptions (about 9 KiB each: 8 KiB, their documents and texts),
    // not four; the requests' pool is not touched.
    let mut config = Config::default();
    config.subscriptions.max_bytes = 47 << 10;
    let server = server_with(config).await;
    let mut socket = connect(&server, "graphql-transport-ws", &[]).await;
    init(&mut socket, json!({})).await;
    for id in ["1", "2", "3", "4"] {
        subscribe(&mut socket, id, "subscription { quiet }").await;
    }
    let refusal = receive(&mut socket).await.unwrap();
    assert_eq!(
        (refusal["type"].as_str(), refusal["id"].as_str()),
        (Some("error"), Some("4")),
        "{refusal}"
    );
    assert_eq!(
        refusal["payload"][0]["extensions"]["code"], "OVERLOADED",
        "{refusal}"
    );
    // One stopped gives its weight back: a fourth fits again (its event,
    // a 64 KiB block, does not: it is replaced by one saying so).
    send(&mut socket, json!({ "type": "complete", "id": "1" })).await;
    subscribe(
        &mut socket,
        "5",
        "subscription { items(first: 1, n: 1) { id } }",
    )
    .await;
    let events = until_complete(&mut socket, "5").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "next", "subscribed: {events:?}");
}
