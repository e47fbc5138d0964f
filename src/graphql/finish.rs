//! What an operation answers, whichever integration ran it: a failed read
//! as a `null` row with its coded error, every error's code, and the
//! budget's report.
//!
//! - **A row error.** GraphQL says a nullable field whose resolver fails is
//!   `null`, with the error at the field's path. async-graphql 7.2 instead
//!   drops the key from the parent object when a resolver returns `Err`.
//!   [`OrNull::or_null`] does it the spec's way: it reports the error at the
//!   current field's path (list indices as integers) and resolves the field
//!   to `None`, so the field is present and `null`.
//! - **Finishing** (`finish`, both integrations, after the operation ran or
//!   was refused): every error without a code gets one — a [`ReadError`]
//!   carried as a source its own; async-graphql's validation and variable
//!   errors `GRAPHQL_VALIDATION_FAILED` or `BAD_USER_INPUT` — `null`s are put
//!   back where async-graphql dropped a failed field's key (`nulls.rs`), and
//!   `extensions.fanout = {limit, used, remaining, operationReads, requested, cacheHits}`,
//!   and `quota = {limit, remaining, resetAt}` when the client has a read quota.

use super::socket::FanoutConnection;
use crate::document::schema_types::SchemaTypes;
use crate::error::ReadError;
use crate::request::Operation;
use async_graphql::{Context, ErrorExtensionValues, Name, Response, ServerError, Value};
use std::sync::LazyLock;

