//! A request-scoped `DataLoader` whose loads read through the acquisition
//! point: the loader is built for each operation with the operation's handle
//! (`operation_data`), so every read it makes is de-duplicated with the rest
//! of the HTTP request, capped, timed and charged — it counts in `used` and in
//! the operation's `operationReads`.
//!
//! async-graphql's `Loader::load` gets no `Context` (async-graphql issues
//! #1002, #1417, #1567); the handle is what stands in for it. The loader
//! batches the keys the operation asks for in one tick and reads them in
//! parallel (one read per key: the upstream has no batch endpoint here).
//!
//! Run: `cargo run --example dataloader -- http://127.0.0.1:5000` (an API with
//! `/item/{id}` answering `{"value": …}`), then POST
//! `{"query":"{ items(ids: [1, 2, 2, 3]) { value } }"}` to localhost:3000/graphql.
use async_graphql::dataloader::{DataLoader, Loader};
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
use axum::Router;
use fanout_budget::{
    request::Operation, Config, Engine, FanoutExtension, FanoutGraphQL, OrNull, Read, ReadError,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Items by id, read from `base/item/{id}` through one operation's handle.
pub struct Items {
    operation: Arc<Operation>,
    base: reqwest::Url,
}

impl Loader<u64> for Items {
    type Value = String;
    type Error = ReadError;

    async fn load(&self, ids: &[u64]) -> Result<HashMap<u64, String>, ReadError> {
        let upstream = self.operation.upstream();
        let reads = ids.iter().map(|id| {
            let url = self.base.join(&format!("item/{id}")).expect("a URL");
            async move {
                let page = upstream.read(Read::get(url)).await?;
                let body: serde_json::Value = page.error_for_status()?.json()?;
                Ok::<_, ReadError>((*id, body["value"].as_str().unwrap_or_default().to_string()))
            }
        });
        futures::future::try_join_all(reads)
            .await
            .map(HashMap::from_iter)
    }
}

#[derive(SimpleObject)]
pub struct Item {
    pub id: u64,
    pub value: Option<String>,
}

pub struct Query;

#[Object]
impl Query {
    /// The items `ids`, each loaded once per operation whatever the repeats.
    async fn items(&self, ctx: &Context<'_>, ids: Vec<u64>) -> Vec<Option<Item>> {
        let loader = ctx.data_unchecked::<DataLoader<Items>>();
        let mut items = Vec::with_capacity(ids.len());
        for id in ids {
            let value = loader.load_one(id).await.or_null(ctx).flatten();
            items.push(Some(Item { id, value }));
        }
        items
    }
}

/// The app: `FanoutGraphQL` builds each operation's loader with its handle.
pub fn app(engine: Engine, base: reqwest::Url) -> Router {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let graphql = FanoutGraphQL::new(schema, engine).operation_data(move |operation, data| {
        let items = Items {
            operation: operation.clone(),
            base: base.clone(),
        };
        data.insert(DataLoader::new(items, tokio::spawn));
    });
    Router::new().route_service("/graphql", graphql)
}

#[allow(dead_code)] // the tests use `app`
#[tokio::main]
async fn main() {
    let base = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:5000/".into());
    let config = Config::default();
    let app = app(
        Engine::new(config.clone()),
        base.parse().expect("an upstream URL"),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://127.0.0.1:3000/graphql (upstream {base})");
    fanout_budget::inbound::serve(listener, app, &config)
        .await
        .unwrap();
}
