//! A schema that declares its costs with the IBM GraphQL Cost Directives
//! (`@cost`, `@listSize`) is priced from them over HTTP: the SDL shows them
//! and their definitions, `requireOneSlicingArgument` refuses a query
//! before any read, and a wrong directive stops the integration's build.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
use fanout_budget::cost::directives::{cost, list_size};
use fanout_budget::cost::{check_schema, CostTable, FieldCost};
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read};
use fanout_testkit::MemTransport;
use serde_json::{json, Value};
use std::sync::Arc;

struct Item(i32);

#[Object]
impl Item {
    async fn id(&self) -> i32 {
        self.0
    }
    /// One read per item.
    #[graphql(directive = cost::apply("1".to_string()))]
    async fn detail(&self, ctx: &Context<'_>) -> Option<String> {
        let read = async {
            let url = format!("http://up.test/item/{}", self.0).parse()?;
            ctx.upstream()?.read(Read::get(url)).await?;
            Ok::<_, async_graphql::Error>("ok".to_string())
        };
        read.await.or_null(ctx)
    }
}

#[derive(SimpleObject)]
struct ItemConnection {
    nodes: Vec<Item>,
    total: i32,
}

fn strings(s: &[&str]) -> Option<Vec<String>> {
    Some(s.iter().map(|s| s.to_string()).collect())
}

struct Query;

#[Object]
impl Query {
    /// A page of `first` (or `last`) items: exactly one of them.
    #[graphql(directive = list_size::apply(None, strings(&["first", "last"]), strings(&["nodes"]), None))]
    async fn items(
        &self,
        #[graphql(default = 10)] first: Option<i32>,
        last: Option<i32>,
    ) -> ItemConnection {
        let n = first.or(last).unwrap_or(0);
        ItemConnection {
            nodes: (0..n).map(Item).collect(),
            total: n,
        }
    }
}

type ItemSchema = Schema<Query, EmptyMutation, EmptySubscription>;

fn app(costs: CostTable) -> axum::Router {
    let mut config = Config::default();
    config.budget.max_reads = 1_000;
    let engine = Engine::builder(config)
        .transport(Arc::new(MemTransport::new()))
        .costs(costs)
        .build();
    let schema: ItemSchema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

async fn post(app: &axum::Router, query: &str) -> Value {
    let body = json!({ "query": query }).to_string();
    fanout_testkit::post(app, body, &[]).await.json()
}

#[tokio::test]
async fn the_directives_price_and_bound_the_reads() {
    let app = app(CostTable::new());
    let answer = post(&app, "{ items(first: 3) { total nodes { detail } } }").await;
    let fanout = &answer["extensions"]["fanout"];
    assert_eq!(fanout["requested"], json!(3), "{answer}");
    assert_eq!(fanout["operationReads"], json!(3), "{answer}");
    assert_eq!(answer["data"]["items"]["nodes"][2]["detail"], json!("ok"));
    // `first`'s default counts as given.
    let answer = post(&app, "{ items { nodes { detail } } }").await;
    assert_eq!(
        answer["extensions"]["fanout"]["requested"],
        json!(10),
        "{answer}"
    );
    let answer = post(&app, "{ items(first: null, last: 4) { nodes { detail } } }").await;
    assert_eq!(
        answer["extensions"]["fanout"]["requested"],
        json!(4),
        "{answer}"
    );
}

#[tokio::test]
async fn require_one_slicing_argument_refuses_before_any_read() {
    let app = app(CostTable::new());
    for query in [
        "{ items(first: 2, last: 2) { nodes { detail } } }",
        "{ items(first: null) { nodes { detail } } }",
    ] {
        let answer = post(&app, query).await;
        let error = &answer["errors"][0];
        assert_eq!(
            error["extensions"]["code"],
            json!("GRAPHQL_VALIDATION_FAILED"),
            "{answer}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(
            message
                .contains("`Query.items` takes exactly one of its slicing arguments (first, last)"),
            "{message}"
        );
        assert_eq!(answer["data"], Value::Null, "{answer}");
        assert_eq!(answer["extensions"]["fanout"]["used"], json!(0), "{answer}");
    }
}

#[tokio::test]
async fn a_table_entry_wins_over_the_directives() {
    let table = CostTable::new().field("Item", "detail", FieldCost::reads(5));
    let answer = post(&app(table), "{ items(first: 3) { nodes { detail } } }").await;
    assert_eq!(
        answer["extensions"]["fanout"]["requested"],
        json!(15),
        "{answer}"
    );
}

#[test]
fn the_sdl_shows_the_directives_and_their_definitions() {
    let sdl = Schema::new(Query, EmptyMutation, EmptySubscription).sdl();
    for expected in [
        r#"directive @cost(weight: String!) on FIELD_DEFINITION"#,
        r#"directive @listSize(assumedSize: Int, slicingArguments: [String!], sizedFields: [String!], requireOneSlicingArgument: Boolean = true) on FIELD_DEFINITION"#,
        r#"items(first: Int = 10, last: Int): ItemConnection! @listSize(slicingArguments: ["first", "last"], sizedFields: ["nodes"])"#,
        r#"detail: String @cost(weight: "1")"#,
    ] {
        assert!(sdl.contains(expected), "{expected}\nnot in\n{sdl}");
    }
    check_schema(&sdl).unwrap();
}

struct Wrong;

#[Object]
impl Wrong {
    #[graphql(directive = list_size::apply(Some(5), strings(&["frist"]), strings(&["edges"]), None))]
    async fn items(&self, first: Option<i32>) -> ItemConnection {
        let _ = first;
        ItemConnection {
            nodes: Vec::new(),
            total: 0,
        }
    }
}

fn wrong() -> Schema<Wrong, EmptyMutation, EmptySubscription> {
    Schema::new(Wrong, EmptyMutation, EmptySubscription)
}

#[test]
fn a_wrong_directive_is_named_at_build() {
    let error = check_schema(&wrong().sdl()).unwrap_err();
    assert_eq!(
        error.problems,
        vec![
            r#"@listSize(sizedFields: ["edges"]) on Wrong.items: `ItemConnection` has no field `edges`"#,
            r#"@listSize(slicingArguments: ["frist"]) on Wrong.items: `items` has no argument `frist`"#,
        ]
    );
}

#[test]
#[should_panic(expected = "`items` has no argument `frist`")]
fn the_integration_refuses_a_wrong_directive() {
    let engine = Engine::builder(Config::default())
        .costs(CostTable::new())
        .build();
    let _ = FanoutGraphQL::new(wrong(), engine);
}
