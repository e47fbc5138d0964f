//! The estimate compiled: the walk of [`super::estimate`] done once per
//! document, operation and schema, into a formula of its saturating sums and
//! products whose only unknowns are the list sizes that read a variable.
//! Priced per request from the request's variables, it answers what the walk
//! would: the walk stays the reference (the first sight of a document, and
//! the property test in `formula_tests.rs`).
//!
//! A list size whose arguments name no variable is found at compile time
//! (the schema's defaults and the literals are the document's and the
//! schema's); one that names a variable — defined by the operation or not,
//! since [`super::slicing`] reads any — stays a leaf, which finds its field
//! again in the kept document by its place and sizes it as the walk does.
//! Sums and products of known terms are folded, so a document without
//! variable list sizes compiles to a constant.

use super::estimate::times_of;
use super::table::CostTable;
use super::table::Stamp;
use crate::cost::schema_types::SchemaTypes;
use crate::document::guard::Shape;
use crate::document::memo::{Kept, MAX_FORMULA_BYTES};
use async_graphql::parser::types::{ExecutableDocument, Field, Selection, SelectionSet};
use async_graphql::{Name, Positioned, Value, Variables};
use async_graphql_value::Value as Input;
use std::collections::HashMap;
use std::mem::size_of;

/// What a kept document keeps: the formula compiled for one operation, costs
/// and schema types (the first it was priced for), or that it was too large.
struct Priced {
    costs: Stamp,
    types: Stamp,
    /// The operation selected, as the document names it.
    operation: Option<Name>,
    compiled: Option<Compiled>,
}

/// The estimate of a kept document: from its formula when one is kept for
/// these `costs`, `types` and `operation_name`; else walked, and the first
/// time compiled and kept.
pub(crate) fn estimate_kept(
    kept: &Kept,
    costs: &CostTable,
    types: &SchemaTypes,
    shape: &Shape,
    variables: &Variables,
    operation_name: Option<&str>,
) -> u64 {
    let doc = &kept.doc;
    let fits = |p: &Priced| {
        p.costs == costs.id && p.types == types.id && p.operation.as_deref() == operation_name
    };
    if kept.has_formula() {
        let priced = kept.formula(|| None::<Priced>).and_then(Option::as_ref);
        if let Some(compiled) = priced.filter(|p| fits(p)).and_then(|p| p.compiled.as_ref()) {
            return compiled.price(costs, types, doc, variables, operation_name);
        }
    } else {
        // An operation name the document does not define keeps nothing.
        let operation = match operation_name {
            None => Some(None),
            Some(name) => doc
                .operations
                .iter()
                .find_map(|(op, _)| op.filter(|op| op.as_str() == name))
                .map(|op| Some(op.clone())),
        };
        if let Some(operation) = operation {
            kept.formula(|| {
                Some(Priced {
                    costs: costs.id,
                    types: types.id,
                    operation,
                    compiled: compile(costs, types, doc, shape, operation_name, MAX_FORMULA_BYTES),
                })
            });
        }
    }
    super::estimate(costs, types, doc, shape, variables, operation_name)
}

/// An operation's estimate as a function of the request's variables.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// The fragments that are not constant, in the order they are priced.
    fragments: Box<[Formula]>,
    root: Formula,
}

#[derive(Clone, Debug)]
enum Formula {
    Const(u64),
    /// A saturating sum.
    Add(Box<[Formula]>),
    /// A saturating product.
    Mul(Box<(Formula, Formula)>),
    /// A list size that reads a variable.
    Times(Box<Leaf>),
    /// A fragment's price at multiplier 1 (an index in `Compiled::fragments`).
    Fragment(usize),
}

/// Where a field whose list size reads a variable is, and on which type.
#[derive(Clone, Debug)]
struct Leaf {
    ty: Box<str>,
    /// `None`: the operation's selection; else the fragment so named.
    root: Option<Name>,
    /// The item's index in each selection set, from the root down.
    path: Box<[u32]>,
}

/// Compiles the estimate of the operation `operation_name` of `doc` (see
/// [`super::estimate`], whose walk this follows step for step); `None` when
/// the formula would take more than `max_bytes` of heap.
pub(crate) fn compile(
    costs: &CostTable,
    types: &SchemaTypes,
    doc: &ExecutableDocument,
    shape: &Shape,
    operation_name: Option<&str>,
    max_bytes: usize,
) -> Option<Compiled> {
    let empty = || Compiled {
        fragments: Box::new([]),
        root: Formula::Const(0),
    };
    let Some(op) = crate::document::guard::operation(doc, operation_name) else {
        return Some(empty());
    };
    let Some(root) = types.root(op.ty) else {
        return Some(empty());
    };
    let mut c = Compile {
        costs,
        types,
        fragments: HashMap::with_capacity(shape.order.len()),
        compiled: Vec::new(),
    };
    for name in &shape.order {
        let Some(def) = doc.fragments.get(name) else {
            continue;
        };
        let def = &def.node;
        let on = &def.type_condition.node.on.node;
        let mut at = At {
            root: Some(name.clone()),
            path: Vec::new(),
        };
        let price = c.selection(&def.selection_set, on, &mut Vec::new(), None, &mut at);
        let price = match price {
            Formula::Const(_) => price,
            _ => {
                c.compiled.push(price);
                Formula::Fragment(c.compiled.len() - 1)
            }
        };
        c.fragments.insert(name, price);
    }
    let mut at = At {
        root: None,
        path: Vec::new(),
    };
    let root = c.selection(&op.selection_set, root, &mut Vec::new(), None, &mut at);
    let heap: usize = c.compiled.iter().chain([&root]).map(heap).sum::<usize>()
        + c.compiled.len() * size_of::<Formula>();
    (heap <= max_bytes).then(|| Compiled {
        fragments: c.compiled.into(),
        root,
    })
}