/// Turns a resolver's `Result` into a nullable field value plus a located error.
///
/// ```
/// use async_graphql::{Context, Object};
/// use fanout_budget::{OrNull, ReadError};
///
/// struct Row;
///
/// #[Object]
/// impl Row {
///     /// `null`, and a `FANOUT_BUDGET_EXHAUSTED` error at this field's path.
///     async fn manifest(&self, ctx: &Context<'_>) -> Option<String> {
///         let read: Result<String, ReadError> = Err(ReadError::BudgetExhausted { limit: 0 });
///         read.or_null(ctx)
///     }
/// }
/// ```
pub trait OrNull<T> {
    /// `Some(value)` on success; on error, the error is added at this
    /// field's path and the field resolves to `null`.
    fn or_null(self, ctx: &Context<'_>) -> Option<T>;
}

impl<T, E: Into<async_graphql::Error>> OrNull<T> for Result<T, E> {
    fn or_null(self, ctx: &Context<'_>) -> Option<T> {
        match self {
            Ok(value) => Some(value),
            Err(err) => {
                let err = ctx.set_error_path(err.into().into_server_error(ctx.item.pos));
                // The error is part of the answer being built: counted as
                // it is added (the field's null is counted by its resolve;
                // past the bound, the next resolve parks).
                if let Some(operation) = ctx.data_opt::<std::sync::Arc<Operation>>() {
                    let _within = operation
                        .request()
                        .memory()
                        .answer(crate::memory::weigh_error(&err, 0));
                }
                ctx.add_error(err);
                None
            }
        }
    }
}

/// Finishes one operation's response (see the module docs).
pub(crate) fn finish(
    response: &mut Response,
    operation: &Operation,
    requested: Option<u64>,
    types: &SchemaTypes,
    query: &str,
    operation_name: Option<&str>,
) {
    if !response.errors.is_empty() {
        code_errors(&mut response.errors, query);
        crate::graphql::nulls::propagate(response, types, query, operation_name);
    }
    response
        .extensions
        .insert("fanout".to_string(), report(operation, requested));
}

/// Puts the connection's budget into an event's `extensions.fanout`:
/// `limit` its burst, `used` the reads it paid since it opened, `remaining`
/// what it may spend now (the event's own `operationReads` and `cacheHits`
/// stay).
pub(crate) fn report_connection(response: &mut Response, connection: &FanoutConnection) {
    let Some(Value::Object(fanout)) = response.extensions.get_mut("fanout") else {
        return;
    };
    for (key, value) in [
        ("limit", connection.limit()),
        ("used", connection.used()),
        ("remaining", connection.remaining()),
    ] {
        fanout.insert(Name::new(key), Value::from(value));
    }
}

fn report(operation: &Operation, requested: Option<u64>) -> Value {
    // The keys are built once (a `Name` is a shared string).
    static KEYS: LazyLock<[Name; 6]> = LazyLock::new(|| {
        [
            "limit",
            "used",
            "remaining",
            "operationReads",
            "requested",
            "cacheHits",
        ]
        .map(Name::new)
    });
    let budget = operation.request().budget().snapshot();
    let values = [
        Some(budget.limit),
        Some(budget.used),
        Some(budget.remaining),
        Some(operation.reads()),
        requested,
        Some(operation.cache_hits()),
    ];
    let mut map: async_graphql::indexmap::IndexMap<Name, Value> = KEYS
        .iter()
        .zip(values)
        .filter_map(|(key, value)| Some((key.clone(), Value::from(value?))))
        .collect();
    // Reads a limit in measure mode let through (absent when none).
    let would_refuse = operation.request().budget().would_refuse();
    if would_refuse > 0 {
        map.insert(Name::new("wouldRefuse"), Value::from(would_refuse));
    }
    if let Some(quota) = operation.request().quota() {
        let status = [
            ("limit", Value::from(quota.limit)),
            ("remaining", Value::from(quota.remaining)),
            ("resetAt", Value::from(quota.reset_at_rfc3339())),
        ];
        let status = status.map(|(key, value)| (Name::new(key), value));
        map.insert(
            Name::new("quota"),
            Value::Object(status.into_iter().collect()),
        );
    }
    Value::Object(map)
}

/// Validation errors one answer carries, at most (graphql-js's `maxErrors`):
/// a document of 21,000 unknown directives made 21,000 errors, a 2.7 MB
/// answer from a 42 KB text — over a WebSocket, where answers wait for a
/// client that may not read, that is memory a client chooses.
pub(crate) const MAX_VALIDATION_ERRORS: usize = 100;

/// Keeps the first [`MAX_VALIDATION_ERRORS`] of `errors` and, past them,
/// one saying validation stopped there (graphql-js's message).
pub(crate) fn cap_errors(errors: &mut Vec<ServerError>) {
    if errors.len() > MAX_VALIDATION_ERRORS {
        errors.truncate(MAX_VALIDATION_ERRORS);
        errors.push(ServerError::new(
            "Too many validation errors, error limit reached. Validation aborted.",
            None,
        ));
    }
}

/// Gives a code to every error that has none: a [`ReadError`] carried as a
/// source (a resolver that built an `async_graphql::Error` by hand) its own;
/// async-graphql's errors, given the operation's text:
///
/// - an `operationName` the document does not define, or none where it
///   defines several, is `OPERATION_RESOLUTION_FAILURE` (Apollo's name);
/// - a variable missing or `null` for a non-null argument (async-graphql
///   reports it while executing, at the field's path) is `BAD_USER_INPUT`;
/// - an error without a path was raised before the operation ran, by
///   async-graphql's validation: `BAD_USER_INPUT` when it is an invalid
///   argument value that came from a variable (variable coercion), else
///   `GRAPHQL_VALIDATION_FAILED`.
pub(crate) fn code_errors(errors: &mut [ServerError], query: &str) {
    let mut doc = None;
    for error in errors {
        if error.extensions.is_some() {
            continue;
        }
        if let Some(read) = error.source::<ReadError>() {
            error.extensions = Some(read.extensions());
            continue;
        }
        let undefined_variable =
            error.message.starts_with("Variable ") && error.message.ends_with(" is not defined.");
        let unresolved = error.message.starts_with("Unknown operation named ")
            || error.message == "Operation name required in request.";
        let code = if undefined_variable {
            "BAD_USER_INPUT"
        } else if unresolved {
            "OPERATION_RESOLUTION_FAILURE"
        } else if !error.path.is_empty() {
            continue;
        } else if error.message.starts_with("Invalid value for argument")
            && error.locations.first().is_some_and(|pos| {
                let doc = doc.get_or_insert_with(|| async_graphql::parser::parse_query(query).ok());
                doc.as_ref()
                    .is_some_and(|doc| crate::document::guard::argument_is_variable(doc, *pos))
            })
        {
            "BAD_USER_INPUT"
        } else {
            "GRAPHQL_VALIDATION_FAILED"
        };
        let mut ext = ErrorExtensionValues::default();
        ext.set("code", code);
        error.extensions = Some(ext);
    }
}
