//! The compiled estimate against the walk: equal on generated documents and
//! variables, and never reused for a document, operation or schema it was
//! not compiled for.

use super::check::SlicingCheck;
use super::formula::compile;
use super::kept::estimate_kept;
use super::{estimate, require_one_slicing_argument, CostTable, FieldCost};
use crate::cost::schema_types::SchemaTypes;
use crate::document::memo::Kept;
use async_graphql::parser::parse_query;
use async_graphql::Variables;
use proptest::prelude::*;
use serde_json::{json, Value as Json};
use std::sync::Arc;

const SDL: &str = r#"
type Query {
  users(first: Int, last: Int): [User!]! @listSize(slicingArguments: ["first", "last"])
  pages(first: Int = 10): [User!]! @listSize(slicingArguments: ["first"], assumedSize: 3)
  filtered(filter: Filter): [User!]! @cost(weight: "1") @listSize(slicingArguments: ["filter.max"], assumedSize: 7, requireOneSlicingArgument: false)
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
  friends(first: Int, last: Int): [User!]! @cost(weight: "1") @listSize(slicingArguments: ["first", "last"], requireOneSlicingArgument: false)
  posts(limit: Int = 3, ids: [Int]): [User!]!
  tagged(ids: [Int]): [User!]!
}
"#;

fn types() -> SchemaTypes {
    let types = SchemaTypes::read_sdl(SDL);
    assert_eq!(types.problems, Vec::<String>::new());
    types
}

/// The table's multipliers beside the directives': by an argument's value,
/// by a list's length, fixed.
fn table() -> CostTable {
    CostTable::new()
        .field("User", "posts", FieldCost::reads(2).times_arg("limit"))
        .field("User", "tagged", FieldCost::reads(1).times_len("ids"))
        .field("Query", "everyone", FieldCost::reads(1).times(4))
}

