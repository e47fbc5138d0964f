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
//!
//! The costs are declared in a [`CostTable`], or in the schema itself with
//! the IBM GraphQL Cost Directives `@cost(weight:)` and `@listSize` (and the
//! engine's own `@fanoutShared` / `@fanoutProvides`): see [`directives`].
//! Where both price a field, the table wins. An engine prices operations
//! once it has a table: `CostTable::new()` when the directives say it all.

mod check;
pub mod directives;
mod estimate;
mod formula;
mod kept;
pub(crate) mod schema_types;
mod slicing;
mod table;

pub use crate::document::cache::weight as document_weight;
pub use check::check_schema;
pub(crate) use check::require_one_slicing_argument;
pub(crate) use estimate::estimate;
pub(crate) use kept::{estimate_kept, require_one_kept};
pub use schema_types::DirectiveError;
pub use table::{CostTable, FieldCost};

#[cfg(test)]
mod formula_tests;
#[cfg(test)]
mod kept_tests;
#[cfg(test)]
mod tests;
