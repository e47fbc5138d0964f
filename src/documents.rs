//! Parsed documents, kept per distinct query text.
//!
//! Clients send the same few query texts again and again: a page's queries,
//! the operations an Apollo Client batching link sends together. Parsing one
//! is the largest single step of serving it — for the benchmark's five-read
//! query, about 165,000 instructions, more than async-graphql's validation
//! and the engine's whole read path put together — and its result depends on
//! the text alone. So [`FanoutGraphQL`](crate::FanoutGraphQL) keeps the
//! parsed document of each text it has seen and hands async-graphql a copy
//! (`Request::set_parsed_query`); async-graphql then checks its depth,
//! validates it against the schema and runs it exactly as if it had parsed
//! the text itself. Pricing (the cost preview) walks the same copy.
//!
//! How it works: one `std::sync::RwLock` around a map from the text to an
//! `Arc` of its document. A hit takes the read lock for one lookup and one
//! `Arc` clone, and copies the document outside the lock. A miss parses
//! outside any lock, then takes the write lock once to keep the result.
//! Lookups hash with the engine's keyed hash, so texts chosen to collide
//! cannot slow the map.
//!
//! Bounded by the bytes of query text kept (`http.document_cache_bytes`;
//! `0` turns the cache off). A text longer than a sixteenth of that is never
//! kept. When a new text would go over the bound, the whole map is emptied
//! and refills with what is sent next: a client cycling through many
//! distinct texts costs parsing, as it would without the cache, never
//! memory. A text that does not parse is not kept (async-graphql parses it
//! again and reports the error).

use crate::hash::KeyedHashBuilder;
use async_graphql::parser::{parse_query, types::ExecutableDocument};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The parsed documents of the query texts seen so far (bounded).
pub(crate) struct Documents {
    table: RwLock<Table>,
    max_bytes: usize,
}

struct Table {
    docs: HashMap<Box<str>, Arc<ExecutableDocument>, KeyedHashBuilder>,
    /// Bytes of query text kept.
    bytes: usize,
}

impl Documents {
    /// Keeps at most `max_bytes` of query text; `0`: keeps nothing.
    pub(crate) fn new(max_bytes: usize, hasher: KeyedHashBuilder) -> Self {
        Self {
            table: RwLock::new(Table {
                docs: HashMap::with_hasher(hasher),
                bytes: 0,
            }),
            max_bytes,
        }
    }

    /// Whether anything is ever kept.
    pub(crate) fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// `query` parsed: a copy of the kept document, or parsed now (and kept
    /// if it fits). `None` when the text does not parse.
    pub(crate) fn parse(&self, query: &str) -> Option<ExecutableDocument> {
        let kept = self.read().docs.get(query).cloned();
        if let Some(doc) = kept {
            return Some((*doc).clone());
        }
        let doc = parse_query(query).ok()?;
        if self.enabled() && query.len() <= self.max_bytes / 16 {
            self.keep(query, &doc);
        }
        Some(doc)
    }

    fn keep(&self, query: &str, doc: &ExecutableDocument) {
        let mut table = self.write();
        if table.docs.contains_key(query) {
            return;
        }
        if table.bytes + query.len() > self.max_bytes {
            table.docs.clear();
            table.bytes = 0;
        }
        table.docs.insert(query.into(), Arc::new(doc.clone()));
        table.bytes += query.len();
    }

    /// Texts kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.read().docs.len()
    }

    /// Bytes of query text kept now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.read().bytes
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        // Every write section leaves the table whole: a poisoned lock is still consistent.
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documents(max_bytes: usize) -> Documents {
        Documents::new(max_bytes, KeyedHashBuilder::new())
    }

    fn same(a: &ExecutableDocument, b: &ExecutableDocument) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    #[test]
    fn a_kept_document_is_the_parse_of_its_text() {
        let docs = documents(1 << 16);
        let query = "query Q($n: Int) { a(first: $n) { b ...F } } fragment F on T { c }";
        let first = docs.parse(query).expect("parses");
        assert_eq!(docs.len(), 1);
        let again = docs.parse(query).expect("kept");
        assert_eq!(docs.len(), 1, "the same text is kept once");
        assert!(same(&first, &again));
        assert!(same(&again, &parse_query(query).unwrap()));
    }

    #[test]
    fn texts_that_do_not_parse_are_not_kept() {
        let docs = documents(1 << 16);
        assert!(docs.parse("{ a { ").is_none());
        assert_eq!(docs.len(), 0);
    }

    #[test]
    fn zero_bytes_keeps_nothing_but_still_parses() {
        let docs = documents(0);
        assert!(!docs.enabled());
        assert!(docs.parse("{ a }").is_some());
        assert_eq!(docs.len(), 0);
    }

    #[test]
    fn long_texts_are_never_kept() {
        let docs = documents(1600);
        let long = format!("{{ a {} }}", "b ".repeat(60)); // > 1600 / 16 bytes
        assert!(docs.parse(&long).is_some());
        assert_eq!(docs.len(), 0);
        assert!(docs.parse("{ a }").is_some());
        assert_eq!(docs.len(), 1);
    }

    #[test]
    fn the_kept_bytes_never_pass_the_bound() {
        let max = 1600;
        let docs = documents(max);
        for i in 0..1000 {
            let query = format!("{{ field{i} }}");
            assert!(docs.parse(&query).is_some());
            assert!(docs.bytes() <= max, "{} bytes kept", docs.bytes());
            assert!(docs.len() >= 1, "the newest text is kept");
        }
        // Emptied and refilled: the newest texts are there.
        let before = docs.len();
        docs.parse("{ field999 }");
        assert_eq!(docs.len(), before, "the newest text is a hit");
    }
}
