//! The document guard: fragment cycles and how far a document expands,
//! found in time linear in the document, before anything else walks it.
//!
//! A GraphQL document is small on the wire and can be enormous once its
//! fragments are expanded: `fragment F1 on Query { ...F2 ...F2 }`, `F2`
//! spreading `F3` twice, and so on, doubles at every link, so a query under
//! 1 KB expands to 2^24 selections and more; a cycle (`fragment A on Query
//! { ...A }`) expands for ever. async-graphql 7.2 expands fragments without
//! a memo in several places that run *before* its validation refuses a
//! cycle (its recursion-depth check in parsing, the complexity, depth and
//! cache-control visitors, execution), and so does any naive walk of ours.
//!
//! [`check`] therefore runs first, on the parsed document:
//!
//! 1. for each fragment and operation it lists, in one pass over its own
//!    selection sets (nesting is at most 64 deep: the parser's limit), how
//!    many selections it has of its own and which fragments it spreads;
//! 2. a depth-first search over the fragment graph with an explicit stack
//!    (a chain of thousands of fragments needs no deep call stack) finds a
//!    cycle, or else an order in which every fragment comes after the
//!    fragments it spreads;
//! 3. in that order each fragment's expanded size is its own selections plus
//!    the expanded sizes of its spreads (saturating): computed once each.
//!
//! The document's size is the sum over its operations and its fragment
//! definitions, each expanded (async-graphql validates every one of them,
//! not only the operation that runs, and its overlapping-fields rule
//! flattens every selection set with the fragments it spreads, so an unused
//! fragment costs as much as a used one; a used fragment counts twice). More
//! than `http.max_selections` is refused, as a cycle is, with
//! `GRAPHQL_VALIDATION_FAILED` before a read or a resolver runs. The order
//! found is kept ([`Shape::order`]) so the cost preview can price each
//! fragment once too.

use crate::error::OperationError;
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Pos, Positioned, Value as ConstValue, Variables};
use std::collections::HashMap;

/// A document that passed [`check`].
#[derive(Debug)]
pub(crate) struct Shape {
    /// Every fragment defined, each after all the fragments it spreads.
    pub(crate) order: Vec<Name>,
    /// Selections every operation and fragment definition of the document
    /// expands to, together.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) selections: u64,
}

/// Why a document is refused before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ShapeError {
    /// A fragment spreads itself, directly or through others.
    Cycle {
        /// The fragment where the cycle was found.
        fragment: String,
        /// Where it is defined.
        pos: Pos,
    },
    /// The document expands to more than the bound.
    TooLarge {
        /// Selections it expands to (saturated at `u64::MAX`).
        selections: u64,
        /// The bound (`http.max_selections`).
        max: u64,
    },
}

impl From<ShapeError> for OperationError {
    fn from(err: ShapeError) -> Self {
        OperationError::ValidationFailed {
            message: err.message(),
            at: err.pos().into_iter().collect(),
        }
    }
}

impl ShapeError {
    /// The message a client reads.
    pub(crate) fn message(&self) -> String {
        match self {
            Self::Cycle { fragment, .. } => {
                format!("cannot spread fragment \"{fragment}\" within itself")
            }
            Self::TooLarge { selections, max } => format!(
                "the operation expands to {} field selections with its fragments; at most {max} are allowed",
                if *selections == u64::MAX {
                    "more than 2^64".to_string()
                } else {
                    selections.to_string()
                }
            ),
        }
    }

    /// Where the error is, if it is at one place.
    pub(crate) fn pos(&self) -> Option<Pos> {
        match self {
            Self::Cycle { pos, .. } => Some(*pos),
            Self::TooLarge { .. } => None,
        }
    }
}

/// A fragment or operation's own selections and the fragments it spreads.
struct Local<'d> {
    own: u64,
    spreads: Vec<&'d Name>,
}

fn local(set: &Positioned<SelectionSet>) -> Local<'_> {
    let mut out = Local {
        own: 0,
        spreads: Vec::new(),
    };
    collect(set, &mut out);
    out
}

fn collect<'d>(set: &'d Positioned<SelectionSet>, out: &mut Local<'d>) {
    for item in &set.node.items {
        out.own += 1;
        match &item.node {
            Selection::Field(field) => collect(&field.node.selection_set, out),
            Selection::InlineFragment(inline) => collect(&inline.node.selection_set, out),
            Selection::FragmentSpread(spread) => out.spreads.push(&spread.node.fragment_name.node),
        }
    }
}

