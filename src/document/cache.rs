//! Parsed documents, kept per distinct query text.
//!
//! Clients send the same few query texts again and again: a page's queries,
//! the operations an Apollo Client batching link sends together. Parsing one
//! is the largest single step of serving it — for the benchmark's five-read
//! query, about 165,000 instructions, more than async-graphql's validation
//! and the engine's whole read path put together — and its result depends on
//! the text alone. So the engine keeps the parsed document of each text it
//! has seen — one table per engine, used by
//! [`FanoutGraphQL`](crate::FanoutGraphQL) and by the
//! [`FanoutExtension`](crate::FanoutExtension) — with what is known of it
//! (`memo.rs`: the guard's verdict, async-graphql's validations), and hands
//! async-graphql a copy (`Request::set_parsed_query`: async-graphql takes
//! the document and cuts the operation it runs out of it) once the
//! operation is admitted; async-graphql then checks its depth, validates it
//! against the schema (or the extension answers with the validation kept)
//! and runs it exactly as if it had parsed the text itself. Pricing (the
//! cost preview) walks the kept document itself.
//!
//! How it works: one `std::sync::RwLock` around a map from the text to an
//! `Arc` of its entry ([`Kept`]: the text, shared, and the document). A hit
//! takes the read lock for one lookup and one `Arc` clone. A miss parses
//! outside any lock, then takes the write lock once to keep the result.
//! Lookups hash with the engine's keyed hash, so texts chosen to collide
//! cannot slow the map.
//!
//! Bounded by memory (`http.document_cache_bytes` per engine; `0` turns the
//! cache off): each kept entry is weighed as its text, its document's heap
//! (estimated by [`weight`] from the document's shape; a parsed document
//! takes about 50–130 times its text), the room its validations may take
//! (`memo::reserve`), the `Arc`s around it and its slot in the map. A document heavier than a sixteenth of the
//! bound is never kept.
//! When a new entry would go over the bound, the whole map is emptied (and
//! freed outside the lock) and refills with what is sent next: a client
//! cycling through many distinct texts costs parsing, as it would without
//! the cache, never memory. A text that does not parse is not kept
//! (async-graphql parses it again and reports the error).

use crate::document::guard::Shape;
use crate::document::memo::{reserve, Kept};
use crate::error::OperationError;
use crate::metrics::DocumentMetrics;
use crate::seed::random_state;
use async_graphql::parser::types::{
    BaseType, Directive, DocumentOperations, ExecutableDocument, OperationDefinition, Selection,
    SelectionSet, Type,
};
use async_graphql::parser::{parse_query, Error as ParseError, Positioned};
use async_graphql::Name;
use async_graphql_value::{ConstValue, Value};
use foldhash::fast::SeedableRandomState;
use std::collections::HashMap;
use std::mem::size_of;
use std::sync::OnceLock;
use std::sync::{Arc, RwLock};

/// The parsed documents of the query texts seen so far (bounded).
pub(crate) struct Documents {
    table: RwLock<Table>,
    max_bytes: usize,
    /// Registered on first use (after the application's recorder is up).
    metrics: OnceLock<DocumentMetrics>,
}

struct Table {
    docs: HashMap<Arc<str>, Arc<Kept>, SeedableRandomState>,
    /// The kept entries' weight (see the module docs).
    bytes: usize,
}

/// What an entry weighs besides its text, its document's heap and its
/// validations' room: the `Arc` around the entry (two counters and the
/// entry itself), the `Arc` around the text (two counters), and the entry's
/// slot in the map (key, value, control byte).
const ENTRY_OVERHEAD: usize = 2 * size_of::<usize>()
    + size_of::<Kept>()
    + 2 * size_of::<usize>()
    + size_of::<(Arc<str>, Arc<Kept>)>()
    + 1;

/// A text's document, as [`admit`] found it: kept (with what is known of
/// it) or parsed for this request alone.
pub(crate) enum Parsed {
    /// Kept for the text: shared, copied only for async-graphql.
    Kept(Arc<Kept>),
    /// Parsed now and not kept (too large, or the cache is off).
    Fresh(ExecutableDocument),
}

impl Parsed {
    /// The document.
    pub(crate) fn doc(&self) -> &ExecutableDocument {
        match self {
            Parsed::Kept(kept) => &kept.doc,
            Parsed::Fresh(doc) => doc,
        }
    }

    /// The document for async-graphql, which takes it: the kept one copied.
    pub(crate) fn into_owned(self) -> ExecutableDocument {
        match self {
            Parsed::Kept(kept) => kept.doc.clone(),
            Parsed::Fresh(doc) => doc,
        }
    }

