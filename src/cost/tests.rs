//! The cost directives priced from SDL: the specification's examples, each
//! an exact figure, and `requireOneSlicingArgument` both ways.

use super::check::SlicingCheck;
use super::{check_schema, estimate, require_one_slicing_argument, CostTable, FieldCost};
use crate::cost::schema_types::SchemaTypes;
use crate::error::OperationError;
use async_graphql::Variables;
use serde_json::json;

const SDL: &str = r#"
type Query {
  users(first: Int, last: Int): [User!]! @listSize(slicingArguments: ["first", "last"], requireOneSlicingArgument: false)
  pages(first: Int = 10): [User!]! @listSize(slicingArguments: ["first"], assumedSize: 3)
  exactlyOne(first: Int, last: Int): [User!]! @listSize(slicingArguments: ["first", "last"])
  filtered(filter: Filter): [User!]! @cost(weight: "1") @listSize(slicingArguments: ["filter.max"], assumedSize: 7, requireOneSlicingArgument: false)
  byDefault(filter: Filter = {max: 4}): [User!]! @listSize(slicingArguments: ["filter.max"])
  repos(first: Int! = 20): RepoConnection! @cost(weight: "1") @listSize(slicingArguments: ["first"], sizedFields: ["edges", "nodes"])
  everyone: [User!]! @listSize(assumedSize: 50)
  user(name: String!): User @cost(weight: "1") @fanoutProvides(read: "profile")
}
input Filter { max: Int = 9 name: String }
type RepoConnection { edges: [RepoEdge!]! nodes: [User!]! totalCount: Int! @cost(weight: "2") }
type RepoEdge { node: User! }
type User {
  name: String!
  avatar: String @cost(weight: "1")
  bio: String @cost(weight: "1") @fanoutShared(read: "profile")
  email: String @cost(weight: "1") @fanoutShared(read: "profile")
}
"#;

fn types() -> SchemaTypes {
    let types = SchemaTypes::read_sdl(SDL);
    assert_eq!(types.problems, Vec::<String>::new());
    types
}

fn price_with(costs: &CostTable, query: &str, variables: serde_json::Value) -> u64 {
    let types = types();
    let doc = async_graphql::parser::parse_query(query).unwrap();
    let shape = crate::document::guard::check(&doc, 100_000).unwrap();
    let variables = Variables::from_json(variables);
    estimate(costs, &types, &doc, &shape, &variables, None)
}

fn price(query: &str, variables: serde_json::Value) -> u64 {
    price_with(&CostTable::new(), query, variables)
}

/// The walk's verdict, which the check compiled for the document gives too.
fn require_one(query: &str, variables: serde_json::Value) -> Result<(), OperationError> {
    let types = types();
    let doc = async_graphql::parser::parse_query(query).unwrap();
    let variables = Variables::from_json(variables);
    let walked = require_one_slicing_argument(None, &types, &doc, &variables, None);
    let compiled = SlicingCheck::compile(None, &types, &doc, None);
    assert_eq!(compiled.check(None, &types, &doc, &variables, None), walked);
    walked
}

#[test]
fn a_slicing_argument_sizes_the_list() {
    assert_eq!(price("{ users(first: 5) { avatar } }", json!({})), 5);
    assert_eq!(price("{ users(last: 8) { avatar } }", json!({})), 8);
    // Both given (allowed here): the larger.
    assert_eq!(
        price("{ users(first: 5, last: 8) { avatar } }", json!({})),
        8
    );
    // A variable, and a variable's default.
    let query = "query($n: Int = 6) { users(first: $n) { avatar } }";
    assert_eq!(price(query, json!({"n": 11})), 11);
    assert_eq!(price(query, json!({})), 6);
    // None given, no assumed size: 0.
    assert_eq!(price("{ users { avatar } }", json!({})), 0);
}

#[test]
fn a_default_counts_as_given_unless_set_to_null() {
    assert_eq!(price("{ pages { avatar } }", json!({})), 10);
    assert_eq!(price("{ pages(first: 2) { avatar } }", json!({})), 2);
    // Null: not given, so the assumed size.
    assert_eq!(price("{ pages(first: null) { avatar } }", json!({})), 3);
    let query = "query($n: Int) { pages(first: $n) { avatar } }";
    assert_eq!(price(query, json!({"n": null})), 3);
    // A variable without a value leaves the argument out: its default.
    assert_eq!(price(query, json!({})), 10);
    assert!(require_one("{ pages { avatar } }", json!({})).is_ok());
    let refused = require_one("{ pages(first: null) { avatar } }", json!({}));
    assert!(matches!(
        refused,
        Err(OperationError::ValidationFailed { .. })
    ));
}

#[test]
fn a_nested_path_reads_an_input_objects_field() {
    // The field's own read, then 5 avatars.
    let query = "{ filtered(filter: {max: 5}) { avatar } }";
    assert_eq!(price(query, json!({})), 1 + 5);
    let query = "query($f: Filter) { filtered(filter: $f) { avatar } }";
    assert_eq!(price(query, json!({"f": {"max": 12}})), 1 + 12);
    // The input field's default.
    assert_eq!(price(query, json!({"f": {"name": "x"}})), 1 + 9);
    // Set to null, or no filter at all: the assumed size.
    assert_eq!(price(query, json!({"f": {"max": null}})), 1 + 7);
    assert_eq!(price("{ filtered { avatar } }", json!({})), 1 + 7);
    // The argument's default object.
    assert_eq!(price("{ byDefault { avatar } }", json!({})), 4);
    assert_eq!(price("{ byDefault(filter: {}) { avatar } }", json!({})), 9);
}

