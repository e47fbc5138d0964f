//! What is known of a kept document besides its parse, found once and kept
//! with it: the document guard's verdict, and what async-graphql's
//! validation concluded.
//!
//! **The guard's verdict** (`guard.rs`: fragment cycles, the expanded size)
//! depends on the document and `http.max_selections` alone: it is found on
//! the first request for the text and kept with the bound it was found for.
//!
//! **Validation.** async-graphql 7.2 validates a document
//! (`validation::check_rules`) against the schema's registry, its
//! `ValidationMode` and its `limit_complexity` / `limit_depth`, the
//! `operationName` sent, and the request's variables — which it does see:
//!
//! - `ArgumentsOfCorrectType` puts the variables' values into every argument
//!   that names one (in fragments and the operation selected, not in the
//!   operations `operationName` leaves out) and checks the result against
//!   the argument's type: `f(x: $n)` is valid with `n = 3` and not with
//!   `n = "three"`;
//! - the complexity a field's `complexity` function computes reads its
//!   arguments' values (`param_value`: a variable's value, else its
//!   default), so `limit_complexity` refuses `items(first: $n)` for one `n`
//!   and not for another; depth and cache control read no value;
//! - the rest (`VariablesInAllowedPosition`, `NoUndefinedVariables`,
//!   `NoUnusedVariables`, `DefaultValuesOfCorrectType`, `UploadFile`, …)
//!   read the text and the schema only.
//!
//! So a validation is kept under the schema it ran for (one per
//! [`SchemaClaim`], which holds that schema's environment: its registry,
//! and through it one schema's mode and limits), the operation name, and
//! the value of every variable the document defines (absent and `null`
//! told apart). That covers every variable a *successful* validation can
//! have read: in strict mode a variable used but defined by no operation
//! fails `NoUndefinedVariables` whatever its value, and in fast mode
//! `param_value` reads only defined variables. Only successes are kept
//! (a failure is answered by running validation again), only when the
//! operation name is one the document defines (or none), and only when
//! every value is a scalar of at most [`MAX_VALUE_BYTES`]: anything else is
//! validated as if nothing were kept. A document keeps at most
//! [`MAX_VALIDATIONS`], the newest replacing the oldest, and their room is
//! reserved in the document cache's weight when the document is kept
//! ([`reserve`]), so the cache's bound holds them.
//!
//! **The cost estimate's formula** (`cost/formula.rs`) and
//! **`requireOneSlicingArgument`'s check** (`cost/check.rs`) are kept in a
//! slot of their own, typed by their owner (`cost/kept.rs`: this module
//! names nothing of `cost`, which names it), with the schema, cost table and
//! operation they were compiled for; at most [`MAX_FORMULA_BYTES`] of heap
//! together, reserved likewise.

use crate::document::guard::{check, Shape, ShapeError};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Name, SchemaEnv, ValidationResult, Value as ConstValue, Variables};
use std::any::Any;
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};

/// Validations a document keeps, over every schema, name and variables.
pub(crate) const MAX_VALIDATIONS: usize = 4;

/// The most heap a kept cost formula and slicing check take together; a
/// larger one is not kept.
pub(crate) const MAX_FORMULA_BYTES: usize = 1024;

/// The longest string or enum value a kept validation's variables hold.
pub(crate) const MAX_VALUE_BYTES: usize = 64;

/// A document kept parsed, with what is known of it.
pub(crate) struct Kept {
    /// The text, handed out without copying it.
    pub(crate) text: Arc<str>,
    /// The parsed document (copied for async-graphql, which takes it).
    pub(crate) doc: ExecutableDocument,
    /// The guard's verdict, and the `max_selections` it was found for.
    verdict: OnceLock<(u64, Result<Arc<Shape>, ShapeError>)>,
    /// Successful validations, newest last.
    validated: RwLock<Vec<Validated>>,
    /// The cost estimate's formula and `requireOneSlicingArgument`'s
    /// check, as their owner (`cost/kept.rs`) keeps them.
    cost: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("text", &self.text)
            .finish_non_exhaustive()
    }
}

struct Validated {
    /// The [`SchemaClaim`] it ran for.
    schema: u64,
    /// The operation selected, as the document names it.
    operation: Option<Name>,
    /// The value of every variable the document defines, in [`defined`]'s order.
    variables: Box<[Option<ConstValue>]>,
    result: ValidationResult,
}

/// The heap a document's kept validations may take at most, for the cache
/// to count when it keeps `doc`: each value at its largest (a string's
/// bytes, or an enum's `Arc<str>`: its bytes and two counters).
pub(crate) fn reserve(doc: &ExecutableDocument) -> usize {
    let value = size_of::<Option<ConstValue>>() + MAX_VALUE_BYTES + 2 * size_of::<usize>();
    MAX_VALIDATIONS * (size_of::<Validated>() + defined(doc).count() * value)
        + FORMULA_SLOT
        + MAX_FORMULA_BYTES
}

/// What the cost slot takes besides its heap counted by its owner (its box,
/// whose owner's keys and roots are a few words).
pub(crate) const FORMULA_SLOT: usize = 24 * size_of::<usize>();

/// Every variable definition of `doc`'s operations, in a fixed order (the
/// kept document's: the same on every call).
fn defined(doc: &ExecutableDocument) -> impl Iterator<Item = &Name> {
    doc.operations
        .iter()
        .flat_map(|(_, op)| op.node.variable_definitions.iter())
        .map(|def| &def.node.name.node)
}

