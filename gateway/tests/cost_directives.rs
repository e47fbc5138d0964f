//! The gateway's costs are written in its schema (`@cost`, `@listSize`,
//! `@fanoutShared`, `@fanoutProvides`): priced from them alone, every
//! query costs what the Rust-side table it replaced priced.
mod common;

use async_graphql::{Request, Variables};
use common::*;
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::{Config, Engine, FanoutExtension};
use fanout_gateway::schema::{self, RegistrySchema};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The table the gateway declared its costs with before its schema did.
fn table() -> CostTable {
    const TAG_LIST: &str = "tag list";
    CostTable::new()
        .field(
            "Query",
            "repository",
            FieldCost::reads(1).provides(TAG_LIST),
        )
        .field(
            "Query",
            "repositories",
            FieldCost::reads(1).times_arg("first"),
        )
        .field(
            "Repository",
            "tags",
            FieldCost::reads(1).shared(TAG_LIST).times_arg("first"),
        )
        .field("Repository", "tag", FieldCost::reads(1).shared(TAG_LIST))
        .field("Tag", "manifest", FieldCost::reads(1))
        .field("Manifest", "config", FieldCost::reads(1))
}

/// The gateway's schema under an engine pricing with `costs` (no registry:
/// nothing is read, `requested` is computed before anything runs).
fn schema_with(costs: CostTable) -> RegistrySchema {
    let engine = Engine::builder(Config::default()).costs(costs).build();
    schema::builder()
        .extension(FanoutExtension::new(&engine))
        .finish()
}

async fn requested(schema: &RegistrySchema, query: &str, variables: &Value) -> Value {
    let request = Request::new(query).variables(Variables::from_json(variables.clone()));
    let response = serde_json::to_value(schema.execute(request).await).unwrap();
    response["extensions"]["fanout"]["requested"].clone()
}

#[tokio::test]
async fn the_directives_price_the_corpus_as_the_table_did() {
    let (directives, table) = (schema_with(schema::costs()), schema_with(table()));
    for (query, variables, expected) in cost_cases() {
        assert_eq!(
            requested(&directives, query, &variables).await,
            json!(expected),
            "{query}"
        );
        assert_eq!(
            requested(&table, query, &variables).await,
            json!(expected),
            "{query}"
        );
    }
}

#[tokio::test]
async fn the_schema_lists_the_directives() {
    let schema = schema_with(schema::costs());
    let query = "{ __schema { directives { name args { name defaultValue } } } }";
    let response = serde_json::to_value(schema.execute(query).await).unwrap();
    let directives = response["data"]["__schema"]["directives"]
        .as_array()
        .unwrap();
    let args = |name: &str| -> Vec<Value> {
        let directive = directives.iter().find(|d| d["name"] == name);
        let directive = directive.unwrap_or_else(|| panic!("no @{name} in {response}"));
        directive["args"].as_array().unwrap().clone()
    };
    assert_eq!(
        args("cost"),
        vec![json!({"name": "weight", "defaultValue": null})]
    );
    let list_size: Vec<_> = args("listSize").iter().map(|a| a["name"].clone()).collect();
    assert_eq!(
        list_size,
        vec![
            json!("assumedSize"),
            json!("slicingArguments"),
            json!("sizedFields"),
            json!("requireOneSlicingArgument")
        ]
    );
    assert_eq!(args("listSize")[3]["defaultValue"], json!("true"));
    assert_eq!(args("fanoutShared")[0]["name"], json!("read"));
    assert_eq!(args("fanoutProvides")[0]["name"], json!("read"));
    fanout_budget::cost::check_schema(&schema.sdl()).unwrap();
}

fn tags_sel() -> impl Strategy<Value = String> {
    let manifest = prop::sample::select(vec![
        "name",
        "manifest { digest }",
        "manifest { config { os } layers { size } }",
    ]);
    (1..5i32, manifest, 0..4usize).prop_map(|(n, manifest, shape)| match shape {
        0 => format!("tags(first: {n}) {{ totalCount nodes {{ {manifest} }} }}"),
        1 => format!("tags {{ pageInfo {{ hasNextPage }} nodes {{ {manifest} }} }}"),
        2 => format!("tags(first: $n) {{ ... on TagConnection {{ nodes {{ {manifest} }} }} }}"),
        _ => format!("tags(first: {n}) {{ ...Page }}"),
    })
}

fn repo_sel() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("name".to_string()),
            tags_sel(),
            Just(r#"tag(name: "v1") { manifest { config { os } } }"#.to_string()),
        ],
        1..3,
    )
    .prop_map(|fields| {
        let fields: Vec<_> = fields
            .iter()
            .enumerate()
            .map(|(i, f)| format!("r{i}: {f}"))
            .collect();
        fields.join(" ")
    })
}

fn query() -> impl Strategy<Value = String> {
    (repo_sel(), repo_sel(), 0..3usize).prop_map(|(a, b, root)| {
        let root = match root {
            0 => format!(r#"repository(name: "acme/app") {{ {a} }} list: repositories(first: 2) {{ nodes {{ {b} }} }}"#),
            1 => format!("repositories(first: $n) {{ pageInfo {{ endCursor }} nodes {{ {a} }} }}"),
            _ => format!(r#"repository(name: "x/y") {{ {b} }}"#),
        };
        // A fragment or a variable is declared only where used (else invalid).
        let page = "fragment Page on TagConnection { nodes { manifest { digest } } }";
        let page = if root.contains("...Page") { page } else { "" };
        let n = if root.contains("$n") { "($n: Int! = 3)" } else { "" };
        format!("query{n} {{ {root} }} {page}")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_queries_price_as_the_table_did(query in query(), n in prop::option::of(1..6i32)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let variables = n.map_or(json!({}), |n| json!({ "n": n }));
        runtime.block_on(async {
            let (directives, table) = (schema_with(schema::costs()), schema_with(table()));
            let by_table = requested(&table, &query, &variables).await;
            assert!(by_table.as_u64().is_some_and(|n| n > 0), "{query}: {by_table}");
            assert_eq!(requested(&directives, &query, &variables).await, by_table, "{query}");
        });
    }
}
