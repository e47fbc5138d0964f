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
//!   and `quota = {limit, remaining, resetAt}` when the client has a read quota;
//!   with `http.cost_extension`, `extensions.cost` beside it ([`CostEnvelope`]).
//! - **Cost headers** ([`cost_headers`], `http.cost_headers`): the request's
//!   `X-Cost-Estimated`, `X-Cost-Actual` and `X-Cost-Max`, written by the
//!   integration on its HTTP answer.

use super::socket::FanoutConnection;
use crate::config::Config;
use crate::cost::schema_types::SchemaTypes;
use crate::engine::Engine;
use crate::error::ReadError;
use crate::inbound::quota::Rate;
use crate::inbound::Caller;
use crate::request::{FanoutRequest, Operation};
use async_graphql::{Context, ErrorExtensionValues, Name, Response, ServerError, Value};
use http::{HeaderName, HeaderValue};
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
    let envelope = operation.request().extensions().get::<CostEnvelope>();
    if let Some(envelope) = envelope {
        let cost = envelope.report(operation, requested);
        response.extensions.insert("cost".to_string(), cost);
    }
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

/// `http.cost_extension`: Shopify's `extensions.cost` envelope, so a client
/// that paces on Shopify's paces on ours. The integrations put it into the
/// HTTP request's extensions (whence the request's scope, and a WebSocket
/// connection's events, carry it) when the key is on; [`finish`] then adds
/// `cost = {requestedQueryCost, actualQueryCost, throttleStatus}` to each
/// operation's answer:
///
/// - `requestedQueryCost`: its `requested`; unpriced (no cost table), the
///   request's budget — its worst case, and what a read quota reserves for it;
/// - `actualQueryCost`: its `operationReads`, the reads it sent;
/// - `throttleStatus`, when the client has a read quota (as
///   `extensions.fanout.quota`): `maximumAvailable` its burst,
///   `currentlyAvailable` the reads left once the request settles, and
///   `restoreRate` the reads it refills per second.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CostEnvelope {
    /// Reads per second each class's quota refills (public, internal).
    restore: [Option<f64>; 2],
}

impl CostEnvelope {
    /// The envelope `config` asks for, if it asks for one.
    pub(crate) fn of(config: &Config) -> Option<Self> {
        if !config.http.cost_extension {
            return None;
        }
        let q = &config.quota;
        let per_second = |reads: u64, burst| {
            let rate = (reads > 0).then(|| Rate::new(reads, q.period(), burst))?;
            Some(1e9 / rate.interval_ns() as f64)
        };
        Some(Self {
            restore: [
                per_second(q.reads, q.burst),
                per_second(q.internal_reads, 0),
            ],
        })
    }

    /// Puts the envelope into `request`'s extensions (an HTTP request's, or
    /// a WebSocket upgrade's), for its scope to carry.
    pub(crate) fn mark(envelope: Option<Self>, request: &mut http::Extensions) {
        if let Some(envelope) = envelope {
            request.insert(envelope);
        }
    }

    fn report(&self, operation: &Operation, requested: Option<u64>) -> Value {
        let request = operation.request();
        let requested = requested.unwrap_or_else(|| request.budget().ceiling());
        let mut cost = async_graphql::indexmap::IndexMap::new();
        cost.insert(Name::new("requestedQueryCost"), Value::from(requested));
        cost.insert(Name::new("actualQueryCost"), Value::from(operation.reads()));
        let class = usize::from(request.caller() == Caller::Internal);
        if let (Some(quota), Some(rate)) = (request.quota(), self.restore[class]) {
            let status = [
                ("maximumAvailable", Value::from(quota.limit)),
                ("currentlyAvailable", Value::from(quota.remaining)),
                ("restoreRate", Value::from(rate)),
            ];
            let status = status.map(|(key, value)| (Name::new(key), value));
            cost.insert(
                Name::new("throttleStatus"),
                Value::Object(status.into_iter().collect()),
            );
        }
        Value::Object(cost)
    }
}

/// `http.cost_headers`: who sends a request, known before it is read
/// (`extensions`, `headers`: the request's), for [`cost_headers`]; `None`
/// when the key is off.
pub(crate) fn cost_caller(
    engine: &Engine,
    extensions: &http::Extensions,
    headers: &http::HeaderMap,
) -> Option<Caller> {
    let on = engine.config().http.cost_headers;
    on.then(|| (extensions.get::<Caller>().copied()).unwrap_or_else(|| engine.identify(headers)))
}

/// `http.cost_headers`: writes the request's cost on its HTTP answer —
/// `X-Cost-Estimated`, its worst case in reads (the operations' `requested`
/// summed over the batch; unpriced, its budget), `X-Cost-Actual`, the reads
/// it sent (the whole batch's; reads answered from the cache or by another
/// request's are not sent), and `X-Cost-Max`, the request's budget
/// (`max_reads`, or `internal_max_reads` for the internal token; a read
/// quota may run the request on a smaller reservation,
/// `extensions.fanout.limit`). `scope`: the request's, `None` for one
/// refused before it was read, which estimated and sent nothing; `caller`
/// ([`cost_caller`]): `None` when the key is off.
pub(crate) fn cost_headers(
    answer: &mut axum::response::Response,
    engine: &Engine,
    scope: Option<&FanoutRequest>,
    caller: Option<Caller>,
) {
    let Some(caller) = caller else {
        return;
    };
    let (estimated, actual, max) = match scope {
        Some(scope) => {
            let budget = scope.budget();
            let estimated = match engine.costs() {
                Some(_) => budget.requested(),
                None => budget.ceiling(),
            };
            (estimated, budget.used(), budget.ceiling())
        }
        None => {
            let b = &engine.config().budget;
            let max = match caller {
                Caller::Internal => b.internal_max_reads,
                Caller::Public => b.max_reads,
            };
            (0, 0, max)
        }
    };
    let headers = answer.headers_mut();
    for (name, value) in [
        ("x-cost-estimated", estimated),
        ("x-cost-actual", actual),
        ("x-cost-max", max),
    ] {
        headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
    }
}

/// A request that carried `Fanout-Budget` (its caller a service on the
/// engine, `chain/`) is answered with what it spent: `Fanout-Spent:
/// reads=N`, the reads charged to it — its own and what services it called
/// reported — which its caller charges to its own request.
pub(crate) fn spent_header(answer: &mut axum::response::Response, scope: Option<&FanoutRequest>) {
    let Some(scope) = scope.filter(|scope| scope.received().is_some()) else {
        return;
    };
    // A WebSocket's upgrade spends nothing of its own: its events are
    // scopes of their own, and ignore the header.
    if answer.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    let spent = scope.budget().used();
    let value = crate::chain::header::spent(spent);
    answer
        .headers_mut()
        .insert(crate::chain::header::SPENT, value);
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
