//! The smallest integration: an async-graphql schema on axum whose resolvers
//! read an upstream HTTP API through fanout-budget.
//!
//! Run: `cargo run --example minimal -- http://127.0.0.1:5000` (any JSON API),
//! then `curl -s localhost:3000/graphql -H 'content-type: application/json'
//! -d '[{"query":"{ get(path: \"/v2/\") }"},{"query":"{ get(path: \"/v2/\") }"}]'`
//! — two operations, one budget, one read.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read};

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

#[tokio::main]
async fn main() {
    let upstream = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:5000".into());
    let config = Config::default();
    let engine = Engine::new(config.clone()); // one per process
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine)) // counts each answer as it is built
        .data(Upstream(upstream.parse().expect("an upstream URL")))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://127.0.0.1:3000/graphql (upstream {upstream})");
    // axum::serve works too; this one also bounds slow and idle clients.
    fanout_budget::inbound::serve(listener, app, &config)
        .await
        .unwrap();
}