    /// The entry kept for the text, if there is one.
    pub(crate) fn kept(&self) -> Option<&Arc<Kept>> {
        match self {
            Parsed::Kept(kept) => Some(kept),
            Parsed::Fresh(_) => None,
        }
    }
}

/// `query` as async-graphql may be given it: kept or parsed, and checked by
/// the document guard (its verdict kept with a kept document). A text that
/// does not parse is `GRAPHQL_PARSE_FAILED`, a cycle or an oversized
/// expansion `GRAPHQL_VALIDATION_FAILED`; either way nothing has run.
pub(crate) fn admit(
    documents: &Documents,
    query: &str,
    max_selections: u64,
) -> Result<(Parsed, Arc<Shape>), OperationError> {
    let parsed = documents
        .parse(query)
        .map_err(|err| OperationError::ParseFailed {
            message: err.to_string(),
            at: err.positions().collect(),
        })?;
    let shape = match &parsed {
        Parsed::Kept(kept) => kept.verdict(max_selections)?,
        Parsed::Fresh(doc) => Arc::new(crate::document::guard::check(doc, max_selections)?),
    };
    Ok((parsed, shape))
}

/// The walk of [`weight`] stops this deep. async-graphql's parser refuses
/// selections nested past 64 levels, so only a document built by hand can
/// reach it; such a document is not weighed (and not kept).
const MAX_KEPT_DEPTH: usize = 256;

impl Documents {
    /// Keeps entries weighing at most `max_bytes` in all; `0`: keeps nothing.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            table: RwLock::new(Table {
                docs: HashMap::with_hasher(random_state()),
                bytes: 0,
            }),
            max_bytes,
            metrics: OnceLock::new(),
        }
    }

    fn metrics(&self) -> &DocumentMetrics {
        self.metrics.get_or_init(DocumentMetrics::new)
    }

    /// Whether anything is ever kept.
    pub(crate) fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// `query` parsed: the kept entry, or parsed now (and kept if it fits),
    /// or why the text does not parse.
    pub(crate) fn parse(&self, query: &str) -> Result<Parsed, ParseError> {
        let kept = self.read().docs.get(query).cloned();
        if let Some(kept) = kept {
            self.metrics().from_cache.increment(1);
            return Ok(Parsed::Kept(kept));
        }
        let doc = parse_query(query)?;
        self.metrics().parsed.increment(1);
        if self.enabled() && query.len() <= self.max_bytes / 16 {
            if let Some(weight) = weight(&doc) {
                let entry = query.len() + weight + reserve(&doc) + ENTRY_OVERHEAD;
                if entry <= self.max_bytes / 16 {
                    let kept = Arc::new(Kept::new(query.into(), doc));
                    // (Another request may have kept the text meanwhile:
                    // this one runs on its own entry, which is as good.)
                    self.keep(kept.clone(), entry);
                    return Ok(Parsed::Kept(kept));
                }
            }
        }
        Ok(Parsed::Fresh(doc))
    }

    /// Keeps `kept` for its text; an emptied map is freed outside the write
    /// lock.
    fn keep(&self, kept: Arc<Kept>, entry: usize) {
        let emptied = {
            let mut table = self.write();
            if table.docs.contains_key(&*kept.text) {
                return;
            }
            let metrics = self.metrics();
            let emptied = if table.bytes + entry > self.max_bytes {
                metrics.kept_bytes.decrement(table.bytes as f64);
                table.bytes = 0;
                Some(std::mem::replace(
                    &mut table.docs,
                    HashMap::with_hasher(random_state()),
                ))
            } else {
                None
            };
            table.docs.insert(kept.text.clone(), kept);
            table.bytes += entry;
            // By difference: several engines in one process share the gauge.
            metrics.kept_bytes.increment(entry as f64);
            emptied
        };
        drop(emptied);
    }

    /// Texts kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.read().docs.len()
    }

    /// The kept entries' weight now.
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

impl Drop for Documents {
    fn drop(&mut self) {
        let bytes = self.read().bytes;
        if let Some(metrics) = self.metrics.get() {
            metrics.kept_bytes.decrement(bytes as f64);
        }
    }
}