/// A document built from bytes: each choice reads one.
struct Gen<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Gen<'_> {
    fn pick(&mut self, n: u8) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b % n
    }

    fn value(&mut self) -> String {
        match self.pick(11) {
            0..=3 => format!("$v{}", self.pick(4)),
            4 => "0".into(),
            5 => "7".into(),
            6 => "-3".into(),
            7 => "18446744073709551615".into(),
            8 => "null".into(),
            9 => "[1, $v1, 3]".into(),
            _ => "\"x\"".into(),
        }
    }

    fn args(&mut self, names: &[&str]) -> String {
        let mut given = Vec::new();
        for name in names {
            if self.pick(2) != 0 {
                continue;
            }
            given.push(if *name == "filter" {
                match self.pick(3) {
                    0 => format!("filter: {{max: {}}}", self.value()),
                    1 => "filter: {name: \"n\"}".into(),
                    _ => format!("filter: {}", self.value()),
                }
            } else {
                format!("{name}: {}", self.value())
            });
        }
        if given.is_empty() {
            String::new()
        } else {
            format!("({})", given.join(", "))
        }
    }

    fn user(&mut self, depth: u8, spreads: &[&str]) -> String {
        let n = 1 + self.pick(4);
        let mut out = Vec::new();
        for _ in 0..n {
            let item = match self.pick(if depth < 3 { 11 } else { 4 }) {
                0 => "name".into(),
                1 => "avatar".into(),
                2 => "bio".into(),
                3 => "email".into(),
                4 => format!(
                    "friends{} {{ {} }}",
                    self.args(&["first", "last"]),
                    self.user(depth + 1, spreads)
                ),
                5 => format!(
                    "posts{} {{ {} }}",
                    self.args(&["limit", "ids"]),
                    self.user(depth + 1, spreads)
                ),
                6 => format!(
                    "tagged{} {{ {} }}",
                    self.args(&["ids"]),
                    self.user(depth + 1, spreads)
                ),
                7 => format!("... on User {{ {} }}", self.user(depth + 1, spreads)),
                8 => format!(
                    "... @include(if: $v{}) {{ {} }}",
                    self.pick(4),
                    self.user(depth + 1, spreads)
                ),
                _ if spreads.is_empty() => "name".into(),
                _ => format!("...{}", spreads[self.pick(spreads.len() as u8) as usize]),
            };
            out.push(item);
        }
        out.join(" ")
    }

    fn query(&mut self, spreads: &[&str]) -> String {
        let n = 1 + self.pick(3);
        let mut out = Vec::new();
        for _ in 0..n {
            let user = self.user(1, spreads);
            let item = match self.pick(6) {
                0 => format!("users{} {{ {user} }}", self.args(&["first", "last"])),
                1 => format!("pages{} {{ {user} }}", self.args(&["first"])),
                2 => format!("filtered{} {{ {user} }}", self.args(&["filter"])),
                3 => format!(
                    "repos{} {{ totalCount edges {{ node {{ {user} }} }} nodes {{ {user} }} }}",
                    self.args(&["first"])
                ),
                4 => format!("everyone {{ {user} }}"),
                _ => format!("user(name: \"a\") {{ {user} }}"),
            };
            out.push(item);
        }
        out.join(" ")
    }

    fn definitions(&mut self) -> String {
        let defs: Vec<String> = (0..4)
            .filter_map(|i| match self.pick(5) {
                0 => None,
                1 => Some(format!("$v{i}: Int")),
                // Set to null, it fails coercion: nothing is checked.
                4 => Some(format!("$v{i}: Int!")),
                2 => Some(format!(
                    "$v{i}: Int = {}",
                    [4, 0, 11][self.pick(3) as usize]
                )),
                _ => Some(format!("$v{i}: [Int] = [1, 2]")),
            })
            .collect();
        if defs.is_empty() {
            String::new()
        } else {
            format!("({})", defs.join(", "))
        }
    }

    /// Two named operations, two fragments (the second may spread the first).
    fn document(&mut self) -> String {
        let f0 = self.user(2, &[]);
        let f1 = self.user(2, &["F0"]);
        let (da, a) = (self.definitions(), self.query(&["F0", "F1"]));
        let (db, b) = (self.definitions(), self.query(&["F1"]));
        format!(
            "query A{da} {{ {a} }} query B{db} {{ {b} }} \
             fragment F0 on User {{ {f0} }} fragment F1 on User {{ {f1} }}"
        )
    }
}

fn variable() -> impl Strategy<Value = Option<Json>> {
    prop_oneof![
        Just(None),
        Just(Some(Json::Null)),
        (0u64..20).prop_map(|n| Some(json!(n))),
        Just(Some(json!(-4))),
        Just(Some(json!(u64::MAX))),
        Just(Some(json!(1e30))),
        Just(Some(json!([1, 2, 3]))),
        Just(Some(json!("s"))),
        Just(Some(json!(true))),
        Just(Some(json!({"max": 6}))),
    ]
}

