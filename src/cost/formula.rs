//! The estimate compiled: the walk of [`super::estimate`] done once per
//! document, operation and schema, into a formula of its saturating sums and
//! products whose only unknowns are the list sizes that read a variable.
//! Priced per request from the request's variables (the first sight of a
//! document included: `kept.rs`), it answers what the walk would: the walk
//! stays the reference (documents not kept, formulas too large to keep, and
//! the property test in `formula_tests.rs`).
//!
//! A list size whose arguments name no variable is found at compile time
//! (the schema's defaults and the literals are the document's and the
//! schema's); one that names a variable — defined by the operation or not,
//! since [`super::slicing`] reads any — stays a leaf, which finds its field
//! again in the kept document by its place and sizes it as the walk does.
//! Sums and products of known terms are folded, so a document without
//! variable list sizes compiles to a constant.

use super::estimate::{times_of, PricedField};
use super::table::CostTable;
use crate::cost::schema_types::SchemaTypes;
use crate::document::guard::Shape;
use async_graphql::parser::types::{ExecutableDocument, Field, Selection, SelectionSet};
use async_graphql::{Name, Positioned, Value, Variables};
use async_graphql_value::Value as Input;
use std::collections::HashMap;
use std::mem::size_of;

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

/// Where a field whose figure reads a variable is, and on which type.
#[derive(Clone, Debug)]
pub(super) struct Leaf {
    pub(super) ty: Box<str>,
    /// `None`: the operation's selection; else the fragment so named.
    root: Option<Name>,
    /// The item's index in each selection set, from the root down.
    path: Box<[u32]>,
}

impl Leaf {
    /// The leaf of the item `at` is on, of type `ty`.
    pub(super) fn new(ty: &str, at: &At) -> Self {
        Leaf {
            ty: ty.into(),
            root: at.root.clone(),
            path: at.path.as_slice().into(),
        }
    }

    /// The field at this place of `doc`, whose operation selects `op_set`.
    pub(super) fn field<'d>(
        &self,
        doc: &'d ExecutableDocument,
        op_set: &'d Positioned<SelectionSet>,
    ) -> Option<&'d Positioned<Field>> {
        let mut set = match &self.root {
            None => op_set,
            Some(name) => &doc.fragments.get(name)?.node.selection_set,
        };
        let (last, path) = self.path.split_last()?;
        for i in path {
            set = match &set.node.items.get(*i as usize)?.node {
                Selection::Field(field) => &field.node.selection_set,
                Selection::InlineFragment(fragment) => &fragment.node.selection_set,
                Selection::FragmentSpread(_) => return None,
            };
        }
        match &set.node.items.get(*last as usize)?.node {
            Selection::Field(field) => Some(field),
            _ => None,
        }
    }

    /// The heap it takes.
    pub(super) fn heap(&self) -> usize {
        size_of::<Leaf>() + self.ty.len() + self.path.len() * size_of::<u32>()
    }
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
    let compiled = Compiled {
        fragments: c.compiled.into(),
        root,
    };
    (compiled.heap() <= max_bytes).then_some(compiled)
}

impl Compiled {
    /// The heap it takes.
    pub(super) fn heap(&self) -> usize {
        self.fragments
            .iter()
            .chain([&self.root])
            .map(heap)
            .sum::<usize>()
            + self.fragments.len() * size_of::<Formula>()
    }

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
        let field = &leaf.field(self.doc, self.op_set)?.node;
        let priced = PricedField::of(Some(self.costs), self.types, &leaf.ty, &field.name.node)?;
        let cost = priced.cost?;
        Some(times_of(
            &cost.times,
            field,
            priced.info,
            self.types,
            self.vars,
        ))
    }
}

/// The place of the selection being compiled.
pub(super) struct At {
    pub(super) root: Option<Name>,
    pub(super) path: Vec<u32>,
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
        let Some(priced) = PricedField::of(Some(self.costs), self.types, ty, &field.name.node)
        else {
            return Formula::Const(0);
        };
        let (info, cost) = (priced.info, priced.cost);
        let times = match cost {
            None => Formula::Const(1),
            Some(_) if names_a_variable(field) => self.leaf(ty, at),
            // No variable: the walk's figure, whatever the request.
            Some(cost) => Formula::Const(times_of(&cost.times, field, info, self.types, &|_| None)),
        };
        let reads = priced.reads(made);
        let nested = if field.selection_set.node.items.is_empty() {
            Formula::Const(0)
        } else {
            let mut child = priced.provides();
            let set = &field.selection_set;
            match priced.sized() {
                names if !names.is_empty() => {
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
        Formula::Times(Box::new(Leaf::new(ty, at)))
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
        Formula::Times(leaf) => leaf.heap(),
    }
}

/// Whether any of `field`'s arguments names a variable, defined by the
/// operation or not.
pub(super) fn names_a_variable(field: &Field) -> bool {
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