/// Checks `doc` (see the module docs): no fragment cycle, and at most
/// `max_selections` selections once expanded.
pub(crate) fn check(doc: &ExecutableDocument, max_selections: u64) -> Result<Shape, ShapeError> {
    let locals: HashMap<&Name, Local<'_>> = doc
        .fragments
        .iter()
        .map(|(name, def)| (name, local(&def.node.selection_set)))
        .collect();
    let order = order(doc, &locals)?;
    let mut size: HashMap<&Name, u64> = HashMap::with_capacity(order.len());
    let expand = |local: &Local<'_>, size: &HashMap<&Name, u64>| {
        local.spreads.iter().fold(local.own, |total, spread| {
            // An unknown fragment expands to nothing (validation names it).
            total.saturating_add(size.get(spread).copied().unwrap_or(0))
        })
    };
    for name in &order {
        let expanded = expand(&locals[name], &size);
        size.insert(name, expanded);
    }
    // async-graphql validates every operation and every fragment
    // definition (its overlapping-fields rule flattens each selection set
    // with the fragments it spreads, used or not), so all of them count.
    let operations = doc.operations.iter().fold(0u64, |total, (_, op)| {
        total.saturating_add(expand(&local(&op.node.selection_set), &size))
    });
    let selections = size
        .values()
        .fold(operations, |total, n| total.saturating_add(*n));
    if selections > max_selections {
        return Err(ShapeError::TooLarge {
            selections,
            max: max_selections,
        });
    }
    Ok(Shape {
        order: order.into_iter().cloned().collect(),
        selections,
    })
}

/// The operation of `doc` that runs for `name`, as async-graphql selects
/// it: the anonymous one without a name, the one named, or the only named
/// one without a name (`None`: no such operation, which async-graphql
/// reports).
pub(crate) fn operation<'d>(
    doc: &'d ExecutableDocument,
    name: Option<&str>,
) -> Option<&'d OperationDefinition> {
    match (&doc.operations, name) {
        (DocumentOperations::Single(op), None) => Some(&op.node),
        (DocumentOperations::Single(_), Some(_)) => None,
        (DocumentOperations::Multiple(ops), Some(name)) => Some(&ops.get(name)?.node),
        (DocumentOperations::Multiple(ops), None) if ops.len() == 1 => {
            Some(&ops.values().next()?.node)
        }
        _ => None,
    }
}

/// The spec's variable coercion, for what async-graphql leaves to
/// execution: the first variable of a non-null type, without a default,
/// that `variables` lacks or sets to `null` (refused before anything runs,
/// `BAD_USER_INPUT`).
pub(crate) fn missing_variable(op: &OperationDefinition, variables: &Variables) -> Option<String> {
    op.variable_definitions.iter().find_map(|def| {
        let def = &def.node;
        if def.var_type.node.nullable || def.default_value.is_some() {
            return None;
        }
        let (name, ty) = (&def.name.node, &def.var_type.node);
        match variables.get(name) {
            None => Some(format!(
                "Variable \"${name}\" of required type \"{ty}\" was not provided."
            )),
            Some(ConstValue::Null) => Some(format!(
                "Variable \"${name}\" of non-null type \"{ty}\" must not be null."
            )),
            Some(_) => None,
        }
    })
}

/// Whether the argument named at `pos` takes its value from a variable
/// (how async-graphql's invalid-argument errors are told apart: a literal
/// is a validation error, a variable's value is the caller's input). Walks
/// each selection set once; spreads are not followed.
pub(crate) fn argument_is_variable(doc: &ExecutableDocument, pos: Pos) -> bool {
    fn search(set: &Positioned<SelectionSet>, pos: Pos) -> bool {
        set.node.items.iter().any(|item| match &item.node {
            Selection::Field(field) => {
                field.node.arguments.iter().any(|(name, value)| {
                    name.pos == pos && matches!(value.node, async_graphql_value::Value::Variable(_))
                }) || search(&field.node.selection_set, pos)
            }
            Selection::InlineFragment(inline) => search(&inline.node.selection_set, pos),
            Selection::FragmentSpread(_) => false,
        })
    }
    doc.operations
        .iter()
        .any(|(_, op)| search(&op.node.selection_set, pos))
        || doc
            .fragments
            .values()
            .any(|f| search(&f.node.selection_set, pos))
}

