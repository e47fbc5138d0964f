//! A list argument prices its sub-selection once per element
//! (`FieldCost::times_len`, and `times_arg` on a list): over random lists and
//! selections, the estimate is an upper bound of the reads sent, and exact
//! when no read repeats.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use fanout_budget::{
    cost::{CostTable, FieldCost},
    Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read,
};
use fanout_testkit::MemTransport;
use proptest::prelude::*;
use std::sync::Arc;

struct Item(u64);

#[Object]
impl Item {
    async fn id(&self) -> u64 {
        self.0
    }
    /// One read per distinct item.
    async fn detail(&self, ctx: &Context<'_>) -> Option<String> {
        let read = async {
            let url = format!("http://up.test/item/{}", self.0).parse()?;
            ctx.upstream()?.read(Read::get(url)).await?;
            Ok::<_, async_graphql::Error>("ok".to_string())
        };
        read.await.or_null(ctx)
    }
}

struct Query;

#[Object]
impl Query {
    /// The items `ids`, no read of its own.
    async fn items(&self, ids: Vec<u64>) -> Vec<Item> {
        ids.into_iter().map(Item).collect()
    }
    /// The same, priced with `times_arg` (a list counts its elements).
    async fn by_arg(&self, ids: Vec<u64>) -> Vec<Item> {
        ids.into_iter().map(Item).collect()
    }
}

fn app() -> axum::Router {
    let costs = CostTable::new()
        .field("Query", "items", FieldCost::reads(0).times_len("ids"))
        .field("Query", "byArg", FieldCost::reads(0).times_arg("ids"))
        .field("Item", "detail", FieldCost::reads(1));
    let mut config = Config::default();
    config.budget.max_reads = 10_000;
    let engine = Engine::builder(config)
        .transport(Arc::new(MemTransport::new()))
        .costs(costs)
        .build();
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn the_estimate_bounds_the_reads(
        inline in proptest::collection::vec(0u64..8, 0..12),
        variable in proptest::collection::vec(0u64..8, 0..12),
        with_detail in any::<bool>(),
    ) {
        let detail = if with_detail { "detail" } else { "id" };
        let query = format!(
            "query($ids: [Int!]!) {{ a: items(ids: {inline:?}) {{ {detail} }} b: byArg(ids: $ids) {{ detail }} }}"
        );
        let body = serde_json::json!({ "query": query, "variables": { "ids": variable } });
        let answer = runtime().block_on(fanout_testkit::post(&app(), body.to_string(), &[])).json();
        prop_assert!(answer.get("errors").is_none(), "{}", answer);
        let fanout = &answer["extensions"]["fanout"];
        let (used, requested) = (fanout["used"].as_u64().unwrap(), fanout["requested"].as_u64().unwrap());
        let priced = if with_detail { inline.len() } else { 0 } + variable.len();
        prop_assert_eq!(requested, priced as u64, "{}", answer);
        prop_assert!(used <= requested, "used {} > requested {}", used, requested);
        let mut distinct: Vec<u64> = variable.clone();
        if with_detail {
            distinct.extend(&inline);
        }
        distinct.sort();
        distinct.dedup();
        prop_assert_eq!(used, distinct.len() as u64);
    }
}
