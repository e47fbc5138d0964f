//! The cost preview: an operation's worst-case upstream reads, before it runs.
//!
//! A schema declares, per `Type.field`, how many reads resolving that field
//! may send ([`FieldCost::reads`]) and how many times its sub-selection can be
//! resolved ([`FieldCost::times_arg`] for a list or connection sized by an
//! argument such as `first`, [`FieldCost::times`] for a fixed maximum). A
//! field that is not declared costs 0 and does not multiply.
//!
//! The estimate walks the parsed operation with the schema's types:
//!
//! ```text
//! cost(selection) = Σ fields f:  reads(f)  +  times(f) × cost(f.selection)
//! ```
//!
//! Fragments and inline fragments are all counted, `@skip`/`@include` are
//! ignored, and de-duplication is ignored: the figure is an upper bound,
//! pessimistic by design, so `actual ≤ requested` for every query whose lists
//! are bounded by their declared multipliers. Nothing is executed.

pub use crate::document::cache::weight as document_weight;
use crate::document::guard::Shape;
use crate::document::schema_types::{FieldInfo, SchemaTypes};
use async_graphql::parser::types::{
    ExecutableDocument, Field, OperationDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Positioned, Value, Variables};
use std::collections::HashMap;

/// What resolving one field may cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldCost {
    reads: u64,
    times: Multiplier,
    /// The read of its object this field's reads are, if shared.
    shared: Option<String>,
    /// The read of the object it returns this field's reads are.
    provides: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Multiplier {
    #[default]
    One,
    Fixed(u64),
    Arg(String),
    Len(String),
}

impl FieldCost {
    /// Resolving the field sends at most `reads` upstream reads.
    pub fn reads(reads: u64) -> Self {
        Self {
            reads,
            times: Multiplier::One,
            shared: None,
            provides: None,
        }
    }

    /// The field's reads are its object's read named `key` — one read
    /// however many fields of the object need it (a repository's tag list,
    /// needed by its `tags` and its `tag`): priced once per object, free when
    /// the field that returned the object [provides](Self::provides) it or an
    /// earlier field of the same object made it. (Inside a fragment, priced
    /// once for every place it is spread, it is counted again: the estimate
    /// stays an upper bound.)
    pub fn shared(mut self, key: &str) -> Self {
        self.shared = Some(key.to_string());
        self
    }

    /// The field's reads are the read named `key` of the object it returns
    /// (`repository(name)` reads the repository's tag list): that object's
    /// [`shared`](Self::shared) fields of `key` are then free.
    pub fn provides(mut self, key: &str) -> Self {
        self.provides = Some(key.to_string());
        self
    }

    /// The sub-selection is resolved once per item, and the number of items is
    /// the value of argument `arg` (its default when absent).
    pub fn times_arg(mut self, arg: &str) -> Self {
        self.times = Multiplier::Arg(arg.to_string());
        self
    }

    /// The sub-selection is resolved once per element of list argument
    /// `arg` (`items(ids: [1, 2, 3])`: 3 times, given inline or as a
    /// variable). Absent, it is the argument's numeric default, else 0: give
    /// a priced list argument no default list.
    pub fn times_len(mut self, arg: &str) -> Self {
        self.times = Multiplier::Len(arg.to_string());
        self
    }

    /// The sub-selection is resolved at most `n` times.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Multiplier::Fixed(n);
        self
    }
}

/// The declared costs of a schema's fields.
///
/// ```
/// use fanout_budget::{Config, Engine, cost::{CostTable, FieldCost}};
///
/// // `Query.repositories(first)` reads one page, then each row's sub-selection.
/// let costs = CostTable::new()
///     .field("Query", "repositories", FieldCost::reads(1).times_arg("first"))
///     .field("Repository", "manifest", FieldCost::reads(1));
/// assert_eq!(costs.get("Repository", "manifest"), Some(&FieldCost::reads(1)));
/// let engine = Engine::builder(Config::default()).costs(costs).build();
/// # drop(engine);
/// ```
#[derive(Clone, Debug, Default)]
pub struct CostTable {
    /// By type, then field (looked up with borrowed names).
    fields: HashMap<String, HashMap<String, FieldCost>>,
}

impl CostTable {
    /// An empty table: every field costs 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares the cost of `type_name.field`.
    pub fn field(mut self, type_name: &str, field: &str, cost: FieldCost) -> Self {
        self.fields
            .entry(type_name.to_string())
            .or_default()
            .insert(field.to_string(), cost);
        self
    }

    /// The declared cost of `type_name.field`, if any.
    pub fn get(&self, type_name: &str, field: &str) -> Option<&FieldCost> {
        self.fields.get(type_name)?.get(field)
    }
}

