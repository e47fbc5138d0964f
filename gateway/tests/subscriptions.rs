//! The gateway's `tagChanges` subscription over a real WebSocket
//! (graphql-transport-ws, tokio-tungstenite), through the gateway's router
//! served by `fanout_budget::inbound::serve` on loopback, on the embedded
//! registry: the digest at once, then each change; a failed poll is an
//! `errors` entry and the subscription goes on; 50 subscribers share one
//! `HEAD` per interval, and the reads charged across their connections add
//! up to the requests the registry received; the internal token in
//! `connection_init` gets the internal burst.
mod common;

use common::{EmbeddedRegistry, Image};
use fanout_budget::Config;
use fanout_gateway::embedded::Fault;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const TOKEN: &str = "s3cret-internal";
/// How long any one message may take (a poll is every second).
const LIMIT: Duration = Duration::from_secs(20);

/// The gateway on the embedded fixture registry, polling every second.
struct Served {
    registry: EmbeddedRegistry,
    gateway: fanout_gateway::app::Gateway,
    address: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Served {
    let mut config = Config::default();
    config.subscriptions.poll_interval_ms = 1000;
    config.rate_limit.internal_token = TOKEN.into();
    config.http.max_connections_per_client = 10_000;
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = fanout_gateway::app::build(config.clone(), registry.url().parse().unwrap(), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let serving =
        fanout_budget::inbound::serve(listener, gateway.router.clone(), &config).into_future();
    let task = tokio::spawn(async move {
        let _ = serving.await;
    });
    Served {
        registry,
        gateway,
        address,
        task,
    }
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A graphql-transport-ws connection, acknowledged after `payload`.
async fn connect(served: &Served, payload: Value) -> Socket {
    let mut request = format!("ws://{}/graphql", served.address)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    send(
        &mut socket,
        json!({ "type": "connection_init", "payload": payload }),
    )
    .await;
    assert_eq!(receive(&mut socket).await["type"], "connection_ack");
    socket
}

async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::text(message.to_string()))
        .await
        .unwrap();
}

/// The next protocol message (pings skipped).
async fn receive(socket: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(LIMIT, socket.next())
            .await
            .expect("a message within the limit");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["type"] == "ping" || value["type"] == "pong" {
                    continue;
                }
                return value;
            }
            Some(Ok(Message::Close(frame))) => panic!("closed by the server: {frame:?}"),
            Some(Ok(_)) => continue,
            other => panic!("the connection ended: {other:?}"),
        }
    }
}

/// The next `next` payload of subscription `id`.
async fn next_event(socket: &mut Socket, id: &str) -> Value {
    loop {
        let message = receive(socket).await;
        if message["id"] != id {
            continue;
        }
        assert_eq!(message["type"], "next", "{message}");
        return message["payload"].clone();
    }
}

async fn subscribe(socket: &mut Socket, id: &str, repository: &str, tag: &str) {
    let query = format!(
        r#"subscription {{ tagChanges(repository: "{repository}", tag: "{tag}") {{ repository tag digest mediaType }} }}"#
    );
    let message = json!({ "type": "subscribe", "id": id, "payload": { "query": query } });
    send(socket, message).await;
}

/// `{ __typename }` over the socket as operation `id`: its one answer.
async fn query_typename(socket: &mut Socket, id: &str) -> Value {
    let message =
        json!({ "type": "subscribe", "id": id, "payload": { "query": "{ __typename }" } });
    send(socket, message).await;
    let answer = next_event(socket, id).await;
    loop {
        let message = receive(socket).await;
        if message["id"] == id {
            assert_eq!(message["type"], "complete", "{message}");
            return answer;
        }
    }
}

fn digest_of(event: &Value) -> Value {
    event["data"]["tagChanges"]["digest"].clone()
}

/// A new image under `repository:tag` in the registry; its digest.
fn push(served: &Served, repository: &str, tag: &str, seed: &str) -> String {
    served.registry.with_store(|s| {
        s.put_image(repository, Some(tag), &Image::demo("linux", "amd64", seed))
            .0
    })
}

fn tag_digest(served: &Served, repository: &str, tag: &str) -> String {
    served
        .registry
        .with_store(|s| s.repos[repository].tags[tag].clone())
}

#[tokio::test]
async fn tag_changes_delivers_the_digest_at_once_then_each_change() {
    let served = start().await;
    let mut socket = connect(&served, json!({})).await;
    subscribe(&mut socket, "1", "acme/app", "t01").await;
    let first = next_event(&mut socket, "1").await;
    assert!(first.get("errors").is_none(), "{first}");
    assert_eq!(
        first["data"]["tagChanges"],
        json!({
            "repository": "acme/app",
            "tag": "t01",
            "digest": tag_digest(&served, "acme/app", "t01"),
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
        })
    );
    assert_eq!(first["extensions"]["fanout"]["limit"], 100, "{first}");

    let pushed = push(&served, "acme/app", "t01", "changed");
    let changed = next_event(&mut socket, "1").await;
    assert!(changed.get("errors").is_none(), "{changed}");
    assert_eq!(digest_of(&changed), json!(pushed), "{changed}");
    // Polled by manifest HEADs only: never a pull.
    let path = served
        .registry
        .counters()
        .path("/v2/acme/app/manifests/t01");
    assert!(
        path >= 2,
        "at least the first poll and the one that saw the push: {path}"
    );
    assert_eq!(served.registry.counters().pulls(), 0);
}

