//! What an operation on a WebSocket holds while it is active, weighed
//! before it runs so that it can be charged to its client's share of the
//! sockets' pool (`memory/shares.rs`).
//!
//! A subscription lives for hours, and what it keeps is decided by its
//! client: async-graphql keeps the operation's parsed document (its
//! operation and fragments: a selection, a name and a position per field,
//! alias and argument — 10 to 20 times the text), its variables, the
//! extension keeps its text (once, shared with the span's document), and
//! the stream itself and the per-operation state are a few KiB. Charging the
//! text alone let a subscription with 1,999 aliases hold 6.6 times what it
//! was charged; each part is weighed here instead:
//!
//! - the document by [`document_weight`](crate::cost::document_weight) (the
//!   estimate the document cache sizes its entries by, from the document's
//!   shape), times [`DOCUMENT_FACTOR`] for what the estimate leaves out
//!   (each name's own allocation, the allocator's rounding);
//! - the variables as the answer memory weighs values (`memory.rs`);
//! - the text once, and [`OPERATION_WEIGHT`] for the rest.
//!
//! The weights were calibrated against resident memory in a child process
//! (`tests/socket_memory.rs`): subscriptions with many aliases, long texts
//! and long variables, 16 to a socket.

use crate::memory::{weigh, ENTRY_WEIGHT};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Request, Value, Variables};

/// What an active operation holds beyond its document, variables and
/// text: async-graphql's stream and query environment, the extension's
/// per-operation state, the session's data handle, the resolver's stream.
pub(crate) const OPERATION_WEIGHT: usize = 8 << 10;

/// What a parsed document holds per byte of its shape's estimate.
pub(crate) const DOCUMENT_FACTOR: usize = 1;

/// A document too deep to weigh (only one built by hand): weighed as its
/// text this many times over (the parser makes 50–130 bytes of a byte).
const UNWEIGHED_DOCUMENT: usize = 130;

/// What an operation whose text is `text` bytes, parsed as `doc`, run with
/// `variables`, holds while active (see the module docs).
pub(crate) fn weight(doc: &ExecutableDocument, text: usize, variables: &Variables) -> usize {
    let document = crate::document::cache::weight(doc)
        .map_or(text.saturating_mul(UNWEIGHED_DOCUMENT), |w| {
            w.saturating_mul(DOCUMENT_FACTOR)
        });
    OPERATION_WEIGHT
        .saturating_add(document)
        .saturating_add(entries(variables.iter().map(|(n, v)| (n.as_str(), v))))
        .saturating_add(text)
}

/// What a subscribe holds while its admission is checked: its request as
/// parsed — its text and operation name, its variables and extensions
/// weighed as the answer memory weighs values (a 2-byte `0,` in the frame
/// is a whole `Value` once parsed: 40 times its bytes).
pub(crate) fn waiting(request: &Request) -> usize {
    let variables = request.variables.iter().map(|(n, v)| (n.as_str(), v));
    let extensions = request.extensions.iter().map(|(n, v)| (n.as_str(), v));
    let name = request.operation_name.as_ref().map_or(0, String::len);
    (request.query.len() + name)
        .saturating_add(entries(variables))
        .saturating_add(entries(extensions))
}

/// A map's entries, each its name and its value (deep).
fn entries<'a>(entries: impl Iterator<Item = (&'a str, &'a Value)>) -> usize {
    entries
        .map(|(name, value)| ENTRY_WEIGHT + name.len() + weigh(value, true))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    #[test]
    fn aliases_and_variables_weigh_what_their_text_does_not_say() {
        let one = "subscription { t(r: \"a\") { digest } }";
        let many: String = (0..2000).map(|k| format!("a{k}: digest ")).collect();
        let many = format!("subscription {{ t(r: \"a\") {{ {many} }} }}");
        let none = Variables::default();
        let small = weight(&parse_query(one).unwrap(), one.len(), &none);
        let aliased = weight(&parse_query(&many).unwrap(), many.len(), &none);
        assert!(small < 2 * OPERATION_WEIGHT, "{small}");
        assert!(
            aliased > 10 * many.len(),
            "2,000 aliases weigh {aliased} for a text of {}",
            many.len()
        );
        let long = Variables::from_json(serde_json::json!({ "r": "x".repeat(50_000) }));
        let with_long = weight(&parse_query(one).unwrap(), one.len(), &long);
        assert!(with_long >= small + 50_000, "{with_long}");
    }
}
