//! Errors of a whole operation: nothing of it ran, or the deadline (or a
//! memory bound) cut it; answered as `data: null` and one coded error.

use super::read::ReadError;
use super::rejection::Rejection;
use async_graphql::{ErrorExtensionValues, Pos, ServerError};

/// An error of a whole operation (nothing of it ran, or the deadline cut it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OperationError {
    /// The text is not GraphQL.
    ParseFailed { message: String, at: Vec<Pos> },
    /// A fragment cycle or an expansion past `http.max_selections`.
    ValidationFailed { message: String, at: Vec<Pos> },
    /// The batch's worst case exceeds its budget (`refuse_over_estimate`).
    EstimateExceedsBudget { requested: u64, limit: u64 },
    /// The request's `Fanout-Budget` header says it passed through more
    /// services than `budget.max_hops` allows (`chain/`).
    TooManyHops { hops: u64, max: u32 },
    /// The deadline (plus the finishing grace) cut the operation.
    DeadlineExceeded,
    /// A variable's value cannot be coerced (a required one missing or null).
    BadUserInput { message: String },
    /// A hash-only persisted query whose text this server does not keep.
    PersistedQueryNotFound,
    /// A persisted query's text whose SHA-256 is not the hash sent with it.
    PersistedQueryHashMismatch,
    /// A persisted-query extension this server cannot use.
    PersistedQueryNotSupported { message: String },
    /// A mutation or subscription sent over `GET` (under `FanoutLayer`;
    /// `FanoutGraphQL` answers 405 instead).
    NotAQuery,
    /// The batch's query texts, persisted ones included, pass
    /// `http.max_body_bytes` (under `FanoutLayer`; `FanoutGraphQL` answers
    /// 413 before anything runs).
    QueryTooLarge { max: usize },
    /// A WebSocket's client holds its share of the sockets' memory, or the
    /// sockets hold all of theirs (`subscriptions.max_bytes_per_client`,
    /// `subscriptions.max_bytes`): a subscription refused, an event dropped.
    Overloaded { max: usize },
}

/// The operation error as async-graphql's error (no path).
pub(crate) fn operation_error(err: &OperationError) -> ServerError {
    let mut ext = ErrorExtensionValues::default();
    let (code, message, at) = match err {
        OperationError::ParseFailed { message, at } => {
            ("GRAPHQL_PARSE_FAILED", message.clone(), at)
        }
        OperationError::ValidationFailed { message, at } => {
            ("GRAPHQL_VALIDATION_FAILED", message.clone(), at)
        }
        OperationError::EstimateExceedsBudget { requested, limit } => {
            ext.set("requested", *requested);
            ext.set("limit", *limit);
            let message =
                format!("worst case of {requested} upstream reads exceeds the budget of {limit}");
            ("FANOUT_ESTIMATE_EXCEEDS_BUDGET", message, &Vec::new())
        }
        OperationError::TooManyHops { hops, max } => {
            ext.set("hops", *hops);
            ext.set("max", *max);
            let message = ReadError::TooManyHops {
                hops: *hops,
                max: *max,
            }
            .message();
            ("FANOUT_TOO_MANY_HOPS", message, &Vec::new())
        }
        OperationError::DeadlineExceeded => {
            let message = ReadError::DeadlineExceeded.message();
            ("DEADLINE_EXCEEDED", message, &Vec::new())
        }
        OperationError::BadUserInput { message } => {
            ("BAD_USER_INPUT", message.clone(), &Vec::new())
        }
        // The message is what Apollo's persisted-queries link matches.
        OperationError::PersistedQueryNotFound => (
            "PERSISTED_QUERY_NOT_FOUND",
            "PersistedQueryNotFound".to_string(),
            &Vec::new(),
        ),
        OperationError::PersistedQueryHashMismatch => (
            "PERSISTED_QUERY_HASH_MISMATCH",
            "the query's SHA-256 is not the persisted query's sha256Hash".to_string(),
            &Vec::new(),
        ),
        OperationError::NotAQuery => (
            "BAD_REQUEST",
            "only queries run over GET; send a mutation as a POST".to_string(),
            &Vec::new(),
        ),
        OperationError::QueryTooLarge { max } => {
            ext.set("max", *max as u64);
            let message = Rejection::QueryTooLarge { max: *max }.to_string();
            ("PAYLOAD_TOO_LARGE", message, &Vec::new())
        }
        OperationError::Overloaded { max } => {
            ext.set("max", *max as u64);
            let message = format!(
                "the sockets' memory is full: this client's sockets hold their share \
                 (subscriptions.max_bytes_per_client, {max} bytes), or all sockets hold \
                 subscriptions.max_bytes; stop a subscription, or try again later"
            );
            ("OVERLOADED", message, &Vec::new())
        }
        OperationError::PersistedQueryNotSupported { message } => (
            "PERSISTED_QUERY_NOT_SUPPORTED",
            message.clone(),
            &Vec::new(),
        ),
    };
    ext.set("code", code);
    let mut error = ServerError::new(message, None);
    error.locations = at.clone();
    error.extensions = Some(ext);
    error
}

/// An operation refused before it ran (or cut): `data: null` and its error.
pub(crate) fn refused(err: &OperationError) -> async_graphql::Response {
    let mut response = async_graphql::Response::from_errors(vec![operation_error(err)]);
    response.data = async_graphql::Value::Null;
    response
}

/// An operation a memory bound stopped: `data: null` and the whole
/// request's rejection as its one error (the integrations then answer the
/// request with the rejection itself).
pub(crate) fn stopped(rejection: &Rejection) -> async_graphql::Response {
    let body = rejection.body();
    let mut ext = ErrorExtensionValues::default();
    ext.set("code", rejection.code());
    if let Some(max) = body["errors"][0]["extensions"]["max"].as_u64() {
        ext.set("max", max);
    }
    let mut error = ServerError::new(rejection.to_string(), None);
    error.extensions = Some(ext);
    let mut response = async_graphql::Response::from_errors(vec![error]);
    response.data = async_graphql::Value::Null;
    response
}
