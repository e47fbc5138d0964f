//! The schema's shape, as the engine needs it after parsing an operation.
//!
//! Two things walk an operation against the schema's types: the cost preview
//! ([`crate::cost`], before the operation runs) and null propagation
//! ([`crate::graphql::nulls`], after it ran with errors). Both need, per object or
//! interface type and field: the field's declared type (`[Tag!]!`), the
//! named type under its wrappers (`Tag`), its arguments with their defaults,
//! and the cost its directives declare (`@cost`, `@listSize`: see
//! [`crate::cost::directives`]); and the input objects' fields, which a
//! slicing argument's path (`filter.max`) walks.
//!
//! [`SchemaTypes`] holds exactly that, nested by type then field name, so
//! the walks look fields up with borrowed `&str`s and allocate nothing per
//! field. It is built once per schema: from the schema's SDL when the HTTP
//! integration is created ([`SchemaTypes::from_sdl`]), or from async-graphql's
//! registry the first time the extension runs ([`SchemaTypes::from_registry`]).
//! The two sources describe the same schema and build the same value.

use super::table::{FieldCost, Multiplier};
use async_graphql::parser::types::{
    BaseType, ConstDirective, InputValueDefinition, Type, TypeKind, TypeSystemDefinition,
};
use async_graphql::registry::{MetaInputValue, MetaType, MetaTypeName, Registry};
use async_graphql::{Positioned, Value};
use std::collections::HashMap;

/// What the engine knows of a schema's types (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct SchemaTypes {
    query: String,
    mutation: Option<String>,
    subscription: Option<String>,
    types: HashMap<String, HashMap<String, FieldInfo>>,
    /// Input objects' fields, by type.
    pub(crate) inputs: HashMap<String, Vec<ArgInfo>>,
    /// What is wrong with the cost directives, if anything (see
    /// [`crate::cost::check_schema`]); a field whose directives are wrong
    /// declares no cost.
    pub(crate) problems: Vec<String>,
    /// Told apart from every other `SchemaTypes` built in the process: a
    /// compiled cost formula is kept for one.
    pub(crate) id: super::table::Stamp,
}

/// One field of an object or interface type.
#[derive(Debug)]
pub(crate) struct FieldInfo {
    /// The declared type, e.g. `[Tag!]!`.
    pub(crate) ty: String,
    /// The named type under the list and non-null wrappers, e.g. `Tag`.
    pub(crate) named: String,
    /// Its arguments.
    pub(crate) args: Vec<ArgInfo>,
    /// The cost its directives declare.
    pub(crate) declared: Option<FieldCost>,
}

/// An argument, or a field of an input object.
#[derive(Debug)]
pub(crate) struct ArgInfo {
    pub(crate) name: String,
    /// The named type under the wrappers.
    pub(crate) named: String,
    pub(crate) default: Option<Value>,
}