#[test]
fn sized_fields_size_a_connections_nodes_and_edges_only() {
    let query = "{ repos(first: 3) { totalCount nodes { avatar } edges { node { avatar bio } } } }";
    // The page, totalCount once, 3 nodes, 3 edges of 2.
    assert_eq!(price(query, json!({})), 1 + 2 + 3 + 3 * 2);
    // Through an inline fragment; and a fragment spread, multiplied whole.
    let query = "{ repos { ... on RepoConnection { nodes { avatar } } } }";
    assert_eq!(price(query, json!({})), 1 + 20);
    let query =
        "{ repos(first: 2) { ...C } } fragment C on RepoConnection { totalCount nodes { avatar } }";
    assert_eq!(price(query, json!({})), 1 + 2 * (2 + 1));
}

#[test]
fn an_assumed_size_without_slicing_arguments() {
    assert_eq!(price("{ everyone { avatar } }", json!({})), 50);
    assert!(require_one("{ everyone { avatar } }", json!({})).is_ok());
}

#[test]
fn require_one_slicing_argument_both_ways() {
    assert!(require_one("{ exactlyOne(first: 2) { name } }", json!({})).is_ok());
    assert!(require_one("{ exactlyOne(last: 2) { name } }", json!({})).is_ok());
    for query in [
        "{ exactlyOne { name } }",
        "{ exactlyOne(first: 2, last: 3) { name } }",
        "{ repos { nodes { name } } u: user(name: \"a\") { name } ...F } fragment F on Query { exactlyOne(first: null) { name } }",
    ] {
        let Err(OperationError::ValidationFailed { message, at }) = require_one(query, json!({}))
        else {
            panic!("{query} passed");
        };
        assert!(
            message.contains("`Query.exactlyOne` takes exactly one of its slicing arguments (first, last)"),
            "{message}"
        );
        assert_eq!(at.len(), 1);
    }
    // A variable set to null is not given.
    let query = "query($l: Int) { exactlyOne(first: 1, last: $l) { name } }";
    assert!(require_one(query, json!({"l": null})).is_ok());
    assert!(require_one(query, json!({"l": 4})).is_err());
    // `requireOneSlicingArgument: false`.
    assert!(require_one("{ users { name } }", json!({})).is_ok());
    assert!(require_one("{ users(first: 1, last: 2) { name } }", json!({})).is_ok());
}

#[test]
fn shared_and_provided_reads_are_made_once() {
    // `user` provides the profile: bio and email are free under it.
    assert_eq!(
        price(r#"{ user(name: "a") { bio email avatar } }"#, json!({})),
        2
    );
    // Under a list, each user reads its profile once.
    assert_eq!(price("{ users(first: 4) { bio email } }", json!({})), 4);
}

#[test]
fn the_table_wins_over_the_directives_per_field() {
    let table = CostTable::new().field("User", "avatar", FieldCost::reads(3));
    assert_eq!(
        price_with(&table, "{ users(first: 5) { avatar bio } }", json!({})),
        5 * (3 + 1)
    );
    let table = CostTable::new().field("Query", "users", FieldCost::reads(0).times(2));
    assert_eq!(
        price_with(&table, "{ users(first: 5) { avatar } }", json!({})),
        2
    );
}

fn problems(sdl: &str) -> Vec<String> {
    check_schema(sdl).unwrap_err().problems
}

#[test]
fn a_wrong_directive_is_told_at_build() {
    let field = |directives: &str| {
        format!("type Query {{ items(first: Int, filter: Filter): [Item!]! {directives} }} input Filter {{ max: Int }} type Item {{ id: Int }}")
    };
    let cases = [
        (
            r#"@cost(weight: "1.5")"#,
            r#"@cost(weight: "1.5") on Query.items: `weight` must be a whole number"#,
        ),
        (r#"@cost(weight: 2)"#, "`weight` must be a string"),
        ("@cost", "@cost on Query.items needs its `weight`"),
        (
            r#"@listSize(slicingArguments: ["frist"])"#,
            r#"@listSize(slicingArguments: ["frist"]) on Query.items: `items` has no argument `frist`"#,
        ),
        (
            r#"@listSize(slicingArguments: ["filter.mx"])"#,
            "`Filter` has no field `mx`",
        ),
        (
            r#"@listSize(sizedFields: ["nodes"])"#,
            r#"@listSize(sizedFields: ["nodes"]) on Query.items: `Item` has no field `nodes`"#,
        ),
        (
            "@listSize(assumedSize: -1)",
            "`assumedSize` must be a non-negative Int",
        ),
        (
            "@listSize(size: 3)",
            "@listSize on Query.items has no argument `size`",
        ),
    ];
    for (directives, expected) in cases {
        let problems = problems(&field(directives));
        assert_eq!(problems.len(), 1, "{directives}: {problems:?}");
        assert!(
            problems[0].contains(expected),
            "{directives}: {}",
            problems[0]
        );
    }
    assert!(check_schema(&field(
        r#"@cost(weight: "2") @listSize(slicingArguments: ["filter.max"])"#
    ))
    .is_ok());
    assert!(check_schema("type Query {").is_err());
}

#[test]
#[should_panic(expected = "cost directives: @listSize(sizedFields: [\"edges\"]) on Query.items")]
fn the_integration_is_not_built_on_a_wrong_directive() {
    SchemaTypes::from_sdl(r#"type Query { items: [Int!]! @listSize(sizedFields: ["edges"]) }"#);
}
