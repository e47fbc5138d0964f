//! The checks of the cost directives: at schema build, that what they name
//! exists; per operation, `requireOneSlicingArgument`.

use super::estimate::PricedField;
use super::formula::{names_a_variable, At, Leaf};
use super::schema_types::{DirectiveError, SchemaTypes};
use super::table::{CostTable, Multiplier, Slicing};
use crate::error::OperationError;
use async_graphql::parser::types::{
    ExecutableDocument, Field, OperationDefinition, Selection, SelectionSet,
};
use async_graphql::{Name, Pos, Positioned, Variables};
use std::collections::HashSet;
use std::mem::size_of;

/// Checks the cost directives of the schema `sdl` describes
/// (`Schema::sdl()`): each argument of the right type (`weight` a whole
/// number of reads, `assumedSize` a non-negative Int), each slicing argument
/// an argument of its field (a path such as `filter.max` through the fields
/// of its input objects), each sized field a field of the type the field
/// returns. The HTTP integration (`FanoutGraphQL::new`) makes the same check
/// and refuses to build on a problem.
pub fn check_schema(sdl: &str) -> Result<(), DirectiveError> {
    if let Err(e) = async_graphql::parser::parse_schema(sdl) {
        return Err(DirectiveError {
            problems: vec![format!("the SDL does not parse: {e}")],
        });
    }
    let types = SchemaTypes::read_sdl(sdl);
    match types.problems.is_empty() {
        true => Ok(()),
        false => Err(DirectiveError {
            problems: types.problems.clone(),
        }),
    }
}

/// `@listSize(requireOneSlicingArgument: true)` (its default): each such
/// field of the operation that would run — in `doc`, the one named
/// `operation_name` or the only one — is given exactly one of its slicing
/// arguments (one with a default counts as given unless set to null).
/// Otherwise a `GRAPHQL_VALIDATION_FAILED` error at the field. A field
/// `costs` prices is the table's: its directives are not checked.
pub(crate) fn require_one_slicing_argument(
    costs: Option<&CostTable>,
    types: &SchemaTypes,
    doc: &ExecutableDocument,
    variables: &Variables,
    operation_name: Option<&str>,
) -> Result<(), OperationError> {
    #[cfg(test)]
    WALKS.with(|walks| walks.set(walks.get() + 1));
    let Some(op) = to_check(doc, operation_name, variables) else {
        return Ok(());
    };
    let Some(root) = types.root(op.ty) else {
        return Ok(());
    };
    let vars = |name: &Name| super::slicing::variable(variables, op, name);
    Check::new(costs, types, doc, &vars, None).set(&op.selection_set, root)
}

#[cfg(test)]
thread_local! {
    /// The slicing checks walked on this thread.
    pub(super) static WALKS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The operation of `doc` named `operation_name` (or the only one), whose
/// slicing arguments are checked for `variables`; `None` when there is no
/// such operation, or when a non-null variable set to null fails coercion
/// (BAD_USER_INPUT, async-graphql's), which comes before validation of what
/// it sizes.
fn to_check<'d>(
    doc: &'d ExecutableDocument,
    operation_name: Option<&str>,
    variables: &Variables,
) -> Option<&'d OperationDefinition> {
    let op = crate::document::guard::operation(doc, operation_name)?;
    let coercion_fails = op.variable_definitions.iter().any(|def| {
        !def.node.var_type.node.nullable
            && matches!(
                variables.get(&def.node.name.node),
                Some(async_graphql::Value::Null)
            )
    });
    (!coercion_fails).then_some(op)
}

/// [`require_one_slicing_argument`] done once per document, operation and
/// schema: the verdict of every field whose slicing arguments name no
/// variable is the document's and the schema's, found at compile time; the
/// fields whose arguments name one — all the verdict depends on the request
/// for, with the coercion of a non-null variable set to null — are checked
/// per request, in the walk's order.
#[derive(Debug)]
pub(crate) struct SlicingCheck {
    /// The fields checked per request, in the walk's order, up to the
    /// first that fails whatever the variables.
    leaves: Box<[Leaf]>,
    /// That field's error, answered when none of `leaves` fails.
    fails: Option<OperationError>,
}

impl SlicingCheck {
    /// Compiles the check of the operation `operation_name` of `doc`.
    pub(crate) fn compile(
        costs: Option<&CostTable>,
        types: &SchemaTypes,
        doc: &ExecutableDocument,
        operation_name: Option<&str>,
    ) -> Self {
        let mut leaves = Vec::new();
        let fails = match crate::document::guard::operation(doc, operation_name)
            .and_then(|op| Some((op, types.root(op.ty)?)))
        {
            None => None,
            Some((op, root)) => {
                let mut check = Check::new(costs, types, doc, &|_| None, Some(&mut leaves));
                check.set(&op.selection_set, root).err()
            }
        };
        SlicingCheck {
            leaves: leaves.into(),
            fails,
        }
    }