impl Compiled {
    /// The estimate for `variables`: what [`super::estimate`] answers for
    /// the document, operation, costs and types it was compiled for.
    pub(crate) fn price(
        &self,
        costs: &CostTable,
        types: &SchemaTypes,
        doc: &ExecutableDocument,
        variables: &Variables,
        operation_name: Option<&str>,
    ) -> u64 {
        if let Formula::Const(n) = self.root {
            return n;
        }
        let Some(op) = crate::document::guard::operation(doc, operation_name) else {
            return 0;
        };
        let eval = Eval {
            costs,
            types,
            doc,
            vars: &|name| super::slicing::variable(variables, op, name),
            op_set: &op.selection_set,
        };
        let mut fragments = Vec::with_capacity(self.fragments.len());
        for fragment in self.fragments.iter() {
            let price = eval.formula(fragment, &fragments);
            fragments.push(price);
        }
        eval.formula(&self.root, &fragments)
    }
}

struct Eval<'a> {
    costs: &'a CostTable,
    types: &'a SchemaTypes,
    doc: &'a ExecutableDocument,
    vars: &'a dyn Fn(&Name) -> Option<Value>,
    op_set: &'a Positioned<SelectionSet>,
}

impl Eval<'_> {
    fn formula(&self, f: &Formula, fragments: &[u64]) -> u64 {
        match f {
            Formula::Const(n) => *n,
            Formula::Add(terms) => terms.iter().fold(0u64, |sum, t| {
                sum.saturating_add(self.formula(t, fragments))
            }),
            Formula::Mul(pair) => self
                .formula(&pair.0, fragments)
                .saturating_mul(self.formula(&pair.1, fragments)),
            Formula::Times(leaf) => self.times(leaf).unwrap_or(0),
            Formula::Fragment(i) => fragments.get(*i).copied().unwrap_or(0),
        }
    }

    /// The list size at `leaf`, as the walk finds it.
    fn times(&self, leaf: &Leaf) -> Option<u64> {
        let mut set = match &leaf.root {
            None => self.op_set,
            Some(name) => &self.doc.fragments.get(name)?.node.selection_set,
        };
        let (last, path) = leaf.path.split_last()?;
        for i in path {
            set = match &set.node.items.get(*i as usize)?.node {
                Selection::Field(field) => &field.node.selection_set,
                Selection::InlineFragment(fragment) => &fragment.node.selection_set,
                Selection::FragmentSpread(_) => return None,
            };
        }
        let Selection::Field(field) = &set.node.items.get(*last as usize)?.node else {
            return None;
        };
        let field = &field.node;
        let info = self.types.field(&leaf.ty, &field.name.node)?;
        let cost = self
            .costs
            .get(&leaf.ty, &field.name.node)
            .or(info.declared.as_ref())?;
        Some(times_of(&cost.times, field, info, self.types, self.vars))
    }
}

/// The place of the selection being compiled.
struct At {
    root: Option<Name>,
    path: Vec<u32>,
}

struct Compile<'a> {
    costs: &'a CostTable,
    types: &'a SchemaTypes,
    /// Each fragment's price at multiplier 1, once compiled.
    fragments: HashMap<&'a Name, Formula>,
    /// The fragments that are not constant.
    compiled: Vec<Formula>,
}

/// As the walk's: the fields a list's size applies to, and that size.
type Sized<'a> = Option<(&'a [String], &'a Formula)>;

