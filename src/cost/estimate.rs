//! The estimate: an operation's worst case, walked once with the schema's
//! types (see the module docs of `cost`).

use super::table::{CostTable, FieldCost, Multiplier};
use crate::cost::schema_types::{FieldInfo, SchemaTypes};
use crate::document::guard::Shape;
use async_graphql::parser::types::{
    ExecutableDocument, Field, OperationDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Positioned, Value, Variables};
use std::collections::HashMap;

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
    #[cfg(test)]
    WALKS.with(|walks| walks.set(walks.get() + 1));
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
        let price = walk.selection(&def.selection_set, on, &mut Vec::new(), None);
        walk.fragments.insert(name, price);
    }
    walk.selection(&op.selection_set, root, &mut Vec::new(), None)
}

#[cfg(test)]
thread_local! {
    /// The estimates walked on this thread.
    pub(super) static WALKS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The fields of an object a list's size applies to (`@listSize(sizedFields:)`),
/// and that size.
type Sized<'a> = Option<(&'a [String], u64)>;

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
    /// `sized`: which of its fields are multiplied, and by what (a fragment
    /// spread here is multiplied whole: still an upper bound).
    fn selection<'s>(
        &'s self,
        set: &Positioned<SelectionSet>,
        ty: &str,
        made: &mut Vec<&'s str>,
        sized: Sized<'_>,
    ) -> u64 {
        let mut total = 0u64;
        for item in &set.node.items {
            let cost = match &item.node {
                Selection::Field(field) => {
                    let field = &field.node;
                    let Some(priced) =
                        PricedField::of(Some(self.costs), self.types, ty, &field.name.node)
                    else {
                        continue;
                    };
                    let (info, cost) = (priced.info, priced.cost);
                    let times = cost.map_or(1, |cost| self.times(&cost.times, field, info));
                    let reads = priced.reads(made);
                    let nested = if field.selection_set.node.items.is_empty() {
                        0
                    } else {
                        let mut child = priced.provides();
                        let set = &field.selection_set;
                        match priced.sized() {
                            // A connection: `times` sizes its `nodes`/`edges`.
                            names if !names.is_empty() => {
                                let sized = Some((names, times));
                                self.selection(set, &info.named, &mut child, sized)
                            }
                            _ => times.saturating_mul(self.selection(
                                set,
                                &info.named,
                                &mut child,
                                None,
                            )),
                        }
                    };
                    let own = reads.saturating_add(nested);
                    match sized {
                        Some((names, m)) if names.iter().any(|n| *n == field.name.node) => {
                            own.saturating_mul(m)
                        }
                        _ => own,
                    }
                }
                Selection::InlineFragment(fragment) => {
                    let fragment = &fragment.node;
                    let on = fragment
                        .type_condition
                        .as_ref()
                        .map_or(ty, |c| c.node.on.node.as_str());
                    // The same object: its shared reads carry on.
                    self.selection(&fragment.selection_set, on, made, sized)
                }
                Selection::FragmentSpread(spread) => self
                    .fragments
                    .get(&spread.node.fragment_name.node)
                    .copied()
                    .unwrap_or(0)
                    .saturating_mul(sized.map_or(1, |(_, m)| m)),
            };
            total = total.saturating_add(cost);
        }
        total
    }

    /// How many times a field's sub-selection may be resolved.
    fn times(&self, times: &Multiplier, field: &Field, info: &FieldInfo) -> u64 {
        times_of(times, field, info, self.types, &|name| self.variable(name))
    }

    /// A variable's value: the request's, else the operation's default.
    fn variable(&self, name: &Name) -> Option<Value> {
        super::slicing::variable(self.variables, self.op, name)
    }
}

/// A field as the walk prices it: its schema's description and the cost
/// declared for it — the table's, which wins over the schema's directives.
pub(super) struct PricedField<'a> {
    pub(super) info: &'a FieldInfo,
    pub(super) cost: Option<&'a FieldCost>,
}

impl<'a> PricedField<'a> {
    /// The field `name` of type `ty`; `None` when the schema has no such field.
    pub(super) fn of(
        costs: Option<&'a CostTable>,
        types: &'a SchemaTypes,
        ty: &str,
        name: &str,
    ) -> Option<Self> {
        let info = types.field(ty, name)?;
        let cost = costs
            .and_then(|c| c.get(ty, name))
            .or(info.declared.as_ref());
        Some(PricedField { info, cost })
    }

    /// The field's own reads where its object has made the shared reads
    /// `made` already: 0 for a shared read made already, which it notes
    /// made otherwise.
    pub(super) fn reads(&self, made: &mut Vec<&'a str>) -> u64 {
        let Some(cost) = self.cost else { return 0 };
        match cost.shared.as_deref() {
            Some(key) if made.contains(&key) => 0,
            Some(key) => {
                made.push(key);
                cost.reads
            }
            None => cost.reads,
        }
    }

    /// The shared reads the object the field returns starts with: the one
    /// the field provides.
    pub(super) fn provides(&self) -> Vec<&'a str> {
        self.cost
            .and_then(|c| c.provides.as_deref())
            .into_iter()
            .collect()
    }

    /// The fields of the returned object its list size applies to; empty:
    /// the whole sub-selection.
    pub(super) fn sized(&self) -> &'a [String] {
        self.cost.map_or(&[], |c| c.sized.as_slice())
    }
}

/// How many times a field's sub-selection may be resolved: `times` with the
/// field's arguments, `vars` giving a variable's value (the request's, else
/// the operation's default). Called with no variable when none of the
/// field's arguments names one.
pub(super) fn times_of(
    times: &Multiplier,
    field: &Field,
    info: &FieldInfo,
    types: &SchemaTypes,
    vars: &dyn Fn(&Name) -> Option<Value>,
) -> u64 {
    let arg = match times {
        Multiplier::One => return 1,
        Multiplier::Fixed(n) => return *n,
        Multiplier::Arg(arg) | Multiplier::Len(arg) => arg,
        Multiplier::Slicing(slicing) => {
            return super::slicing::times(slicing, field, info, types, vars);
        }
    };
    let given = field.get_argument(arg).map(|v| {
        v.node
            .clone()
            .into_const_with(|name| vars(&name).ok_or(()))
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
