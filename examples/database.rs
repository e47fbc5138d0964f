//! A resolver that queries something that is not HTTP — here an in-memory
//! "database" with a latency, standing in for a SQL pool — under the same
//! bounds as a read: `Upstream::permit` charges one read and holds a request
//! slot and a `[hosts]` slot for `db:5432` while the query runs, and
//! `Permit::timeout` cuts it at `min(read_timeout, time left)`.
//!
//! Run: `cargo run --example database`, then POST
//! `{"query":"{ a: row(id: 1) b: row(id: 2) }"}` to localhost:3000/graphql.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The "database": rows by id, each query taking `latency`; it counts the
/// queries it ran and the most it ran at once.
#[derive(Default)]
pub struct Database {
    pub latency: Duration,
    pub queries: AtomicU64,
    pub running: AtomicU64,
    pub peak: AtomicU64,
}

impl Database {
    async fn row(&self, id: u64) -> String {
        self.queries.fetch_add(1, SeqCst);
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        tokio::time::sleep(self.latency).await;
        self.running.fetch_sub(1, SeqCst);
        format!("row-{id}")
    }
}

/// The host name the database's `[hosts]` table uses.
pub const DB: &str = "db:5432";

pub struct Query;

#[Object]
impl Query {
    /// Row `id`, or `null` and a coded error (budget, cap, timeout).
    async fn row(&self, ctx: &Context<'_>, id: u64) -> Option<String> {
        let query = async {
            let db = ctx.data::<Arc<Database>>()?;
            let upstream = ctx.upstream()?;
            let permit = upstream.permit(DB).await?;
            Ok::<_, async_graphql::Error>(permit.timeout(db.row(id)).await?)
        };
        query.await.or_null(ctx)
    }
}

pub fn app(engine: Engine, db: Arc<Database>) -> Router {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(db)
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

#[allow(dead_code)] // the tests use `app`
#[tokio::main]
async fn main() {
    let mut config = Config::default();
    config.hosts.insert(
        DB.to_string(),
        fanout_budget::config::HostConfig::default()
            .max_concurrent(4)
            .acquire_wait_ms(200),
    );
    let db = Arc::new(Database {
        latency: Duration::from_millis(20),
        ..Database::default()
    });
    let app = app(Engine::new(config.clone()), db);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://127.0.0.1:3000/graphql");
    fanout_budget::inbound::serve(listener, app, &config)
        .await
        .unwrap();
}
