//! What a kept document keeps of the cost checks: compiled on its first
//! sight instead of walked, and never reused for variables, an operation or
//! a table it does not fit.

use super::kept::{estimate_kept, require_one_kept};
use super::{estimate, require_one_slicing_argument, CostTable, FieldCost};
use crate::cost::schema_types::SchemaTypes;
use crate::document::guard::{check, Shape};
use crate::document::memo::Kept;
use crate::error::OperationError;
use async_graphql::parser::parse_query;
use async_graphql::{Pos, Variables};
use serde_json::{json, Value as Json};

const SDL: &str = r#"
type Query {
  one(first: Int, last: Int): [User!]! @listSize(slicingArguments: ["first", "last"])
}
type User {
  name: String!
  avatar: String @cost(weight: "1")
}
"#;

fn types() -> SchemaTypes {
    let types = SchemaTypes::read_sdl(SDL);
    assert_eq!(types.problems, Vec::<String>::new());
    types
}

fn kept(text: &str) -> (Kept, Shape) {
    let doc = parse_query(text).unwrap();
    let shape = check(&doc, 100_000).unwrap();
    (Kept::new(text.into(), doc), shape)
}

/// The walks of the estimate and of the slicing check `f` makes.
fn walks(f: impl FnOnce()) -> (u32, u32) {
    let before = (super::estimate::WALKS.get(), super::check::WALKS.get());
    f();
    (
        super::estimate::WALKS.get() - before.0,
        super::check::WALKS.get() - before.1,
    )
}

/// The kept check's verdict for `v`, which the walk gives too.
fn verdict(
    kept: &Kept,
    shape: &Shape,
    costs: Option<&CostTable>,
    v: Json,
    name: Option<&str>,
) -> Result<(), OperationError> {
    let (types, v) = (types(), Variables::from_json(v));
    let answer = require_one_kept(kept, costs, &types, shape, &v, name);
    let walked = require_one_slicing_argument(costs, &types, &kept.doc, &v, name);
    assert_eq!(answer, walked);
    answer
}

/// The line and column of a refusal.
fn at(verdict: Result<(), OperationError>) -> Pos {
    match verdict {
        Err(OperationError::ValidationFailed { at, .. }) => at[0],
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn the_first_sight_of_a_kept_document_is_compiled_not_walked() {
    let (costs, types) = (CostTable::new(), types());
    let text = "query($n: Int) { one(first: $n) { avatar } }";
    let (kept, shape) = kept(text);
    let v = Variables::from_json(json!({"n": 6}));
    let (mut priced, mut checked) = (0, Ok(()));
    let first = walks(|| {
        checked = require_one_kept(&kept, Some(&costs), &types, &shape, &v, None);
        priced = estimate_kept(&kept, &costs, &types, &shape, &v, None);
    });
    assert_eq!(first, (0, 0));
    assert!(kept.has_cost());
    assert_eq!(priced, 6);
    assert_eq!(checked, Ok(()));
    assert_eq!(
        priced,
        estimate(&costs, &types, &kept.doc, &shape, &v, None)
    );
    // A formula too large to keep is walked, on its first sight and after.
    let wide: String = (0..80)
        .map(|i| format!("f{i}: one(first: $n) {{ avatar }} "))
        .collect();
    let (kept, shape) = self::kept(&format!("query($n: Int) {{ {wide} }}"));
    for _ in 0..2 {
        let walked = walks(|| {
            priced = estimate_kept(&kept, &costs, &types, &shape, &v, None);
        });
        assert_eq!(walked, (1, 0));
        assert_eq!(priced, 80 * 6);
    }
}

#[test]
fn the_kept_slicing_verdict_follows_each_requests_variables() {
    // `b` fails whatever the variables; `a` as they say; `a` comes first.
    let text = "query($f: Int, $l: Int) { \
                a: one(first: $f, last: $l) { name } \
                b: one(first: 1, last: 2) { name } }";
    let (kept, shape) = kept(text);
    let column = |alias| text.find(alias).unwrap() + 1;
    let (a, b) = (
        Pos {
            line: 1,
            column: column("a: one"),
        },
        Pos {
            line: 1,
            column: column("b: one"),
        },
    );
    assert_eq!(at(verdict(&kept, &shape, None, json!({"f": 1}), None)), b);
    assert!(kept.has_cost());
    assert_eq!(
        at(verdict(&kept, &shape, None, json!({"f": 1, "l": 2}), None)),
        a
    );
    assert_eq!(at(verdict(&kept, &shape, None, json!({}), None)), a);
    assert_eq!(at(verdict(&kept, &shape, None, json!({"l": 3}), None)), b);
    assert_eq!(
        at(verdict(
            &kept,
            &shape,
            None,
            json!({"f": 1, "l": null}),
            None
        )),
        b
    );

    let (kept, shape) = self::kept("query($f: Int, $l: Int) { one(first: $f, last: $l) { name } }");
    assert_eq!(verdict(&kept, &shape, None, json!({"f": 1}), None), Ok(()));
    assert!(verdict(&kept, &shape, None, json!({"f": 1, "l": 2}), None).is_err());
    assert!(verdict(&kept, &shape, None, json!({"f": null}), None).is_err());
    assert_eq!(verdict(&kept, &shape, None, json!({"l": 5}), None), Ok(()));
}

#[test]
fn a_kept_slicing_verdict_is_not_reused_for_another_table_or_operation() {
    let text = "query A { one(first: 1, last: 2) { name } } query B { one(first: 1) { name } }";
    let (kept, shape) = kept(text);
    assert!(verdict(&kept, &shape, None, json!({}), Some("A")).is_err());
    assert!(kept.has_cost());
    // A table that prices `Query.one` is the field's price: not checked.
    let table = CostTable::new().field("Query", "one", FieldCost::reads(1));
    assert_eq!(
        verdict(&kept, &shape, Some(&table), json!({}), Some("A")),
        Ok(())
    );
    assert_eq!(verdict(&kept, &shape, None, json!({}), Some("B")), Ok(()));
    // A schema whose `one` requires nothing.
    let lax = SchemaTypes::read_sdl(&SDL.replace(
        r#"["first", "last"])"#,
        r#"["first", "last"], requireOneSlicingArgument: false)"#,
    ));
    let v = Variables::default();
    assert_eq!(
        require_one_kept(&kept, None, &lax, &shape, &v, Some("A")),
        Ok(())
    );
}

#[test]
fn what_a_document_keeps_fits_the_room_it_reserves() {
    let kept = std::mem::size_of::<Option<super::kept::KeptCost>>();
    assert!(kept <= crate::document::memo::FORMULA_SLOT, "{kept}");
}
