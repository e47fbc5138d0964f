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
//! cost(selection, m) = Σ fields f:  m × reads(f)  +  cost(f.selection, m × times(f))
//! ```
//!
//! Fragments and inline fragments are all counted, `@skip`/`@include` are
//! ignored, and de-duplication is ignored: the figure is an upper bound,
//! pessimistic by design, so `actual ≤ requested` for every query whose lists
//! are bounded by their declared multipliers. Nothing is executed.

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, OperationType, Selection,
    SelectionSet,
};
use async_graphql::registry::{MetaTypeName, Registry};
use async_graphql::{Name, Positioned, Value, Variables};
use std::collections::HashMap;

/// What resolving one field may cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldCost {
    reads: u64,
    times: Multiplier,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Multiplier {
    #[default]
    One,
    Fixed(u64),
    Arg(String),
}

impl FieldCost {
    /// Resolving the field sends at most `reads` upstream reads.
    pub fn reads(reads: u64) -> Self {
        Self {
            reads,
            times: Multiplier::One,
        }
    }

    /// The sub-selection is resolved once per item, and the number of items is
    /// the value of argument `arg` (its default when absent).
    pub fn times_arg(mut self, arg: &str) -> Self {
        self.times = Multiplier::Arg(arg.to_string());
        self
    }

    /// The sub-selection is resolved at most `n` times.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Multiplier::Fixed(n);
        self
    }
}

/// The declared costs of a schema's fields.
#[derive(Clone, Debug, Default)]
pub struct CostTable {
    fields: HashMap<(String, String), FieldCost>,
}

/// Fragment nesting deeper than this is not followed (the operation is then
/// invalid anyway, and validation rejects it before anything runs).
const MAX_DEPTH: usize = 64;

impl CostTable {
    /// An empty table: every field costs 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares the cost of `type_name.field`.
    pub fn field(mut self, type_name: &str, field: &str, cost: FieldCost) -> Self {
        self.fields
            .insert((type_name.to_string(), field.to_string()), cost);
        self
    }

    /// The worst-case reads of each operation in `doc`, by operation name
    /// (`None` for the anonymous operation).
    pub fn estimate_operations(
        &self,
        registry: &Registry,
        doc: &ExecutableDocument,
        variables: &Variables,
    ) -> HashMap<Option<Name>, u64> {
        let root = |ty: OperationType| match ty {
            OperationType::Query => Some(registry.query_type.as_str()),
            OperationType::Mutation => registry.mutation_type.as_deref(),
            OperationType::Subscription => registry.subscription_type.as_deref(),
        };
        let mut out = HashMap::new();
        match &doc.operations {
            DocumentOperations::Single(op) => {
                out.insert(
                    None,
                    self.operation(registry, doc, variables, &op.node, root),
                );
            }
            DocumentOperations::Multiple(ops) => {
                for (name, op) in ops {
                    let cost = self.operation(registry, doc, variables, &op.node, root);
                    out.insert(Some(name.clone()), cost);
                }
            }
        }
        out
    }

    fn operation<'r>(
        &self,
        registry: &Registry,
        doc: &ExecutableDocument,
        variables: &Variables,
        op: &OperationDefinition,
        root: impl Fn(OperationType) -> Option<&'r str>,
    ) -> u64 {
        // Variables the request left out take the operation's defaults.
        let mut variables = variables.clone();
        for def in &op.variable_definitions {
            let name = &def.node.name.node;
            if let (false, Some(default)) = (variables.contains_key(name), &def.node.default_value)
            {
                variables.insert(name.clone(), default.node.clone());
            }
        }
        let walk = Walk {
            table: self,
            registry,
            doc,
            variables: &variables,
        };
        root(op.ty).map_or(0, |ty| walk.selection(&op.selection_set, ty, 1, 0))
    }

    /// The worst-case reads of the operation that would run: the one named
    /// `operation_name`, or the only one.
    pub fn estimate(
        &self,
        registry: &Registry,
        doc: &ExecutableDocument,
        variables: &Variables,
        operation_name: Option<&str>,
    ) -> u64 {
        let all = self.estimate_operations(registry, doc, variables);
        match operation_name {
            Some(name) => all.get(&Some(Name::new(name))).copied(),
            None => (all.len() == 1)
                .then(|| all.values().copied().next())
                .flatten(),
        }
        .unwrap_or(0)
    }
}

struct Walk<'a> {
    table: &'a CostTable,
    registry: &'a Registry,
    doc: &'a ExecutableDocument,
    variables: &'a Variables,
}

impl Walk<'_> {
    fn selection(&self, set: &Positioned<SelectionSet>, ty: &str, m: u64, depth: usize) -> u64 {
        if depth > MAX_DEPTH {
            return 0;
        }
        let mut total = 0u64;
        for item in &set.node.items {
            let cost = match &item.node {
                Selection::Field(field) => {
                    let field = &field.node;
                    let Some(meta) = self
                        .registry
                        .concrete_type_by_name(ty)
                        .and_then(|t| t.field_by_name(&field.name.node))
                    else {
                        continue;
                    };
                    let declared = self.table.fields.get(&(ty.to_string(), meta.name.clone()));
                    let (reads, times) = match declared {
                        None => (0, 1),
                        Some(cost) => (cost.reads, self.times(&cost.times, field, meta)),
                    };
                    let child_ty = MetaTypeName::concrete_typename(&meta.ty);
                    m.saturating_mul(reads).saturating_add(self.selection(
                        &field.selection_set,
                        child_ty,
                        m.saturating_mul(times),
                        depth + 1,
                    ))
                }
                Selection::InlineFragment(fragment) => {
                    let fragment = &fragment.node;
                    let on = fragment
                        .type_condition
                        .as_ref()
                        .map_or(ty, |c| c.node.on.node.as_str());
                    self.selection(&fragment.selection_set, on, m, depth + 1)
                }
                Selection::FragmentSpread(spread) => {
                    match self.doc.fragments.get(&spread.node.fragment_name.node) {
                        Some(def) => {
                            let on = def.node.type_condition.node.on.node.as_str();
                            self.selection(&def.node.selection_set, on, m, depth + 1)
                        }
                        None => 0,
                    }
                }
            };
            total = total.saturating_add(cost);
        }
        total
    }

    fn times(
        &self,
        times: &Multiplier,
        field: &async_graphql::parser::types::Field,
        meta: &async_graphql::registry::MetaField,
    ) -> u64 {
        match times {
            Multiplier::One => 1,
            Multiplier::Fixed(n) => *n,
            Multiplier::Arg(arg) => {
                let given = field.get_argument(arg).and_then(|v| {
                    v.node
                        .clone()
                        .into_const_with(|name| self.variables.get(&name).cloned().ok_or(()))
                        .ok()
                });
                let value = given.or_else(|| {
                    let default = meta.args.get(arg)?.default_value.as_deref()?;
                    default.parse::<u64>().ok().map(Value::from)
                });
                match value {
                    Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
                    _ => 0,
                }
            }
        }
    }
}