/// The heap bytes a parsed document holds, estimated from its shape: the
/// elements of every vector and map (at their capacity), and every name's
/// and string's bytes. `None` when its selections nest deeper than 256
/// levels (the walk is bounded; the parser stops at 64, so only a document
/// built by hand goes deeper; such a document is not kept).
///
/// Public so that operators can size `http.document_cache_bytes` for their
/// queries:
///
/// ```
/// let doc = async_graphql::parser::parse_query("{ repositories(first: 20) { name } }").unwrap();
/// let bytes = fanout_budget::cost::document_weight(&doc).unwrap();
/// assert!(bytes > 0);
/// ```
pub fn weight(doc: &ExecutableDocument) -> Option<usize> {
    let mut w = Weigher { bytes: 0 };
    match &doc.operations {
        DocumentOperations::Single(op) => w.operation(&op.node)?,
        DocumentOperations::Multiple(ops) => {
            w.map::<Name, Positioned<OperationDefinition>>(ops.capacity());
            for (name, op) in ops {
                w.name(name);
                w.operation(&op.node)?;
            }
        }
    }
    w.map::<Name, Positioned<async_graphql::parser::types::FragmentDefinition>>(
        doc.fragments.capacity(),
    );
    for (name, fragment) in &doc.fragments {
        w.name(name);
        w.name(&fragment.node.type_condition.node.on.node);
        w.directives(&fragment.node.directives);
        w.selection_set(&fragment.node.selection_set.node, 0)?;
    }
    Some(w.bytes)
}

struct Weigher {
    bytes: usize,
}

// `&Vec` throughout: a vector's capacity is what it holds on the heap.
#[allow(clippy::ptr_arg)]
impl Weigher {
    fn vec<T>(&mut self, v: &Vec<T>) {
        self.bytes += v.capacity() * size_of::<T>();
    }

    /// A hash map's buckets (≥ its capacity) and one control byte each.
    fn map<K, V>(&mut self, capacity: usize) {
        self.bytes += capacity * (size_of::<(K, V)>() + 1);
    }

    /// A `Name` is an `Arc<str>`: two counters and the bytes.
    fn name(&mut self, name: &Name) {
        self.bytes += 2 * size_of::<usize>() + name.len();
    }

    fn operation(&mut self, op: &OperationDefinition) -> Option<()> {
        let vars = &op.variable_definitions;
        self.vec(vars);
        for var in vars {
            self.name(&var.node.name.node);
            self.ty(&var.node.var_type.node);
            self.directives(&var.node.directives);
            if let Some(value) = &var.node.default_value {
                self.const_value(&value.node);
            }
        }
        self.directives(&op.directives);
        self.selection_set(&op.selection_set.node, 0)
    }

    fn selection_set(&mut self, set: &SelectionSet, depth: usize) -> Option<()> {
        if depth > MAX_KEPT_DEPTH {
            return None;
        }
        self.vec(&set.items);
        for item in &set.items {
            match &item.node {
                Selection::Field(field) => {
                    let field = &field.node;
                    if let Some(alias) = &field.alias {
                        self.name(&alias.node);
                    }
                    self.name(&field.name.node);
                    self.arguments(&field.arguments);
                    self.directives(&field.directives);
                    self.selection_set(&field.selection_set.node, depth + 1)?;
                }
                Selection::FragmentSpread(spread) => {
                    self.name(&spread.node.fragment_name.node);
                    self.directives(&spread.node.directives);
                }
                Selection::InlineFragment(inline) => {
                    if let Some(on) = &inline.node.type_condition {
                        self.name(&on.node.on.node);
                    }
                    self.directives(&inline.node.directives);
                    self.selection_set(&inline.node.selection_set.node, depth + 1)?;
                }
            }
        }
        Some(())
    }

    fn arguments(&mut self, args: &Vec<(Positioned<Name>, Positioned<Value>)>) {
        self.vec(args);
        for (name, value) in args {
            self.name(&name.node);
            self.value(&value.node);
        }
    }

    fn directives(&mut self, directives: &Vec<Positioned<Directive>>) {
        self.vec(directives);
        for directive in directives {
            self.name(&directive.node.name.node);
            let args = &directive.node.arguments;
            self.arguments(args);
        }
    }

    fn ty(&mut self, ty: &Type) {
        match &ty.base {
            BaseType::Named(name) => self.name(name),
            BaseType::List(inner) => {
                self.bytes += size_of::<Type>();
                self.ty(inner);
            }
        }
    }

    /// An `IndexMap` entry: the pair, its hash, and an index in the table.
    fn object<V>(&mut self, capacity: usize) {
        self.bytes += capacity * (size_of::<(Name, V)>() + 2 * size_of::<usize>() + 1);
    }

    // Values nest only as deep as their text (bounded by the kept text's
    // size), and the parser itself recursed as deep to build them.
    fn value(&mut self, value: &Value) {
        match value {
            Value::Variable(name) | Value::Enum(name) => self.name(name),
            Value::String(s) => self.bytes += s.capacity(),
            Value::Binary(b) => self.bytes += b.len(),
            Value::List(items) => {
                self.vec(items);
                items.iter().for_each(|v| self.value(v));
            }
            Value::Object(map) => {
                self.object::<Value>(map.capacity());
                for (k, v) in map {
                    self.name(k);
                    self.value(v);
                }
            }
            Value::Null | Value::Number(_) | Value::Boolean(_) => {}
        }
    }

