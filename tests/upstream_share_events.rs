//! An upstream's share (`[upstreams."NAME"] max_reads`) over a WebSocket:
//! each event of a subscription is a request scope of its own, so the share
//! applies per event — a real WebSocket client over loopback, through
//! `fanout_budget::inbound::serve`.
use async_graphql::{Context, EmptyMutation, Object, Schema, Subscription};
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read};
use fanout_testkit::ws::{init, subscribe, until_complete};
use fanout_testkit::Upstream;
use futures::Stream;
use serde_json::{json, Value};
use std::future::IntoFuture;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The capped registry's base URL.
struct Base(String);

struct Row {
    id: u64,
}

#[Object]
impl Row {
    /// One read of `/item/{id}`.
    async fn value(&self, ctx: &Context<'_>) -> Option<String> {
        let read = async {
            let url = format!("{}/item/{}", ctx.data::<Base>()?.0, self.id).parse()?;
            let response = ctx.upstream()?.read(Read::get(url)).await?;
            let body: Value = response.json()?;
            Ok(body["value"].as_str().unwrap_or_default().to_string())
        };
        let value: async_graphql::Result<String> = read.await;
        value.or_null(ctx)
    }
}

struct Query;

#[Object]
impl Query {
    async fn ok(&self) -> bool {
        true
    }
}

struct Sub;

#[Subscription]
impl Sub {
    /// `events` events of `per` rows each, every row an item of its own.
    async fn pages(&self, events: u64, per: u64) -> impl Stream<Item = Vec<Row>> {
        let pages = (0..events).map(move |e| (e * per..(e + 1) * per).map(|id| Row { id }));
        futures::stream::iter(pages.map(Iterator::collect))
    }
}

#[tokio::test]
async fn each_event_has_the_share_of_its_own() {
    let upstream = Upstream::start().await;
    let text = format!(
        "[http]\nmax_connections_per_client = 100\n\
         [upstreams.capped]\nurl = \"{}\"\nmax_reads = 3\n",
        upstream.base()
    );
    let config = Config::from_toml(&text).unwrap();
    let engine = Engine::new(config.clone());
    let schema = Schema::build(Query, EmptyMutation, Sub)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.base()))
        .finish();
    let router = axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let task = tokio::spawn(async move {
        let _ = serving.await;
    });
    let mut ask = format!("ws://{address}/graphql")
        .into_client_request()
        .unwrap();
    let protocol = "graphql-transport-ws".parse().unwrap();
    ask.headers_mut().insert("sec-websocket-protocol", protocol);
    let mut socket = tokio_tungstenite::connect_async(ask).await.unwrap().0;
    init(&mut socket, json!({})).await;
    subscribe(
        &mut socket,
        "1",
        "subscription { pages(events: 3, per: 5) { value } }",
    )
    .await;
    let events = until_complete(&mut socket, "1").await;
    assert_eq!(events.len(), 3, "{events:?}");
    for event in &events {
        let payload = &event["payload"];
        let rows = payload["data"]["pages"].as_array().expect("rows");
        let answered = rows.iter().filter(|r| r["value"].is_string()).count();
        assert_eq!(answered, 3, "each event, its own share: {payload}");
        let errors = payload["errors"].as_array().expect("the refusals");
        assert_eq!(errors.len(), 2, "{payload}");
        for error in errors {
            let ext = &error["extensions"];
            assert_eq!(ext["code"], "FANOUT_BUDGET_EXHAUSTED", "{error}");
            assert_eq!(
                (&ext["upstream"], &ext["limit"]),
                (&json!("capped"), &json!(3))
            );
        }
        assert_eq!(payload["extensions"]["fanout"]["operationReads"], 3);
    }
    assert_eq!(upstream.requests(), 9);
    task.abort();
}
