//! One root field per subscription (GraphQL spec, "Single root field").
//!
//! A subscription operation's response stream is its one root field's: the
//! spec lets it select exactly one (however it is reached — directly, by a
//! fragment spread, in an inline fragment). async-graphql 7.2 does not
//! check it, and runs every root field of a subscription as a stream of its
//! own: one `subscribe` naming `tagChanges` 999 times under 999 aliases
//! started 999 shared polls, where the connection's
//! `subscriptions.max_per_connection` meant to bound them at 16. So a
//! document with a subscription selecting more than one response key at its
//! root is refused here, `GRAPHQL_VALIDATION_FAILED`, before anything runs —
//! and the streams (and polls) one connection can start are bounded by its
//! subscriptions.
//!
//! The spec lets a subscription select one field twice under one response
//! key (`subscription { a a }`: one entry of its grouped field set), but
//! async-graphql 7.2 starts a stream for each selection, so the same field
//! repeated 990 times started 990 streams: here a second selection of a
//! field at the root is refused, whatever its key.
//!
//! A root field reached through a fragment (`subscription { ...F }`) is
//! refused too, with a message saying why: async-graphql 7.2 starts
//! streams for the fields written at the root only, so such a subscription
//! would complete at once, having sent nothing.
//!
//! The walk visits each fragment once (the guard has already refused
//! cycles; a set of those seen keeps it linear regardless) and stops at the
//! second field.

use crate::error::OperationError;
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, OperationType, Selection,
    SelectionSet,
};
use async_graphql::{Name, Pos, Positioned};
use std::collections::HashSet;

/// The first subscription operation of `doc` whose root selects more than
/// one field (or one field twice), as a validation error at its second field (`None`: every
/// subscription selects one).
pub(crate) fn check(doc: &ExecutableDocument) -> Option<OperationError> {
    // No allocation for a document without a subscription (every query).
    match &doc.operations {
        DocumentOperations::Single(op) => refusal(doc, None, op),
        DocumentOperations::Multiple(ops) => ops
            .iter()
            .find_map(|(name, op)| refusal(doc, Some(name), op)),
    }
}

/// Why the operation `op` named `name` is refused, if it is a subscription
/// whose root does not select one field directly.
fn refusal(
    doc: &ExecutableDocument,
    name: Option<&Name>,
    op: &Positioned<OperationDefinition>,
) -> Option<OperationError> {
    if op.node.ty != OperationType::Subscription {
        return None;
    }
    let name = match name {
        Some(name) => format!("Subscription \"{name}\""),
        None => "Anonymous Subscription".to_string(),
    };
    if let Some(second) = second_field(doc, &op.node.selection_set) {
        return Some(OperationError::ValidationFailed {
            message: format!("{name} must select only one top level field."),
            at: vec![second],
        });
    }
    let items = &op.node.selection_set.node.items;
    let fragment = items
        .iter()
        .find(|item| !matches!(item.node, Selection::Field(_)))?;
    Some(OperationError::ValidationFailed {
        message: format!(
            "{name} must select its top level field directly, not through a fragment \
             (no event would be sent for it)."
        ),
        at: vec![fragment.pos],
    })
}

/// Where the second field selected in `set` is, fragments expanded.
fn second_field(doc: &ExecutableDocument, set: &Positioned<SelectionSet>) -> Option<Pos> {
    let mut fields = 0;
    let mut seen: HashSet<&Name> = HashSet::new();
    let mut stack: Vec<&Positioned<SelectionSet>> = vec![set];
    while let Some(set) = stack.pop() {
        for selection in &set.node.items {
            match &selection.node {
                Selection::Field(field) => {
                    fields += 1;
                    if fields == 2 {
                        return Some(field.pos);
                    }
                }
                Selection::FragmentSpread(spread) => {
                    let name = &spread.node.fragment_name.node;
                    if let Some(fragment) = doc.fragments.get(name) {
                        if seen.insert(name) {
                            stack.push(&fragment.node.selection_set);
                        }
                    }
                }
                Selection::InlineFragment(inline) => stack.push(&inline.node.selection_set),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    fn refused(query: &str) -> Option<String> {
        check(&parse_query(query).unwrap()).map(|err| match err {
            OperationError::ValidationFailed { message, .. } => message,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn one_root_field_passes_however_it_is_reached() {
        assert_eq!(refused("subscription { a(x: 1) { b c } }"), None);

        assert_eq!(
            refused("query Q { a b c } mutation M { d e }"),
            None,
            "only subscriptions"
        );
    }

    #[test]
    fn a_second_root_key_is_refused_directly_aliased_or_through_fragments() {
        let anonymous = Some("Anonymous Subscription must select only one top level field.".into());
        assert_eq!(refused("subscription { a b }"), anonymous);
        assert_eq!(refused("subscription { x: a y: a }"), anonymous);
        assert_eq!(refused("subscription { a a }"), anonymous, "a stream each");
        assert_eq!(
            refused("subscription { a { b } a @include(if: true) { c } }"),
            anonymous
        );
        assert_eq!(refused("subscription { a __typename }"), anonymous);
        assert_eq!(
            refused("subscription S { a ...F } fragment F on Subscription { ... on Subscription { b } }"),
            Some("Subscription \"S\" must select only one top level field.".into())
        );
        let many: String = (0..999).map(|k| format!("t{k}: a ")).collect();
        assert_eq!(refused(&format!("subscription {{ {many} }}")), anonymous);
    }

    #[test]
    fn a_root_field_through_a_fragment_is_refused_saying_why() {
        for query in [
            "subscription S { ...F } fragment F on Subscription { a }",
            "subscription { ... on Subscription { a } }",
            "subscription { ... { a } }",
        ] {
            let message = refused(query).expect(query);
            assert!(
                message.contains("directly, not through a fragment"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_error_points_at_the_second_field() {
        let doc = parse_query("subscription {\n  a\n  b\n}").unwrap();
        let Some(OperationError::ValidationFailed { at, .. }) = check(&doc) else {
            panic!("refused");
        };
        assert_eq!(at, vec![Pos { line: 3, column: 3 }]);
    }
}