    fn const_value(&mut self, value: &ConstValue) {
        match value {
            ConstValue::Enum(name) => self.name(name),
            ConstValue::String(s) => self.bytes += s.capacity(),
            ConstValue::Binary(b) => self.bytes += b.len(),
            ConstValue::List(items) => {
                self.vec(items);
                items.iter().for_each(|v| self.const_value(v));
            }
            ConstValue::Object(map) => {
                self.object::<ConstValue>(map.capacity());
                for (k, v) in map {
                    self.name(k);
                    self.const_value(v);
                }
            }
            ConstValue::Null | ConstValue::Number(_) | ConstValue::Boolean(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documents(max_bytes: usize) -> Documents {
        Documents::new(max_bytes)
    }

    fn same(a: &ExecutableDocument, b: &ExecutableDocument) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    /// An entry's weight, as the cache counts it.
    fn entry(query: &str) -> usize {
        let doc = parse_query(query).unwrap();
        query.len() + weight(&doc).unwrap() + reserve(&doc) + ENTRY_OVERHEAD
    }

    #[test]
    fn a_kept_document_is_the_parse_of_its_text() {
        let query = "query Q($n: Int) { a(first: $n) { b ...F } } fragment F on T { c }";
        let docs = documents(16 * entry(query));
        let Parsed::Kept(first) = docs.parse(query).expect("parses") else {
            panic!("kept")
        };
        assert_eq!(docs.len(), 1);
        assert_eq!(docs.bytes(), entry(query));
        let Parsed::Kept(again) = docs.parse(query).expect("kept") else {
            panic!("kept")
        };
        assert!(Arc::ptr_eq(&first, &again), "a hit is the entry itself");
        assert_eq!(docs.len(), 1, "the same text is kept once");
        assert_eq!(docs.bytes(), entry(query));
        assert_eq!(&*again.text, query);
        assert!(same(&again.doc, &parse_query(query).unwrap()));
        assert!(same(&Parsed::Kept(again).into_owned(), &first.doc));
    }

    #[test]
    fn the_guard_verdict_is_kept_for_its_bound() {
        let query = "{ a { b c } d }";
        let docs = documents(1 << 20);
        let (_, shape) = admit(&docs, query, 100).expect("admitted");
        assert_eq!(shape.selections, 4);
        let (_, again) = admit(&docs, query, 100).expect("admitted");
        assert!(Arc::ptr_eq(&shape, &again), "the verdict is found once");
        // Another bound is another verdict, never the kept one.
        assert!(admit(&docs, query, 3).is_err());
        let (_, wider) = admit(&docs, query, 4).expect("admitted");
        assert!(!Arc::ptr_eq(&shape, &wider));
        let cycle = "{ ...A } fragment A on Q { ...A }";
        assert!(admit(&docs, cycle, 100).is_err());
        assert!(admit(&docs, cycle, 100).is_err(), "a refusal is kept too");
    }

    #[test]
    fn texts_that_do_not_parse_are_not_kept() {
        let docs = documents(1 << 20);
        assert!(docs.parse("{ a { ").is_err());
        assert_eq!(docs.len(), 0);
    }

    #[test]
    fn zero_bytes_keeps_nothing_but_still_parses() {
        let docs = documents(0);
        assert!(!docs.enabled());
        assert!(docs.parse("{ a }").is_ok());
        assert_eq!(docs.len(), 0);
    }

    #[test]
    fn an_entry_over_a_sixteenth_of_the_bound_is_never_kept() {
        let small = "{ a }";
        let large = format!("{{ a {} }}", "b ".repeat(60));
        let docs = documents(16 * entry(small));
        assert!(entry(&large) > 16 * entry(small) / 16);
        assert!(docs.parse(&large).is_ok());
        assert_eq!(docs.len(), 0);
        assert!(docs.parse(small).is_ok());
        assert_eq!(docs.len(), 1);
    }

    #[test]
    fn the_kept_weight_never_passes_the_bound() {
        let max = 40 * entry("{ field0 }");
        let docs = documents(max);
        let mut emptied = 0;
        for i in 0..1000 {
            let query = format!("{{ field{i} }}");
            let before = docs.len();
            assert!(docs.parse(&query).is_ok());
            assert!(
                docs.bytes() <= max,
                "{} bytes kept, bound {max}",
                docs.bytes()
            );
            if docs.len() <= before {
                emptied += 1;
                assert_eq!(docs.len(), 1, "emptied, then the newest text kept");
            }
        }
        assert!(emptied >= 20, "the table was emptied {emptied} times");
        // The newest text is a hit: nothing changes.
        let (len, bytes) = (docs.len(), docs.bytes());
        docs.parse("{ field999 }").expect("parses");
        assert_eq!((docs.len(), docs.bytes()), (len, bytes));
    }
}
