//! The schema's shape, as the engine needs it after parsing an operation.
//!
//! Two things walk an operation against the schema's types: the cost preview
//! ([`crate::cost`], before the operation runs) and null propagation
//! ([`crate::graphql::nulls`], after it ran with errors). Both need, per object or
//! interface type and field: the field's declared type (`[Tag!]!`), the
//! named type under its wrappers (`Tag`), and the numeric defaults of its
//! arguments.
//!
//! [`SchemaTypes`] holds exactly that, nested by type then field name, so
//! the walks look fields up with borrowed `&str`s and allocate nothing per
//! field. It is built once per schema: from the schema's SDL when the HTTP
//! integration is created ([`SchemaTypes::from_sdl`]), or from async-graphql's
//! registry the first time the extension runs ([`SchemaTypes::from_registry`]).
//! The two sources describe the same schema and build the same value.

use async_graphql::parser::types::{BaseType, Type, TypeKind, TypeSystemDefinition};
use async_graphql::registry::{MetaType, MetaTypeName, Registry};
use async_graphql::Value;
use std::collections::HashMap;

/// What the engine knows of a schema's types (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct SchemaTypes {
    query: String,
    mutation: Option<String>,
    subscription: Option<String>,
    types: HashMap<String, HashMap<String, FieldInfo>>,
}

/// One field of an object or interface type.
#[derive(Debug)]
pub(crate) struct FieldInfo {
    /// The declared type, e.g. `[Tag!]!`.
    pub(crate) ty: String,
    /// The named type under the list and non-null wrappers, e.g. `Tag`.
    pub(crate) named: String,
    /// Arguments whose default is a non-negative integer.
    pub(crate) defaults: Vec<(String, u64)>,
}

impl FieldInfo {
    /// The default of argument `name`, if it is a non-negative integer.
    pub(crate) fn default_of(&self, name: &str) -> Option<u64> {
        self.defaults
            .iter()
            .find_map(|(arg, value)| (arg == name).then_some(*value))
    }
}

impl SchemaTypes {
    /// From async-graphql's registry (what the extension sees).
    pub(crate) fn from_registry(registry: &Registry) -> Self {
        let mut out = Self {
            query: registry.query_type.clone(),
            mutation: registry.mutation_type.clone(),
            subscription: registry.subscription_type.clone(),
            types: HashMap::new(),
        };
        for (type_name, ty) in &registry.types {
            let fields = match ty {
                MetaType::Object { fields, .. } | MetaType::Interface { fields, .. } => fields,
                _ => continue,
            };
            let fields = fields
                .values()
                .map(|field| {
                    let defaults = field
                        .args
                        .values()
                        .filter_map(|arg| {
                            let default = arg.default_value.as_deref()?.parse::<u64>().ok()?;
                            Some((arg.name.clone(), default))
                        })
                        .collect();
                    let info = FieldInfo {
                        named: MetaTypeName::concrete_typename(&field.ty).to_string(),
                        ty: field.ty.clone(),
                        defaults,
                    };
                    (field.name.clone(), info)
                })
                .collect();
            out.types.insert(type_name.clone(), fields);
        }
        out
    }

    /// From the schema's SDL (`Schema::sdl()`, what the HTTP integration
    /// sees). SDL that does not parse gives an empty value: nothing is
    /// priced and nothing repaired, and the schema still runs.
    pub(crate) fn from_sdl(sdl: &str) -> Self {
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
                    let fields = match &ty.kind {
                        TypeKind::Object(object) => &object.fields,
                        TypeKind::Interface(interface) => &interface.fields,
                        _ => continue,
                    };
                    let type_name = ty.name.node.as_str();
                    let fields = fields
                        .iter()
                        .map(|field| {
                            let field = &field.node;
                            let defaults = field
                                .arguments
                                .iter()
                                .filter_map(|arg| {
                                    let default = match &arg.node.default_value.as_ref()?.node {
                                        Value::Number(n) => n.as_u64()?,
                                        _ => return None,
                                    };
                                    Some((arg.node.name.node.to_string(), default))
                                })
                                .collect();
                            let info = FieldInfo {
                                ty: field.ty.node.to_string(),
                                named: named(&field.ty.node).to_string(),
                                defaults,
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