impl<'a> Compile<'a> {
    /// [`super::estimate`]'s `Walk::selection`, a formula for its figure.
    fn selection(
        &mut self,
        set: &'a Positioned<SelectionSet>,
        ty: &str,
        made: &mut Vec<&'a str>,
        sized: Sized<'_>,
        at: &mut At,
    ) -> Formula {
        let mut terms = Vec::new();
        for (i, item) in set.node.items.iter().enumerate() {
            at.path.push(i as u32);
            let cost = match &item.node {
                Selection::Field(field) => self.field(&field.node, ty, made, sized, at),
                Selection::InlineFragment(fragment) => {
                    let fragment = &fragment.node;
                    let on = fragment
                        .type_condition
                        .as_ref()
                        .map_or(ty, |c| c.node.on.node.as_str());
                    self.selection(&fragment.selection_set, on, made, sized, at)
                }
                Selection::FragmentSpread(spread) => {
                    let price = self
                        .fragments
                        .get(&spread.node.fragment_name.node)
                        .cloned()
                        .unwrap_or(Formula::Const(0));
                    let m = sized.map_or(Formula::Const(1), |(_, m)| m.clone());
                    self.mul(price, m)
                }
            };
            at.path.pop();
            terms.push(cost);
        }
        self.add(terms)
    }

    fn field(
        &mut self,
        field: &'a Field,
        ty: &str,
        made: &mut Vec<&'a str>,
        sized: Sized<'_>,
        at: &mut At,
    ) -> Formula {
        let Some(info) = self.types.field(ty, &field.name.node) else {
            return Formula::Const(0);
        };
        let cost = self
            .costs
            .get(ty, &field.name.node)
            .or(info.declared.as_ref());
        let shared = cost.and_then(|c| c.shared.as_deref());
        let provides = cost.and_then(|c| c.provides.as_deref());
        let (reads, times) = match cost {
            None => (0, Formula::Const(1)),
            Some(cost) => {
                let made_already = shared.is_some_and(|key| made.contains(&key));
                let reads = if made_already { 0 } else { cost.reads };
                let times = if names_a_variable(field) {
                    self.leaf(ty, at)
                } else {
                    // No variable: the walk's figure, whatever the request.
                    Formula::Const(times_of(&cost.times, field, info, self.types, &|_| None))
                };
                (reads, times)
            }
        };
        if let Some(key) = shared.filter(|key| !made.contains(key)) {
            made.push(key);
        }
        let nested = if field.selection_set.node.items.is_empty() {
            Formula::Const(0)
        } else {
            let mut child: Vec<&str> = provides.into_iter().collect();
            let set = &field.selection_set;
            match cost.map(|c| c.sized.as_slice()) {
                Some(names) if !names.is_empty() => {
                    self.selection(set, &info.named, &mut child, Some((names, &times)), at)
                }
                _ => {
                    let inner = self.selection(set, &info.named, &mut child, None, at);
                    self.mul(times, inner)
                }
            }
        };
        let own = self.add(vec![Formula::Const(reads), nested]);
        match sized {
            Some((names, m)) if names.iter().any(|n| *n == field.name.node) => {
                self.mul(own, m.clone())
            }
            _ => own,
        }
    }

    fn leaf(&self, ty: &str, at: &At) -> Formula {
        Formula::Times(Box::new(Leaf {
            ty: ty.into(),
            root: at.root.clone(),
            path: at.path.as_slice().into(),
        }))
    }

    /// A saturating sum, its constant terms folded.
    fn add(&self, terms: Vec<Formula>) -> Formula {
        let mut constant = 0u64;
        let mut rest = Vec::new();
        for term in terms {
            match term {
                Formula::Const(n) => constant = constant.saturating_add(n),
                other => rest.push(other),
            }
        }
        if rest.is_empty() {
            return Formula::Const(constant);
        }
        if constant != 0 {
            rest.push(Formula::Const(constant));
        }
        if rest.len() == 1 {
            return rest.pop().unwrap_or(Formula::Const(0));
        }
        Formula::Add(rest.into())
    }

    /// A saturating product, folded when a factor is known.
    fn mul(&self, a: Formula, b: Formula) -> Formula {
        match (a, b) {
            (Formula::Const(x), Formula::Const(y)) => Formula::Const(x.saturating_mul(y)),
            (Formula::Const(0), _) | (_, Formula::Const(0)) => Formula::Const(0),
            (Formula::Const(1), f) | (f, Formula::Const(1)) => f,
            (a, b) => Formula::Mul(Box::new((a, b))),
        }
    }
}

/// The heap `f` takes.
fn heap(f: &Formula) -> usize {
    match f {
        Formula::Const(_) | Formula::Fragment(_) => 0,
        Formula::Add(terms) => {
            terms.len() * size_of::<Formula>() + terms.iter().map(heap).sum::<usize>()
        }
        Formula::Mul(pair) => size_of::<(Formula, Formula)>() + heap(&pair.0) + heap(&pair.1),
        Formula::Times(leaf) => {
            size_of::<Leaf>() + leaf.ty.len() + leaf.path.len() * size_of::<u32>()
        }
    }
}

/// Whether any of `field`'s arguments names a variable, defined by the
/// operation or not.
fn names_a_variable(field: &Field) -> bool {
    fn has(value: &Input) -> bool {
        match value {
            Input::Variable(_) => true,
            Input::List(items) => items.iter().any(has),
            Input::Object(fields) => fields.values().any(has),
            _ => false,
        }
    }
    field.arguments.iter().any(|(_, value)| has(&value.node))
}