fn variables() -> impl Strategy<Value = Variables> {
    proptest::collection::vec(variable(), 4).prop_map(|values| {
        let mut object = serde_json::Map::new();
        for (i, value) in values.into_iter().enumerate() {
            if let Some(value) = value {
                object.insert(format!("v{i}"), value);
            }
        }
        Variables::from_json(Json::Object(object))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// One formula, compiled once, prices every request as the walk does;
    /// one slicing check, compiled once, answers as its walk does.
    #[test]
    fn the_formula_prices_as_the_walk_does(
        bytes in proptest::collection::vec(any::<u8>(), 0..160),
        name in prop_oneof![Just(Some("A")), Just(Some("B")), Just(None), Just(Some("C"))],
        requests in proptest::collection::vec(variables(), 1..6),
    ) {
        let text = Gen { bytes: &bytes, at: 0 }.document();
        let doc = parse_query(&text).unwrap();
        let shape = crate::document::guard::check(&doc, 1_000_000).unwrap();
        let (costs, types) = (table(), types());
        let compiled = compile(&costs, &types, &doc, &shape, name, usize::MAX).unwrap();
        let check = SlicingCheck::compile(Some(&costs), &types, &doc, name);
        for variables in &requests {
            let walked = estimate(&costs, &types, &doc, &shape, variables, name);
            let priced = compiled.price(&costs, &types, &doc, variables, name);
            prop_assert_eq!(priced, walked, "{} {:?}", text, variables);
            let walked = require_one_slicing_argument(Some(&costs), &types, &doc, variables, name);
            let kept = check.check(Some(&costs), &types, &doc, variables, name);
            prop_assert_eq!(kept, walked, "{} {:?}", text, variables);
        }
    }
}

/// Two operations alike where a formula finds its leaves, unlike in price.
const DOC: &str = "query A($n: Int) { users(first: $n) { avatar } } \
                   query B($n: Int) { users(first: $n) { avatar bio email } } \
                   query C { users(first: 3) { avatar } }";

fn kept(text: &str) -> Arc<Kept> {
    Arc::new(Kept::new(text.into(), parse_query(text).unwrap()))
}

fn vars(v: Json) -> Variables {
    Variables::from_json(v)
}

/// Prices `kept` through its memo, and checks the walk agrees.
fn price(kept: &Kept, costs: &CostTable, types: &SchemaTypes, v: Json, name: Option<&str>) -> u64 {
    let shape = crate::document::guard::check(&kept.doc, 100_000).unwrap();
    let v = vars(v);
    let priced = estimate_kept(kept, costs, types, &shape, &v, name);
    assert_eq!(priced, estimate(costs, types, &kept.doc, &shape, &v, name));
    priced
}

#[test]
fn the_same_text_is_priced_from_each_requests_variables() {
    let (costs, types) = (CostTable::new(), types());
    let kept = kept(DOC);
    assert_eq!(price(&kept, &costs, &types, json!({"n": 2}), Some("A")), 2);
    assert!(kept.has_cost());
    assert_eq!(
        price(&kept, &costs, &types, json!({"n": 40}), Some("A")),
        40
    );
    assert_eq!(price(&kept, &costs, &types, json!({}), Some("A")), 0);
    assert_eq!(
        price(&kept, &costs, &types, json!({"n": null}), Some("A")),
        0
    );
}

#[test]
fn a_variable_the_document_does_not_define_still_prices() {
    let (costs, types) = (CostTable::new(), types());
    let kept = kept("{ users(first: $undefined) { avatar } }");
    assert_eq!(
        price(&kept, &costs, &types, json!({"undefined": 5}), None),
        5
    );
    assert_eq!(
        price(&kept, &costs, &types, json!({"undefined": 9}), None),
        9
    );
}

#[test]
fn another_operation_name_is_not_priced_from_the_formula_kept() {
    let (costs, types) = (CostTable::new(), types());
    let kept = kept(DOC);
    assert_eq!(price(&kept, &costs, &types, json!({"n": 8}), Some("A")), 8);
    assert_eq!(price(&kept, &costs, &types, json!({"n": 8}), Some("B")), 16);
    assert_eq!(price(&kept, &costs, &types, json!({"n": 8}), Some("C")), 3);
    assert_eq!(price(&kept, &costs, &types, json!({"n": 8}), None), 0);
    assert_eq!(price(&kept, &costs, &types, json!({"n": 8}), Some("Z")), 0);
}

#[test]
fn another_schema_or_table_is_not_priced_from_the_formula_kept() {
    let types = types();
    let kept = kept("{ friends: users(first: 2) { avatar } }");
    assert_eq!(price(&kept, &CostTable::new(), &types, json!({}), None), 2);
    let table = CostTable::new().field("User", "avatar", FieldCost::reads(5));
    assert_eq!(price(&kept, &table, &types, json!({}), None), 10);
    let other = SchemaTypes::read_sdl(&SDL.replace(
        r#"avatar: String @cost(weight: "1")"#,
        r#"avatar: String @cost(weight: "7")"#,
    ));
    assert_eq!(price(&kept, &CostTable::new(), &other, json!({}), None), 14);
}