impl Kept {
    pub(crate) fn new(text: Arc<str>, doc: ExecutableDocument) -> Self {
        Kept {
            text,
            doc,
            verdict: OnceLock::new(),
            validated: RwLock::new(Vec::new()),
            cost: OnceLock::new(),
        }
    }

    /// What the cost checks keep in this document's slot, made by `make`
    /// the first time it is asked for (`None` when what the slot holds is
    /// of another type). The owner checks the kept value fits (its schema,
    /// its operation): one is kept, the first.
    pub(crate) fn cost<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.cost.get_or_init(|| Box::new(make())).downcast_ref()
    }

    /// Whether the cost checks keep anything.
    pub(crate) fn has_cost(&self) -> bool {
        self.cost.get().is_some()
    }

    /// The guard's verdict for `max_selections`: found once.
    pub(crate) fn verdict(&self, max_selections: u64) -> Result<Arc<Shape>, ShapeError> {
        let (max, verdict) = self.verdict.get_or_init(|| {
            (
                max_selections,
                check(&self.doc, max_selections).map(Arc::new),
            )
        });
        if *max == max_selections {
            verdict.clone()
        } else {
            check(&self.doc, max_selections).map(Arc::new)
        }
    }

    /// What validating this document for `schema`, `operation_name` and
    /// `variables` concluded, if it was kept; else how to keep it, if it
    /// can be (`None`: it cannot, see the module docs).
    pub(crate) fn validation(
        self: &Arc<Self>,
        schema: u64,
        operation_name: Option<&str>,
        variables: &Variables,
    ) -> Option<Validation> {
        let operation = match operation_name {
            None => None,
            Some(name) => Some(self.operation_named(name)?),
        };
        let fits = |v: &Validated| {
            v.schema == schema
                && v.operation.as_deref() == operation_name
                && defined(&self.doc)
                    .zip(v.variables.iter())
                    .all(|(name, kept)| variables.get(name) == kept.as_ref())
        };
        let validated = self.validated.read().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = validated.iter().find(|v| fits(v)) {
            return Some(Validation::Kept(kept.result));
        }
        drop(validated);
        let values = defined(&self.doc)
            .map(|name| match variables.get(name) {
                None => Some(None),
                Some(value) => scalar(value).then(|| Some(value.clone())),
            })
            .collect::<Option<Box<[_]>>>()?;
        Some(Validation::ToKeep(ToKeep {
            kept: self.clone(),
            schema,
            operation: operation.cloned(),
            variables: values,
        }))
    }

    /// The document's name for the operation `name`, if it defines one.
    fn operation_named(&self, name: &str) -> Option<&Name> {
        self.doc
            .operations
            .iter()
            .find_map(|(op, _)| op.filter(|op| op.as_str() == name))
    }

    /// Validations kept now.
    #[cfg(test)]
    pub(crate) fn validations(&self) -> usize {
        self.validated.read().unwrap().len()
    }
}

/// A value a kept validation may hold: a scalar, a string or enum of at
/// most [`MAX_VALUE_BYTES`].
fn scalar(value: &ConstValue) -> bool {
    match value {
        ConstValue::Null | ConstValue::Number(_) | ConstValue::Boolean(_) => true,
        ConstValue::String(s) => s.len() <= MAX_VALUE_BYTES,
        ConstValue::Enum(name) => name.len() <= MAX_VALUE_BYTES,
        ConstValue::Binary(_) | ConstValue::List(_) | ConstValue::Object(_) => false,
    }
}

/// A document's validation for one operation: kept, or to keep once it
/// succeeds.
pub(crate) enum Validation {
    /// What validation concluded for the same document, schema, name and
    /// variables.
    Kept(ValidationResult),
    /// Not kept yet.
    ToKeep(ToKeep),
}

/// A validation to keep, once it has run and succeeded.
pub(crate) struct ToKeep {
    kept: Arc<Kept>,
    schema: u64,
    operation: Option<Name>,
    variables: Box<[Option<ConstValue>]>,
}

impl ToKeep {
    /// Keeps `result`, what validation concluded (a success), replacing the
    /// oldest when [`MAX_VALIDATIONS`] are kept.
    pub(crate) fn keep(self, result: ValidationResult) {
        let ToKeep {
            kept,
            schema,
            operation,
            variables,
        } = self;
        let mut validated = kept.validated.write().unwrap_or_else(|e| e.into_inner());
        let same = |v: &Validated| {
            v.schema == schema && v.operation == operation && v.variables == variables
        };
        if validated.iter().any(same) {
            return;
        }
        if validated.len() >= MAX_VALIDATIONS {
            validated.remove(0);
        }
        validated.push(Validated {
            schema,
            operation,
            variables,
            result,
        });
    }
}

/// The one schema an extension's validations are kept for: the first that
/// validates through it. Holding its environment keeps its address from
/// being reused by another schema while anything is kept for it.
pub(crate) struct SchemaClaim {
    id: u64,
    env: OnceLock<SchemaEnv>,
}

impl SchemaClaim {
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SchemaClaim {
            id: NEXT.fetch_add(1, Relaxed),
            env: OnceLock::new(),
        }
    }

    /// The claim's id when `env` is the schema it is for (the first seen);
    /// `None` for any other schema.
    pub(crate) fn id(&self, env: &SchemaEnv) -> Option<u64> {
        let claimed = self.env.get_or_init(|| env.clone());
        std::ptr::eq(&**claimed, &**env).then_some(self.id)
    }
}

#[cfg(test)]
mod tests;