/// The worst-case reads of the operation that would run in `doc` — the one
/// named `operation_name`, or the only one — with the declared `costs` and
/// the schema's `types`. 0 when there is no such operation (validation then refuses it).
///
/// Linear in the document: `shape` (from [`crate::document::guard::check`]) orders the
/// fragments so that each is priced once, after the fragments it spreads,
/// and a spread adds its fragment's price. Pricing is linear in the
/// multiplier (`cost(s, m) = m × cost(s, 1)`), so a fragment's price at 1
/// serves wherever it is spread.
pub(crate) fn estimate(
    costs: &CostTable,
    types: &SchemaTypes,
    doc: &ExecutableDocument,
    shape: &Shape,
    variables: &Variables,
    operation_name: Option<&str>,
) -> u64 {
    let Some(op) = crate::document::guard::operation(doc, operation_name) else {
        return 0;
    };
    let Some(root) = types.root(op.ty) else {
        return 0;
    };
    let mut walk = Walk {
        costs,
        types,
        variables,
        op,
        fragments: HashMap::with_capacity(shape.order.len()),
    };
    for name in &shape.order {
        // (`shape` is this document's; a name it lacks is priced 0.)
        let Some(def) = doc.fragments.get(name) else {
            continue;
        };
        let def = &def.node;
        let on = &def.type_condition.node.on.node;
        let price = walk.selection(&def.selection_set, on, &mut Vec::new());
        walk.fragments.insert(name, price);
    }
    walk.selection(&op.selection_set, root, &mut Vec::new())
}

struct Walk<'a> {
    costs: &'a CostTable,
    types: &'a SchemaTypes,
    variables: &'a Variables,
    op: &'a OperationDefinition,
    /// Each fragment's price at multiplier 1, once priced.
    fragments: HashMap<&'a Name, u64>,
}

impl Walk<'_> {
    /// The price of `set` on type `ty`, at multiplier 1. Recursion follows
    /// nested selection sets only (at most 64 deep, the parser's limit),
    /// never a spread.
    ///
    /// `made`: the shared reads ([`FieldCost::shared`]) this object already
    /// has — from the field that returned it, then from its earlier fields.
    fn selection<'s>(
        &'s self,
        set: &Positioned<SelectionSet>,
        ty: &str,
        made: &mut Vec<&'s str>,
    ) -> u64 {
        let mut total = 0u64;
        for item in &set.node.items {
            let cost = match &item.node {
                Selection::Field(field) => {
                    let field = &field.node;
                    let Some(info) = self.types.field(ty, &field.name.node) else {
                        continue;
                    };
                    let cost = self.costs.get(ty, &field.name.node);
                    let shared = cost.and_then(|c| c.shared.as_deref());
                    let provides = cost.and_then(|c| c.provides.as_deref());
                    let (reads, times) = match cost {
                        None => (0, 1),
                        Some(cost) => {
                            let made_already = shared.is_some_and(|key| made.contains(&key));
                            let reads = if made_already { 0 } else { cost.reads };
                            (reads, self.times(&cost.times, field, info))
                        }
                    };
                    if let Some(key) = shared.filter(|key| !made.contains(key)) {
                        made.push(key);
                    }
                    let nested = if field.selection_set.node.items.is_empty() {
                        0
                    } else {
                        // The object this field returns has what it provides.
                        let mut child: Vec<&str> = provides.into_iter().collect();
                        self.selection(&field.selection_set, &info.named, &mut child)
                    };
                    reads.saturating_add(times.saturating_mul(nested))
                }
                Selection::InlineFragment(fragment) => {
                    let fragment = &fragment.node;
                    let on = fragment
                        .type_condition
                        .as_ref()
                        .map_or(ty, |c| c.node.on.node.as_str());
                    // The same object: its shared reads carry on.
                    self.selection(&fragment.selection_set, on, made)
                }
                Selection::FragmentSpread(spread) => self
                    .fragments
                    .get(&spread.node.fragment_name.node)
                    .copied()
                    .unwrap_or(0),
            };
            total = total.saturating_add(cost);
        }
        total
    }

    /// How many times a field's sub-selection may be resolved.
    fn times(&self, times: &Multiplier, field: &Field, info: &FieldInfo) -> u64 {
        let arg = match times {
            Multiplier::One => return 1,
            Multiplier::Fixed(n) => return *n,
            Multiplier::Arg(arg) | Multiplier::Len(arg) => arg,
        };
        let given = field.get_argument(arg).map(|v| {
            v.node
                .clone()
                .into_const_with(|name| self.variable(&name).ok_or(()))
                .ok()
        });
        let value = match given {
            Some(value) => value,
            // Absent: the argument's default in the schema.
            None => return info.default_of(arg).unwrap_or(0),
        };
        match value {
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            // A list argument counts its elements, whichever multiplier
            // names it: a list is never "0 items".
            Some(Value::List(items)) => items.len() as u64,
            _ => 0,
        }
    }

    /// A variable's value: the request's, else the operation's default.
    fn variable(&self, name: &Name) -> Option<Value> {
        if let Some(value) = self.variables.get(name) {
            return Some(value.clone());
        }
        self.op
            .variable_definitions
            .iter()
            .find(|def| def.node.name.node == *name)
            .and_then(|def| def.node.default_value.as_ref())
            .map(|default| default.node.clone())
    }
}