    /// What [`require_one_slicing_argument`] answers for `variables`, with
    /// the document, operation, costs and types it was compiled for.
    pub(crate) fn check(
        &self,
        costs: Option<&CostTable>,
        types: &SchemaTypes,
        doc: &ExecutableDocument,
        variables: &Variables,
        operation_name: Option<&str>,
    ) -> Result<(), OperationError> {
        if self.leaves.is_empty() && self.fails.is_none() {
            return Ok(());
        }
        let Some(op) = to_check(doc, operation_name, variables) else {
            return Ok(());
        };
        let vars = |name: &Name| super::slicing::variable(variables, op, name);
        for leaf in self.leaves.iter() {
            let Some(field) = leaf.field(doc, &op.selection_set) else {
                continue;
            };
            let name = &field.node.name.node;
            if let Some(priced) = PricedField::of(costs, types, &leaf.ty, name) {
                one_given(&leaf.ty, field, &priced, types, &vars)?;
            }
        }
        self.fails.clone().map_or(Ok(()), Err)
    }

    /// The heap it takes.
    pub(crate) fn heap(&self) -> usize {
        let fails = self.fails.as_ref().map_or(0, |e| match e {
            OperationError::ValidationFailed { message, at } => {
                message.len() + at.len() * size_of::<Pos>()
            }
            _ => 0,
        });
        self.leaves.iter().map(Leaf::heap).sum::<usize>() + fails
    }
}

/// The slicing arguments a field takes exactly one of, if it must.
fn required<'p>(priced: &PricedField<'p>) -> Option<&'p Slicing> {
    match priced.cost.map(|cost| &cost.times) {
        Some(Multiplier::Slicing(slicing)) if slicing.require_one && !slicing.paths.is_empty() => {
            Some(slicing)
        }
        _ => None,
    }
}

/// `requireOneSlicingArgument` for `field` of type `ty`.
fn one_given(
    ty: &str,
    field: &Positioned<Field>,
    priced: &PricedField<'_>,
    types: &SchemaTypes,
    vars: &dyn Fn(&Name) -> Option<async_graphql::Value>,
) -> Result<(), OperationError> {
    let Some(slicing) = required(priced) else {
        return Ok(());
    };
    let given = super::slicing::given(slicing, &field.node, priced.info, types, vars);
    if given.len() == 1 {
        return Ok(());
    }
    let message = format!(
        "`{ty}.{}` takes exactly one of its slicing arguments ({}); {} given",
        field.node.name.node,
        slicing.paths.join(", "),
        given.len()
    );
    let at = vec![field.pos];
    Err(OperationError::ValidationFailed { message, at })
}

/// The walk of [`require_one_slicing_argument`]; compiling
/// ([`SlicingCheck::compile`]) when it has `leaves` to note the fields whose
/// slicing arguments name a variable in, which it then leaves unchecked.
struct Check<'a, 'l> {
    costs: Option<&'a CostTable>,
    types: &'a SchemaTypes,
    doc: &'a ExecutableDocument,
    vars: &'a dyn Fn(&Name) -> Option<async_graphql::Value>,
    /// The fragments already checked.
    seen: HashSet<&'a Name>,
    leaves: Option<&'l mut Vec<Leaf>>,
    /// The place of the item checked, when compiling.
    at: At,
}

impl<'a, 'l> Check<'a, 'l> {
    fn new(
        costs: Option<&'a CostTable>,
        types: &'a SchemaTypes,
        doc: &'a ExecutableDocument,
        vars: &'a dyn Fn(&Name) -> Option<async_graphql::Value>,
        leaves: Option<&'l mut Vec<Leaf>>,
    ) -> Self {
        Check {
            costs,
            types,
            doc,
            vars,
            seen: HashSet::new(),
            leaves,
            at: At {
                root: None,
                path: Vec::new(),
            },
        }
    }

    fn set(&mut self, set: &'a Positioned<SelectionSet>, ty: &str) -> Result<(), OperationError> {
        for (i, item) in set.node.items.iter().enumerate() {
            self.at.path.push(i as u32);
            self.item(item, ty)?;
            self.at.path.pop();
        }
        Ok(())
    }

    fn item(&mut self, item: &'a Positioned<Selection>, ty: &str) -> Result<(), OperationError> {
        match &item.node {
            Selection::Field(field) => {
                let name = &field.node.name.node;
                let Some(priced) = PricedField::of(self.costs, self.types, ty, name) else {
                    return Ok(());
                };
                match self.leaves.as_mut() {
                    Some(leaves)
                        if required(&priced).is_some() && names_a_variable(&field.node) =>
                    {
                        leaves.push(Leaf::new(ty, &self.at));
                    }
                    _ => one_given(ty, field, &priced, self.types, self.vars)?,
                }
                self.set(&field.node.selection_set, &priced.info.named)
            }
            Selection::InlineFragment(fragment) => {
                let on = fragment
                    .node
                    .type_condition
                    .as_ref()
                    .map_or(ty, |c| c.node.on.node.as_str());
                self.set(&fragment.node.selection_set, on)
            }
            Selection::FragmentSpread(spread) => {
                let name = &spread.node.fragment_name.node;
                let Some(def) = self.doc.fragments.get(name) else {
                    return Ok(());
                };
                if !self.seen.insert(name) {
                    return Ok(());
                }
                let on = def.node.type_condition.node.on.node.as_str();
                // A fragment's places start at its own selection.
                let inside = At {
                    root: Some(name.clone()),
                    path: Vec::new(),
                };
                let outside = std::mem::replace(&mut self.at, inside);
                let checked = self.set(&def.node.selection_set, on);
                self.at = outside;
                checked
            }
        }
    }
}
