//! `@listSize`'s slicing arguments: the size of a list from the arguments
//! the query gives, variables and defaults resolved.

use super::table::Slicing;
use crate::cost::schema_types::{FieldInfo, SchemaTypes};
use async_graphql::parser::types::{Field, OperationDefinition};
use async_graphql::{Name, Value, Variables};
use async_graphql_value::Value as Input;

/// The values of the slicing arguments the query gives, in the order of
/// `slicing.paths`: an argument absent from the query counts with its
/// default; one set to null (or absent without a default) is not given.
pub(crate) fn given(
    slicing: &Slicing,
    field: &Field,
    info: &FieldInfo,
    types: &SchemaTypes,
    vars: &dyn Fn(&Name) -> Option<Value>,
) -> Vec<u64> {
    slicing
        .paths
        .iter()
        .filter_map(|path| size(path, field, info, types, vars))
        .collect()
}

/// The list's size: the largest slicing argument given, else the assumed
/// size, else 0.
pub(crate) fn times(
    slicing: &Slicing,
    field: &Field,
    info: &FieldInfo,
    types: &SchemaTypes,
    vars: &dyn Fn(&Name) -> Option<Value>,
) -> u64 {
    let given = given(slicing, field, info, types, vars);
    given.into_iter().max().or(slicing.assumed).unwrap_or(0)
}

/// The value at `path` (`first`, `filter.max`): a number, or a list's
/// length (0 for a value of another type); `None` when it is not given or
/// null.
fn size(
    path: &str,
    field: &Field,
    info: &FieldInfo,
    types: &SchemaTypes,
    vars: &dyn Fn(&Name) -> Option<Value>,
) -> Option<u64> {
    let mut segments = path.split('.');
    let first = segments.next()?;
    let arg = info.arg(first)?;
    let given = field
        .get_argument(first)
        .and_then(|value| resolve(&value.node, vars));
    let mut value = given.or_else(|| arg.default.clone())?;
    let mut named = arg.named.as_str();
    for segment in segments {
        let Value::Object(object) = value else {
            return None;
        };
        let input = types
            .inputs
            .get(named)?
            .iter()
            .find(|f| f.name == segment)?;
        value = match object.get(segment) {
            Some(inner) => inner.clone(),
            None => input.default.clone()?,
        };
        named = &input.named;
    }
    match value {
        Value::Number(n) => Some(n.as_u64().unwrap_or(0)),
        Value::List(items) => Some(items.len() as u64),
        Value::Null => None,
        // Given, but not a size (`first: "x"`): coercing it is
        // async-graphql's (BAD_USER_INPUT), not requireOneSlicingArgument's.
        _ => Some(0),
    }
}

/// A value of the query, its variables replaced; `None` when it is a
/// variable without a value (the argument or field is then absent). An
/// input object's field whose variable has no value is left out.
fn resolve(value: &Input, vars: &dyn Fn(&Name) -> Option<Value>) -> Option<Value> {
    match value {
        Input::Variable(name) => vars(name),
        Input::List(items) => Some(Value::List(
            items
                .iter()
                .map(|item| resolve(item, vars).unwrap_or(Value::Null))
                .collect(),
        )),
        Input::Object(fields) => Some(Value::Object(
            fields
                .iter()
                .filter_map(|(name, value)| Some((name.clone(), resolve(value, vars)?)))
                .collect(),
        )),
        other => other.clone().into_const(),
    }
}

/// A variable's value: the request's, else the operation's default.
pub(crate) fn variable(
    variables: &Variables,
    op: &OperationDefinition,
    name: &Name,
) -> Option<Value> {
    if let Some(value) = variables.get(name) {
        return Some(value.clone());
    }
    op.variable_definitions
        .iter()
        .find(|def| def.node.name.node == *name)
        .and_then(|def| def.node.default_value.as_ref())
        .map(|default| default.node.clone())
}