/// Every fragment after the fragments it spreads, or the first cycle found
/// (an iterative depth-first search: white, grey on the stack, black done).
fn order<'d>(
    doc: &'d ExecutableDocument,
    locals: &HashMap<&'d Name, Local<'d>>,
) -> Result<Vec<&'d Name>, ShapeError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        OnStack,
        Done,
    }
    let mut marks: HashMap<&Name, Mark> = HashMap::with_capacity(locals.len());
    let mut order = Vec::with_capacity(locals.len());
    // Sorted, so the cycle reported is the same on every run.
    let mut roots: Vec<&Name> = locals.keys().copied().collect();
    roots.sort();
    for root in roots {
        if marks.contains_key(root) {
            continue;
        }
        // (fragment, index of its next spread to follow)
        let mut stack: Vec<(&Name, usize)> = vec![(root, 0)];
        marks.insert(root, Mark::OnStack);
        while let Some((name, next)) = stack.last_mut() {
            let spreads = &locals[*name].spreads;
            let Some(&spread) = spreads.get(*next) else {
                marks.insert(name, Mark::Done);
                order.push(*name);
                stack.pop();
                continue;
            };
            *next += 1;
            if !locals.contains_key(spread) {
                continue;
            }
            match marks.get(spread) {
                Some(Mark::Done) => {}
                Some(Mark::OnStack) => {
                    return Err(ShapeError::Cycle {
                        fragment: spread.to_string(),
                        pos: doc.fragments[spread].pos,
                    })
                }
                None => {
                    marks.insert(spread, Mark::OnStack);
                    stack.push((spread, 0));
                }
            }
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(query: &str, max: u64) -> Result<u64, ShapeError> {
        let doc = async_graphql::parser::parse_query(query).expect("parses");
        check(&doc, max).map(|shape| shape.selections)
    }

    #[test]
    fn counts_every_selection_once_per_expansion() {
        assert_eq!(shape("{ a b { c } }", 100), Ok(3));
        // F is spread twice: its two selections count twice, plus the
        // spreads; and F's definition once more.
        assert_eq!(
            shape("{ a { ...F } b { ...F } } fragment F on T { x y }", 100),
            Ok(2 + 2 + 2 * 2 + 2)
        );
        assert_eq!(shape("{ ... on Q { a } }", 100), Ok(2));
    }

    #[test]
    fn a_doubling_chain_is_counted_without_expanding_it() {
        let mut query = String::from("{ ...F0 }");
        for i in 0..80 {
            query.push_str(&format!(
                " fragment F{i} on Query {{ ...F{n} ...F{n} }}",
                n = i + 1
            ));
        }
        query.push_str(" fragment F80 on Query { __typename }");
        assert_eq!(
            shape(&query, 1_000),
            Err(ShapeError::TooLarge {
                selections: u64::MAX,
                max: 1_000
            })
        );
    }

    #[test]
    fn cycles_are_found_directly_and_through_others() {
        let err = shape("{ ...A } fragment A on Query { ...A ...A }", 100).unwrap_err();
        assert!(matches!(err, ShapeError::Cycle { ref fragment, .. } if fragment == "A"));
        let err = shape(
            "{ ...A } fragment A on Query { a ...B } fragment B on Query { ... on Query { ...C } } fragment C on Query { ...A }",
            100,
        )
        .unwrap_err();
        assert!(matches!(err, ShapeError::Cycle { .. }));
        // An unused cycle is refused too: async-graphql walks every fragment.
        let err = shape(
            "{ a } fragment X on Query { ...Y } fragment Y on Query { ...X }",
            100,
        )
        .unwrap_err();
        assert!(matches!(err, ShapeError::Cycle { .. }));
    }

    #[test]
    fn an_unused_fragment_counts_as_it_expands() {
        // Unused, but async-graphql's validation flattens it all the same.
        let query = "{ a } fragment H on Q { x y z } fragment X on Q { ... { ...H } ... { ...H } }";
        // Operation 1; H 3; X: 2 inline + 2 spreads + 2 × 3.
        assert_eq!(shape(query, 100), Ok(1 + 3 + 10));
        assert!(matches!(
            shape(query, 13),
            Err(ShapeError::TooLarge {
                selections: 14,
                max: 13
            })
        ));
    }

    #[test]
    fn a_diamond_is_no_cycle() {
        let query = "{ ...A } fragment A on Q { ...B ...C } fragment B on Q { ...D } \
                     fragment C on Q { ...D } fragment D on Q { x }";
        // The operation: 1 + A; A: 2 spreads + B (1 + D) + C (1 + D), D = 1;
        // then each definition: A 6, B 2, C 2, D 1.
        assert_eq!(shape(query, 100), Ok(1 + 6 + 6 + 2 + 2 + 1));
    }

    #[test]
    fn a_long_chain_needs_no_deep_stack() {
        let n = 20_000;
        let mut query = String::from("{ ...F0 }");
        for i in 0..n {
            query.push_str(&format!(" fragment F{i} on Q {{ ...F{} }}", i + 1));
        }
        query.push_str(&format!(" fragment F{n} on Q {{ x }}"));
        let doc = async_graphql::parser::parse_query(&query).expect("parses");
        // On a small thread stack: the walk must not recurse per fragment.
        let selections = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || check(&doc, u64::MAX).map(|s| (s.selections, s.order.len())))
            .expect("spawns")
            .join()
            .expect("no stack overflow");
        // The operation expands to n + 2; fragment Fi to n + 1 - i.
        let n64 = n as u64;
        let definitions = (n64 + 1) * (n64 + 2) / 2;
        assert_eq!(selections, Ok((n64 + 2 + definitions, n + 1)));
    }

    #[test]
    fn the_order_puts_each_fragment_after_what_it_spreads() {
        let doc = async_graphql::parser::parse_query(
            "{ ...A } fragment A on Q { ...B ...C } fragment B on Q { ...C } fragment C on Q { x }",
        )
        .unwrap();
        let shape = check(&doc, 100).unwrap();
        let at = |n: &str| shape.order.iter().position(|f| f.as_str() == n).unwrap();
        assert!(at("C") < at("B") && at("B") < at("A"));
    }
}
