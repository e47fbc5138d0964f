//! Null propagation: the GraphQL rule async-graphql 7.2 skips.
//!
//! The spec: when a field fails, it is `null`; if its type is non-null, the
//! `null` propagates to the nearest nullable ancestor (possibly `data`
//! itself). async-graphql 7.2 instead drops the failed field's key from its
//! parent object, leaving an answer that does not match the schema (a client
//! reading `tags.totalCount` finds no `tags` at all).
//!
//! [`OrNull::or_null`](crate::OrNull) avoids the trap for the nullable fields a
//! resolver controls. This module repairs every other case after execution:
//! for each error whose path leads to a missing key, it walks the operation
//! and the schema's types along the path, finds the nearest nullable position
//! at or above the failed field, and writes `null` there. It only runs when an
//! error's key is missing, so a clean answer costs nothing.

use crate::cost::schema_types::SchemaTypes;
use async_graphql::parser::types::{ExecutableDocument, Field, Selection, SelectionSet};
use async_graphql::{Name, PathSegment, Positioned, Response, Value};
use std::collections::HashSet;

/// Repairs `response` (see the module docs). `query` is the operation's text.
pub(crate) fn propagate(
    response: &mut Response,
    types: &SchemaTypes,
    query: &str,
    operation_name: Option<&str>,
) {
    let paths: Vec<Vec<PathSegment>> = response
        .errors
        .iter()
        .filter(|e| !e.path.is_empty() && lookup(&response.data, &e.path).is_none())
        .map(|e| e.path.clone())
        .collect();
    if paths.is_empty() {
        return;
    }
    let Ok(doc) = async_graphql::parser::parse_query(query) else {
        return;
    };
    let Some((root, selection)) = operation(&doc, types, operation_name) else {
        return;
    };
    for path in paths {
        let Some(nullable) = nullability(types, &doc, root, selection, &path) else {
            continue;
        };
        // The nearest nullable position at or above the failed field.
        match nullable.iter().rposition(|n| *n) {
            Some(at) => set_null(&mut response.data, &path[..=at]),
            None => response.data = Value::Null,
        }
    }
}

fn operation<'d>(
    doc: &'d ExecutableDocument,
    types: &'d SchemaTypes,
    name: Option<&str>,
) -> Option<(&'d str, &'d Positioned<SelectionSet>)> {
    let op = crate::document::guard::operation(doc, name)?;
    Some((types.root(op.ty)?, &op.selection_set))
}

/// For each position of `path`, whether the schema lets it be `null`.
fn nullability<'a>(
    types: &'a SchemaTypes,
    doc: &'a ExecutableDocument,
    root: &'a str,
    selection: &'a Positioned<SelectionSet>,
    path: &[PathSegment],
) -> Option<Vec<bool>> {
    let mut out = Vec::with_capacity(path.len());
    // The current position's declared type, and the named type under it.
    let mut ty = root;
    let mut named = root;
    let mut set = selection;
    for segment in path {
        match segment {
            PathSegment::Field(key) => {
                let (field, on) = find_field(doc, set, key, named)?;
                let info = types.field(on, &field.name.node)?;
                ty = &info.ty;
                named = &info.named;
                set = &field.selection_set;
            }
            PathSegment::Index(_) => {
                let list = ty.strip_suffix('!').unwrap_or(ty);
                ty = list.strip_prefix('[')?.strip_suffix(']')?;
            }
        }
        out.push(!ty.ends_with('!'));
    }
    Some(out)
}

/// The field answering `key` in `set` (fragments included), and the type it
/// is selected on. Each fragment is searched at most once, with an explicit
/// stack: linear in the document, however its fragments nest.
fn find_field<'d>(
    doc: &'d ExecutableDocument,
    set: &'d Positioned<SelectionSet>,
    key: &str,
    on: &'d str,
) -> Option<(&'d Field, &'d str)> {
    let mut searched: HashSet<&Name> = HashSet::new();
    let mut stack = vec![(set, on)];
    while let Some((set, on)) = stack.pop() {
        for item in &set.node.items {
            match &item.node {
                Selection::Field(field) if field.node.response_key().node.as_str() == key => {
                    return Some((&field.node, on));
                }
                Selection::Field(_) => {}
                Selection::InlineFragment(fragment) => {
                    let on = fragment
                        .node
                        .type_condition
                        .as_ref()
                        .map_or(on, |c| c.node.on.node.as_str());
                    stack.push((&fragment.node.selection_set, on));
                }
                Selection::FragmentSpread(spread) => {
                    let name = &spread.node.fragment_name.node;
                    if let Some(def) = doc.fragments.get(name) {
                        if searched.insert(name) {
                            let on = def.node.type_condition.node.on.node.as_str();
                            stack.push((&def.node.selection_set, on));
                        }
                    }
                }
            }
        }
    }
    None
}

fn lookup<'v>(value: &'v Value, path: &[PathSegment]) -> Option<&'v Value> {
    path.iter()
        .try_fold(value, |value, segment| match (value, segment) {
            (Value::Object(map), PathSegment::Field(key)) => map.get(key.as_str()),
            (Value::List(items), PathSegment::Index(i)) => items.get(*i),
            // Already nulled above this point: nothing is missing below.
            (Value::Null, _) => Some(value),
            _ => None,
        })
}

fn set_null(data: &mut Value, path: &[PathSegment]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut value = data;
    for segment in parents {
        value = match (value, segment) {
            (Value::Object(map), PathSegment::Field(key)) => match map.get_mut(key.as_str()) {
                Some(v) => v,
                None => return,
            },
            (Value::List(items), PathSegment::Index(i)) => match items.get_mut(*i) {
                Some(v) => v,
                None => return,
            },
            _ => return, // an ancestor is already null
        };
    }
    match (value, last) {
        (Value::Object(map), PathSegment::Field(key)) => {
            map.insert(Name::new(key), Value::Null);
        }
        (Value::List(items), PathSegment::Index(i)) => {
            if let Some(item) = items.get_mut(*i) {
                *item = Value::Null;
            }
        }
        _ => {}
    }
}
