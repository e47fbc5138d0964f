//! The cost written in the schema: the IBM GraphQL Cost Directives
//! (`@cost`, `@listSize`) and the engine's own `@fanoutShared` /
//! `@fanoutProvides`, declared on an async-graphql schema's fields and read
//! back into a [`FieldCost`] per field.
//!
//! ```
//! use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
//! use fanout_budget::cost::directives::{cost, list_size};
//!
//! #[derive(SimpleObject)]
//! struct Item { id: i32 }
//!
//! struct Query;
//!
//! #[Object]
//! impl Query {
//!     /// One upstream read, then `first` items.
//!     #[graphql(
//!         directive = cost::apply("1".to_string()),
//!         directive = list_size::apply(None, Some(vec!["first".to_string()]), None, None)
//!     )]
//!     async fn items(&self, #[graphql(default = 10)] first: i32) -> Vec<Item> {
//!         (0..first).map(|id| Item { id }).collect()
//!     }
//! }
//!
//! let schema = Schema::new(Query, EmptyMutation, EmptySubscription);
//! let sdl = schema.sdl();
//! assert!(sdl.contains(r#"items(first: Int! = 10): [Item!]! @cost(weight: "1") @listSize(slicingArguments: ["first"])"#));
//! assert!(sdl.contains("directive @listSize("));
//! fanout_budget::cost::check_schema(&sdl).unwrap();
//! ```
//!
//! The directives' `apply` functions take their arguments in order, `None`
//! leaving an optional one out (`requireOneSlicingArgument` then defaults
//! to `true`, as the specification says).

use super::table::{FieldCost, Multiplier, Slicing};
use async_graphql::Value;

// async-graphql's `TypeDirective` makes each function a unit struct with an
// `apply` function; the descriptions below are the directives' in the SDL.
#[allow(missing_docs)]
mod declared {
    use async_graphql::TypeDirective;

    /// The upstream reads resolving this field may send (a whole number).
    #[TypeDirective(location = "FieldDefinition")]
    pub fn cost(weight: String) {}

    /// The size of the list this field returns: the largest of the slicing
    /// arguments given (an argument with a default counts as given unless set
    /// to null; `filter.max` reaches into an input object), else
    /// `assumedSize`. With `sizedFields`, the size applies to those fields of
    /// the returned object (a connection's `nodes` or `edges`).
    #[TypeDirective(name = "listSize", location = "FieldDefinition")]
    pub fn list_size(
        assumed_size: Option<i32>,
        slicing_arguments: Option<Vec<String>>,
        sized_fields: Option<Vec<String>>,
        #[graphql(default_with = "Some(true)")] require_one_slicing_argument: Option<bool>,
    ) {
    }

    /// This field's reads are its object's read named `read`, made once per
    /// object however many of its fields need it.
    #[TypeDirective(name = "fanoutShared", location = "FieldDefinition")]
    pub fn fanout_shared(read: String) {}

    /// This field's reads are the read named `read` of the object it returns:
    /// that object's `@fanoutShared(read:)` fields are then free.
    #[TypeDirective(name = "fanoutProvides", location = "FieldDefinition")]
    pub fn fanout_provides(read: String) {}
}

pub use declared::{cost, fanout_provides, fanout_shared, list_size};

/// The cost a field's directives declare, if any: `directives` are the
/// field's (name, arguments); others than the four above are ignored.
/// `at` names the field (`Type.field`) in the messages of a wrong argument.
pub(crate) fn read<'a, D, A>(at: &str, directives: D) -> Result<Option<FieldCost>, String>
where
    D: IntoIterator<Item = (&'a str, A)>,
    A: IntoIterator<Item = (&'a str, &'a Value)>,
{
    let mut out: Option<FieldCost> = None;
    for (name, args) in directives {
        let known = ["cost", "listSize", "fanoutShared", "fanoutProvides"];
        if !known.contains(&name) {
            continue;
        }
        let field = out.get_or_insert_with(|| FieldCost::reads(0));
        let mut slicing = Slicing {
            require_one: true,
            ..Slicing::default()
        };
        let mut has_weight = false;
        for (arg, value) in args {
            let wrong = |expected: &str| {
                format!("@{name}({arg}: {value}) on {at}: `{arg}` must be {expected}")
            };
            match (name, arg) {
                ("cost", "weight") => {
                    let Value::String(weight) = value else {
                        return Err(wrong("a string"));
                    };
                    field.reads = weight
                        .trim()
                        .parse()
                        .map_err(|_| wrong("a whole number of upstream reads, such as \"1\""))?;
                    has_weight = true;
                }
                ("listSize", "assumedSize") => match value {
                    Value::Null => {}
                    Value::Number(n) => {
                        let n = n.as_u64().ok_or_else(|| wrong("a non-negative Int"))?;
                        slicing.assumed = Some(n);
                    }
                    _ => return Err(wrong("a non-negative Int")),
                },
                ("listSize", "slicingArguments") => slicing.paths = strings(value, &wrong)?,
                ("listSize", "sizedFields") => field.sized = strings(value, &wrong)?,
                ("listSize", "requireOneSlicingArgument") => match value {
                    Value::Null => {}
                    Value::Boolean(b) => slicing.require_one = *b,
                    _ => return Err(wrong("a Boolean")),
                },
                ("fanoutShared" | "fanoutProvides", "read") => {
                    let Value::String(read) = value else {
                        return Err(wrong("a string"));
                    };
                    let key = Some(read.clone());
                    if name == "fanoutShared" {
                        field.shared = key;
                    } else {
                        field.provides = key;
                    }
                }
                _ => return Err(format!("@{name} on {at} has no argument `{arg}`")),
            }
        }
        if name == "cost" && !has_weight {
            return Err(format!("@cost on {at} needs its `weight`"));
        }
        if name == "listSize" {
            field.times = Multiplier::Slicing(slicing);
        }
    }
    Ok(out)
}

/// A `[String!]` argument's strings (null: none).
fn strings(value: &Value, wrong: &dyn Fn(&str) -> String) -> Result<Vec<String>, String> {
    match value {
        Value::Null => Ok(Vec::new()),
        // A single string is a list of one (GraphQL input coercion).
        Value::String(s) => Ok(vec![s.clone()]),
        Value::List(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                _ => Err(wrong("a list of strings")),
            })
            .collect(),
        _ => Err(wrong("a list of strings")),
    }
}