impl FieldInfo {
    /// The default of argument `name`, if it is a non-negative integer.
    pub(crate) fn default_of(&self, name: &str) -> Option<u64> {
        match self.arg(name)?.default.as_ref()? {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    /// Argument `name`.
    pub(crate) fn arg(&self, name: &str) -> Option<&ArgInfo> {
        self.args.iter().find(|arg| arg.name == name)
    }
}

impl SchemaTypes {
    /// From async-graphql's registry (what the extension sees).
    pub(crate) fn from_registry(registry: &Registry) -> Self {
        let mut out = Self {
            query: registry.query_type.clone(),
            mutation: registry.mutation_type.clone(),
            subscription: registry.subscription_type.clone(),
            ..Self::default()
        };
        for (type_name, ty) in &registry.types {
            let fields = match ty {
                MetaType::Object { fields, .. } | MetaType::Interface { fields, .. } => fields,
                MetaType::InputObject { input_fields, .. } => {
                    let fields = input_fields.values().map(meta_arg).collect();
                    out.inputs.insert(type_name.clone(), fields);
                    continue;
                }
                _ => continue,
            };
            let fields = fields
                .values()
                .map(|field| {
                    let at = format!("{type_name}.{}", field.name);
                    let directives = field.directive_invocations.iter().map(|d| {
                        let args = d.args.iter().map(|(name, value)| (name.as_str(), value));
                        (d.name.as_str(), args)
                    });
                    let info = FieldInfo {
                        named: MetaTypeName::concrete_typename(&field.ty).to_string(),
                        ty: field.ty.clone(),
                        args: field.args.values().map(meta_arg).collect(),
                        declared: out.declared(&at, directives),
                    };
                    (field.name.clone(), info)
                })
                .collect();
            out.types.insert(type_name.clone(), fields);
        }
        out.check();
        // Built while a request runs: a problem is told, and that field priced 0.
        for problem in &out.problems {
            tracing::error!(problem = %problem, "a cost directive is wrong");
        }
        out
    }

    /// The cost `directives` declare on field `at`, a problem noted.
    fn declared<'a, D, A>(&mut self, at: &str, directives: D) -> Option<FieldCost>
    where
        D: IntoIterator<Item = (&'a str, A)>,
        A: IntoIterator<Item = (&'a str, &'a Value)>,
    {
        super::directives::read(at, directives)
            .map_err(|problem| self.problems.push(problem))
            .ok()
            .flatten()
    }

    /// Notes what the declared costs name that the schema lacks.
    fn check(&mut self) {
        let mut problems = check_declared(self);
        problems.sort();
        self.problems.append(&mut problems);
    }

    /// Every field, by type then name.
    pub(crate) fn fields(&self) -> impl Iterator<Item = (&str, &str, &FieldInfo)> {
        self.types.iter().flat_map(|(ty, fields)| {
            fields
                .iter()
                .map(move |(name, info)| (ty.as_str(), name.as_str(), info))
        })
    }

    /// Whether `type_name` is an object or interface type.
    pub(crate) fn has_type(&self, type_name: &str) -> bool {
        self.types.contains_key(type_name)
    }

    /// From the schema's SDL (`Schema::sdl()`, what the HTTP integration
    /// sees). SDL that does not parse gives an empty value: nothing is
    /// priced and nothing repaired, and the schema still runs.
    ///
    /// # Panics
    /// When the schema's cost directives are wrong ([`crate::cost::check_schema`]
    /// says how): the integration is not built on a schema priced wrong.
    pub(crate) fn from_sdl(sdl: &str) -> Self {
        let out = Self::read_sdl(sdl);
        if !out.problems.is_empty() {
            let problems = out.problems.clone();
            panic!("{}", DirectiveError { problems });
        }
        out
    }

    /// [`Self::from_sdl`], its problems kept in `problems`.
    pub(crate) fn read_sdl(sdl: &str) -> Self {
        let mut out = Self {
            query: "Query".to_string(),
            ..Self::default()
        };
        let Ok(doc) = async_graphql::parser::parse_schema(sdl) else {
            return out;
        };
        let mut roots = None;
        for definition in &doc.definitions {
            match definition {
                TypeSystemDefinition::Schema(schema) => roots = Some(&schema.node),
                TypeSystemDefinition::Type(ty) => {
                    let ty = &ty.node;
                    let type_name = ty.name.node.as_str();
                    let fields = match &ty.kind {
                        TypeKind::Object(object) => &object.fields,
                        TypeKind::Interface(interface) => &interface.fields,
                        TypeKind::InputObject(input) => {
                            let fields = input.fields.iter().map(sdl_arg).collect();
                            out.inputs.insert(type_name.to_string(), fields);
                            continue;
                        }
                        _ => continue,
                    };
                    let fields = fields
                        .iter()
                        .map(|field| {
                            let field = &field.node;
                            let at = format!("{type_name}.{}", field.name.node);
                            let info = FieldInfo {
                                ty: field.ty.node.to_string(),
                                named: named(&field.ty.node).to_string(),
                                args: field.arguments.iter().map(sdl_arg).collect(),
                                declared: out
                                    .declared(&at, field.directives.iter().map(sdl_directive)),
                            };
                            (field.name.node.to_string(), info)
                        })
                        .collect();
                    out.types.insert(type_name.to_string(), fields);
                }
                TypeSystemDefinition::Directive(_) => {}
            }
        }
        match roots {
            Some(schema) => {
                if let Some(query) = &schema.query {
                    out.query = query.node.to_string();
                }
                out.mutation = schema.mutation.as_ref().map(|m| m.node.to_string());
                out.subscription = schema.subscription.as_ref().map(|s| s.node.to_string());
            }
            None => {
                let exists = |name: &str| out.types.contains_key(name).then(|| name.to_string());
                out.mutation = exists("Mutation");
                out.subscription = exists("Subscription");
            }
        }
        out.check();
        out
    }

    /// The root type of an operation of kind `ty`.
    pub(crate) fn root(&self, ty: async_graphql::parser::types::OperationType) -> Option<&str> {
        use async_graphql::parser::types::OperationType;
        match ty {
            OperationType::Query => Some(&self.query),
            OperationType::Mutation => self.mutation.as_deref(),
            OperationType::Subscription => self.subscription.as_deref(),
        }
    }

    /// Field `field` of type `type_name` (an object or an interface).
    pub(crate) fn field(&self, type_name: &str, field: &str) -> Option<&FieldInfo> {
        self.types.get(type_name)?.get(field)
    }
}

fn named(ty: &Type) -> &str {
    match &ty.base {
        BaseType::Named(name) => name.as_str(),
        BaseType::List(inner) => named(inner),
    }
}

/// A registry argument or input field.
fn meta_arg(arg: &MetaInputValue) -> ArgInfo {
    ArgInfo {
        name: arg.name.clone(),
        named: MetaTypeName::concrete_typename(&arg.ty).to_string(),
        default: arg.default_value.as_deref().and_then(parse_value),
    }
}

/// An SDL argument or input field.
fn sdl_arg(arg: &Positioned<InputValueDefinition>) -> ArgInfo {
    let arg = &arg.node;
    ArgInfo {
        name: arg.name.node.to_string(),
        named: named(&arg.ty.node).to_string(),
        default: arg.default_value.as_ref().map(|v| v.node.clone()),
    }
}

/// An SDL directive as (name, arguments).
fn sdl_directive(
    directive: &Positioned<ConstDirective>,
) -> (&str, impl Iterator<Item = (&str, &Value)>) {
    let directive = &directive.node;
    let args = directive
        .arguments
        .iter()
        .map(|(name, value)| (name.node.as_str(), &value.node));
    (directive.name.node.as_str(), args)
}

/// A constant GraphQL value written as text (the registry keeps defaults so).
fn parse_value(text: &str) -> Option<Value> {
    use async_graphql::parser::types::{DocumentOperations, Selection};
    let doc = async_graphql::parser::parse_query(format!("{{f(a: {text})}}")).ok()?;
    let DocumentOperations::Single(op) = doc.operations else {
        return None;
    };
    let Selection::Field(field) = &op.node.selection_set.node.items.first()?.node else {
        return None;
    };
    field.node.arguments.first()?.1.node.clone().into_const()
}

/// What is wrong with a schema's cost directives (`@cost`, `@listSize`,
/// `@fanoutShared`, `@fanoutProvides`), one message per problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectiveError {
    /// Each problem, naming its directive and its `Type.field`.
    pub problems: Vec<String>,
}

impl std::fmt::Display for DirectiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cost directives: {}", self.problems.join("; "))
    }
}

