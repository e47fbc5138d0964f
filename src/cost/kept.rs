//! What the cost checks keep per document: for a kept document (the
//! document cache's), the estimate's formula (`formula.rs`) and
//! `requireOneSlicingArgument`'s check (`check.rs`), compiled the first time
//! the document is priced, for one operation, cost table and schema types
//! (the first it is asked for), then answered per request from the
//! request's variables. Any other operation, table or types is walked.
//!
//! The first sight is compiled and answered from what it compiled: one walk
//! (the compile), not a walk to price and another to compile. A formula or
//! check over [`MAX_FORMULA_BYTES`] of heap together is not kept: its part is
//! walked per request.

use super::check::{require_one_slicing_argument, SlicingCheck};
use super::estimate::estimate;
use super::formula::{compile, Compiled};
use super::schema_types::SchemaTypes;
use super::table::{CostTable, Stamp};
use crate::document::guard::Shape;
use crate::document::memo::{Kept, MAX_FORMULA_BYTES};
use crate::error::OperationError;
use async_graphql::{Name, Variables};

/// What a kept document keeps, compiled for one operation, cost table (or
/// none) and schema types.
pub(super) struct KeptCost {
    costs: Option<Stamp>,
    types: Stamp,
    /// The operation selected, as the document names it.
    operation: Option<Name>,
    /// The estimate's formula, when there is a table and it is small enough.
    formula: Option<Compiled>,
    /// `requireOneSlicingArgument`'s check, when small enough.
    slicing: Option<SlicingCheck>,
}

/// What `kept` keeps for `costs`, `types` and `operation_name`: compiled the
/// first time; `None` when what it keeps is for others (or the document
/// defines no operation so named: it keeps nothing then).
fn kept_for<'k>(
    kept: &'k Kept,
    costs: Option<&CostTable>,
    types: &SchemaTypes,
    shape: &Shape,
    operation_name: Option<&str>,
) -> Option<&'k KeptCost> {
    let found = if kept.has_cost() {
        kept.cost(|| None::<KeptCost>)
    } else {
        let doc = &kept.doc;
        let operation = match operation_name {
            None => None,
            Some(name) => Some(
                doc.operations
                    .iter()
                    .find_map(|(op, _)| op.filter(|op| op.as_str() == name))?
                    .clone(),
            ),
        };
        kept.cost(|| {
            let formula = costs.and_then(|costs| {
                compile(costs, types, doc, shape, operation_name, MAX_FORMULA_BYTES)
            });
            let room = MAX_FORMULA_BYTES - formula.as_ref().map_or(0, Compiled::heap);
            let slicing = SlicingCheck::compile(costs, types, doc, operation_name);
            Some(KeptCost {
                costs: costs.map(|c| c.id),
                types: types.id,
                operation,
                formula,
                slicing: (slicing.heap() <= room).then_some(slicing),
            })
        })
    };
    found.and_then(Option::as_ref).filter(|k| {
        k.costs == costs.map(|c| c.id)
            && k.types == types.id
            && k.operation.as_deref() == operation_name
    })
}

/// [`estimate`] for a kept document: from its formula when one is
/// kept for these `costs`, `types` and `operation_name` (compiled now if
/// none is kept yet); else walked.
pub(crate) fn estimate_kept(
    kept: &Kept,
    costs: &CostTable,
    types: &SchemaTypes,
    shape: &Shape,
    variables: &Variables,
    operation_name: Option<&str>,
) -> u64 {
    let doc = &kept.doc;
    match kept_for(kept, Some(costs), types, shape, operation_name).and_then(|k| k.formula.as_ref())
    {
        Some(formula) => formula.price(costs, types, doc, variables, operation_name),
        None => estimate(costs, types, doc, shape, variables, operation_name),
    }
}

/// [`require_one_slicing_argument`] for a kept document: from its
/// kept check when one is kept for these `costs`, `types` and
/// `operation_name` (compiled now if none is kept yet); else walked.
pub(crate) fn require_one_kept(
    kept: &Kept,
    costs: Option<&CostTable>,
    types: &SchemaTypes,
    shape: &Shape,
    variables: &Variables,
    operation_name: Option<&str>,
) -> Result<(), OperationError> {
    let doc = &kept.doc;
    match kept_for(kept, costs, types, shape, operation_name).and_then(|k| k.slicing.as_ref()) {
        Some(check) => check.check(costs, types, doc, variables, operation_name),
        None => require_one_slicing_argument(costs, types, doc, variables, operation_name),
    }
}
