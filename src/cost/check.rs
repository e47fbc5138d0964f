//! The checks of the cost directives: at schema build, that what they name
//! exists; per operation, `requireOneSlicingArgument`.

use super::schema_types::{DirectiveError, SchemaTypes};
use super::table::{CostTable, Multiplier};
use crate::error::OperationError;
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::{Name, Positioned, Variables};
use std::collections::HashSet;

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
    let Some(op) = crate::document::guard::operation(doc, operation_name) else {
        return Ok(());
    };
    let Some(root) = types.root(op.ty) else {
        return Ok(());
    };
    // A non-null variable set to null fails coercion (BAD_USER_INPUT,
    // async-graphql's), which comes before validation of what it sizes.
    let coercion_fails = op.variable_definitions.iter().any(|def| {
        !def.node.var_type.node.nullable
            && matches!(
                variables.get(&def.node.name.node),
                Some(async_graphql::Value::Null)
            )
    });
    if coercion_fails {
        return Ok(());
    }
    let vars = |name: &Name| super::slicing::variable(variables, op, name);
    let mut check = Check {
        costs,
        types,
        doc,
        vars: &vars,
        seen: HashSet::new(),
    };
    check.set(&op.selection_set, root)
}

struct Check<'a> {
    costs: Option<&'a CostTable>,
    types: &'a SchemaTypes,
    doc: &'a ExecutableDocument,
    vars: &'a dyn Fn(&Name) -> Option<async_graphql::Value>,
    /// The fragments already checked.
    seen: HashSet<&'a Name>,
}

impl<'a> Check<'a> {
    fn set(&mut self, set: &'a Positioned<SelectionSet>, ty: &str) -> Result<(), OperationError> {
        for item in &set.node.items {
            match &item.node {
                Selection::Field(field) => {
                    let name = &field.node.name.node;
                    let Some(info) = self.types.field(ty, name) else {
                        continue;
                    };
                    let table = self.costs.and_then(|costs| costs.get(ty, name));
                    if let Some(Multiplier::Slicing(slicing)) =
                        table.or(info.declared.as_ref()).map(|cost| &cost.times)
                    {
                        let given = super::slicing::given(
                            slicing,
                            &field.node,
                            info,
                            self.types,
                            self.vars,
                        );
                        if slicing.require_one && !slicing.paths.is_empty() && given.len() != 1 {
                            let message = format!(
                                "`{ty}.{name}` takes exactly one of its slicing arguments ({}); {} given",
                                slicing.paths.join(", "),
                                given.len()
                            );
                            let at = vec![field.pos];
                            return Err(OperationError::ValidationFailed { message, at });
                        }
                    }
                    self.set(&field.node.selection_set, &info.named)?;
                }
                Selection::InlineFragment(fragment) => {
                    let on = fragment
                        .node
                        .type_condition
                        .as_ref()
                        .map_or(ty, |c| c.node.on.node.as_str());
                    self.set(&fragment.node.selection_set, on)?;
                }
                Selection::FragmentSpread(spread) => {
                    let name = &spread.node.fragment_name.node;
                    let Some(def) = self.doc.fragments.get(name) else {
                        continue;
                    };
                    if self.seen.insert(name) {
                        let on = def.node.type_condition.node.on.node.as_str();
                        self.set(&def.node.selection_set, on)?;
                    }
                }
            }
        }
        Ok(())
    }
}