#[tokio::test]
async fn a_failed_poll_is_an_error_in_the_next_payload_and_the_subscription_recovers() {
    let served = start().await;
    let mut socket = connect(&served, json!({})).await;
    subscribe(&mut socket, "s", "acme/app", "t02").await;
    let first = next_event(&mut socket, "s").await;
    let before = tag_digest(&served, "acme/app", "t02");
    assert_eq!(digest_of(&first), json!(before), "{first}");

    served
        .registry
        .set_tag_fault("acme/app", "t02", Some(Fault::Status(500)));
    let failed = next_event(&mut socket, "s").await;
    let errors = failed["errors"].as_array().expect("an errors entry");
    assert_eq!(errors.len(), 1, "{failed}");
    assert_eq!(errors[0]["path"], json!(["tagChanges"]), "{failed}");
    assert!(
        errors[0]["extensions"]["code"].is_string(),
        "a contract code: {failed}"
    );

    // The subscription goes on: the registry answers again, the digest is back.
    served.registry.set_tag_fault("acme/app", "t02", None);
    let recovered = next_event(&mut socket, "s").await;
    assert!(recovered.get("errors").is_none(), "{recovered}");
    assert_eq!(digest_of(&recovered), json!(before), "{recovered}");
    // And a change after it still arrives.
    let pushed = push(&served, "acme/app", "t02", "after-the-fault");
    let changed = next_event(&mut socket, "s").await;
    assert_eq!(digest_of(&changed), json!(pushed), "{changed}");
}

#[tokio::test]
async fn a_tag_that_does_not_exist_yet_is_null_then_appears() {
    let served = start().await;
    let mut socket = connect(&served, json!({})).await;
    subscribe(&mut socket, "n", "acme/app", "next-release").await;
    let first = next_event(&mut socket, "n").await;
    assert!(first.get("errors").is_none(), "{first}");
    assert_eq!(
        first["data"]["tagChanges"],
        json!({ "repository": "acme/app", "tag": "next-release", "digest": null, "mediaType": null })
    );
    let pushed = push(&served, "acme/app", "next-release", "released");
    let appeared = next_event(&mut socket, "n").await;
    assert!(appeared.get("errors").is_none(), "{appeared}");
    assert_eq!(digest_of(&appeared), json!(pushed), "{appeared}");
    assert_eq!(
        appeared["data"]["tagChanges"]["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
}

#[tokio::test]
async fn fifty_subscribers_share_one_head_per_interval_and_their_charges_add_up() {
    const SUBSCRIBERS: usize = 50;
    let served = start().await;
    let path = "/v2/acme/app/manifests/t05";
    let started = Instant::now();
    let mut sockets = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut socket = connect(&served, json!({})).await;
        subscribe(&mut socket, "tag", "acme/app", "t05").await;
        sockets.push(socket);
    }
    let before = tag_digest(&served, "acme/app", "t05");
    for socket in &mut sockets {
        let first = next_event(socket, "tag").await;
        assert_eq!(digest_of(&first), json!(before), "{first}");
    }
    assert_eq!(served.gateway.tag_polls.keys(), 1, "one poll for the tag");

    let pushed = push(&served, "acme/app", "t05", "fifty");
    for socket in &mut sockets {
        let changed = next_event(socket, "tag").await;
        assert_eq!(digest_of(&changed), json!(pushed), "{changed}");
    }
    // Every subscriber has the change: the poll that saw it has just
    // finished, the next is an interval away. All of them leave now.
    for socket in &mut sockets {
        send(socket, json!({ "type": "complete", "id": "tag" })).await;
    }
    let elapsed = started.elapsed();
    fanout_testkit::until("the poll stops", LIMIT, async || {
        served.gateway.tag_polls.keys() == 0
    })
    .await;

    // One HEAD at once, then one per second: over `elapsed`, at most one
    // per interval begun (a poll per subscriber would be 50 at once).
    let heads = served.registry.counters().path(path);
    let intervals = elapsed.as_secs() + 1;
    assert!(
        (2..=intervals + 1).contains(&heads),
        "{heads} HEADs of {path} in {elapsed:?} for {SUBSCRIBERS} subscribers"
    );
    assert_eq!(served.registry.counters().pulls(), 0);
    assert_eq!(
        served.registry.counters().requests(),
        heads,
        "nothing else was read"
    );

    // Each connection's `used`, read back over its own socket.
    let mut charged = 0;
    for socket in &mut sockets {
        let answer = query_typename(socket, "used").await;
        assert_eq!(answer["data"], json!({ "__typename": "Query" }), "{answer}");
        charged += answer["extensions"]["fanout"]["used"]
            .as_u64()
            .unwrap_or_else(|| panic!("extensions.fanout.used: {answer}"));
    }
    assert_eq!(
        charged, heads,
        "the reads charged across the connections are the requests the registry received"
    );
}

#[tokio::test]
async fn the_internal_token_in_connection_init_gets_the_internal_burst_a_forged_one_the_public() {
    let served = start().await;
    for (payload, limit) in [
        (json!({ "x-internal-token": TOKEN }), 1000),
        (json!({ "x-internal-token": "forged" }), 100),
        (json!({}), 100),
    ] {
        let mut socket = connect(&served, payload.clone()).await;
        subscribe(&mut socket, "1", "acme/app", "t03").await;
        let event = next_event(&mut socket, "1").await;
        let fanout = &event["extensions"]["fanout"];
        assert_eq!(fanout["limit"], limit, "{payload}: {event}");
        let answer = query_typename(&mut socket, "q").await;
        assert_eq!(
            answer["extensions"]["fanout"]["limit"], limit,
            "{payload}: a query over the socket: {answer}"
        );
    }
}
