//! The stock integration: async-graphql-axum's own `GraphQL` service, the
//! extension on the schema, and `FanoutLayer` around the route — one budget,
//! one de-duplication cache and one deadline per HTTP request, a whole
//! batch included.
//!
//! Run: `cargo run --example stock_service -- http://127.0.0.1:5000` (any JSON
//! API), then `curl -s localhost:3000/graphql -H 'content-type: application/json'
//! -d '[{"query":"{ get(path: \"/v2/\") }"},{"query":"{ get(path: \"/v2/\") }"}]'`
//! — two operations, one budget, one read (`tests/stock_service.rs`).
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::graphql::FanoutSubscription;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutLayer, OrNull, Read};

struct Upstream(reqwest::Url);
struct Query;

#[Object]
impl Query {
    /// The upstream's answer at `path`, as text; null (with a coded error) if the read fails.
    async fn get(&self, ctx: &Context<'_>, path: String) -> Option<String> {
        read(ctx, &path).await.or_null(ctx)
    }
}

async fn read(ctx: &Context<'_>, path: &str) -> async_graphql::Result<String> {
    let url = ctx.data::<Upstream>()?.0.join(path)?;
    let response = ctx.upstream()?.read(Read::get(url)).await?; // the one way to the upstream
    Ok(String::from_utf8_lossy(&response.body).into_owned())
}

/// The app: the stock service, the extension on the schema, the layer around.
pub fn app(engine: Engine, upstream: reqwest::Url) -> Router {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .data(Upstream(upstream))
        .extension(FanoutExtension::new(&engine)) // counts reads, codes errors
        .finish();
    Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema.clone()))
        // Subscriptions over WebSocket: one budget per socket.
        .route_service(
            "/graphql/ws",
            FanoutSubscription::new(schema, engine.clone()),
        )
        .layer(FanoutLayer::new(engine)) // one scope per HTTP request
}

#[allow(dead_code)] // the tests use `app`
#[tokio::main]
async fn main() {
    let upstream = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:5000".into());
    let config = Config::default();
    let engine = Engine::new(config.clone()); // one per process
    let app = app(engine, upstream.parse().expect("an upstream URL"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://127.0.0.1:3000/graphql (upstream {upstream})");
    fanout_budget::inbound::serve(listener, app, &config)
        .await
        .unwrap();
}