impl std::error::Error for DirectiveError {}

/// What the declared costs of `types` name that the schema lacks.
fn check_declared(types: &SchemaTypes) -> Vec<String> {
    let mut problems = Vec::new();
    for (ty, name, info) in types.fields() {
        let Some(cost) = &info.declared else {
            continue;
        };
        if let Multiplier::Slicing(slicing) = &cost.times {
            for path in &slicing.paths {
                let wrong = |why: String| {
                    format!("@listSize(slicingArguments: [\"{path}\"]) on {ty}.{name}: {why}")
                };
                let mut segments = path.split('.');
                let first = segments.next().unwrap_or_default();
                let Some(arg) = info.arg(first) else {
                    problems.push(wrong(format!("`{name}` has no argument `{first}`")));
                    continue;
                };
                let mut named = arg.named.as_str();
                for segment in segments {
                    let field = types
                        .inputs
                        .get(named)
                        .and_then(|fields| fields.iter().find(|field| field.name == segment));
                    match field {
                        Some(field) => named = &field.named,
                        None => {
                            problems.push(wrong(format!("`{named}` has no field `{segment}`")));
                            break;
                        }
                    }
                }
            }
        }
        for sized in &cost.sized {
            let returned = &info.named;
            if types.field(returned, sized).is_none() {
                let why = match types.has_type(returned) {
                    true => format!("`{returned}` has no field `{sized}`"),
                    false => format!("`{returned}` is not an object with fields"),
                };
                problems.push(format!(
                    "@listSize(sizedFields: [\"{sized}\"]) on {ty}.{name}: {why}"
                ));
            }
        }
    }
    problems
}
