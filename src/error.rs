//! The one error type, and the one place it is mapped to the contract's codes.
//!
//! Every refusal or failure the engine can produce is a [`FanoutError`]. Its
//! [`code`](FanoutError::code), its GraphQL `extensions` and — for the errors
//! that answer a whole HTTP request — its HTTP status are decided here and
//! nowhere else, so a resolver, the extension and the HTTP integration can
//! never disagree about what `HOST_SATURATED` carries.
//!
//! Field-level errors (`FANOUT_BUDGET_EXHAUSTED`, `UPSTREAM_TIMEOUT`,
//! `DEADLINE_EXCEEDED`, `UPSTREAM_ERROR`, `HOST_SATURATED`, `BAD_USER_INPUT`)
//! become GraphQL errors carrying their code (see [`attach_codes`]);
//! request-level ones (`BAD_REQUEST`, `BATCH_TOO_LARGE`, `REQUEST_TIMEOUT`, …)
//! become whole HTTP
//! answers through [`FanoutError::http_status`] and
//! [`FanoutError::to_response_body`].

use async_graphql::{ErrorExtensionValues, Pos, ServerError};
use http::StatusCode;
use std::fmt;

/// Everything the engine refuses or fails with, one variant per contract code.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FanoutError {
    /// The inbound HTTP request has used all of its upstream reads.
    BudgetExhausted {
        /// The request's read limit.
        limit: u64,
    },
    /// One upstream read took longer than `read_timeout_ms`.
    UpstreamTimeout {
        /// `host:port` of the upstream.
        host: String,
        /// The timeout that cut the read.
        timeout_ms: u64,
    },
    /// The inbound request's deadline (not the read timeout) cut the read.
    DeadlineExceeded,
    /// The upstream answered with an error, an unexpected body, or not at all.
    Upstream {
        /// `host:port` of the upstream.
        host: String,
        /// The HTTP status, when the upstream answered.
        status: Option<u16>,
        /// What went wrong, for humans.
        message: String,
    },
    /// The process-wide cap of reads in flight to this host is full.
    HostSaturated {
        /// `host:port` of the upstream.
        host: String,
        /// The host's cap.
        max_concurrent: u32,
    },
    /// An argument is out of range (e.g. `first` outside `1..=100`).
    BadUserInput {
        /// What is wrong with the input.
        message: String,
    },
    /// Malformed JSON, an empty batch, or not a GraphQL request (HTTP 400).
    BadRequest {
        /// What is wrong with the request.
        message: String,
    },
    /// The batch has more operations than `max_batch_operations` (HTTP 400).
    BatchTooLarge {
        /// The configured maximum.
        max: usize,
    },
    /// The body is larger than `max_body_bytes` (HTTP 413).
    PayloadTooLarge {
        /// The configured maximum.
        max: usize,
    },
    /// The request body did not arrive within `min(body_read_timeout_ms,
    /// time left before the deadline)` (HTTP 408).
    RequestTimeout {
        /// The bound the body had to arrive within.
        timeout_ms: u64,
    },
    /// The batch's worst-case reads exceed its budget (only with `refuse_over_estimate`).
    EstimateExceedsBudget {
        /// The worst case, summed over the batch.
        requested: u64,
        /// The request's read limit.
        limit: u64,
    },
    /// The caller's inbound rate is exhausted (HTTP 429).
    RateLimited {
        /// Whole seconds until a request would be admitted (at least 1).
        retry_after_secs: u64,
    },
    /// A shared-state backend is down and `failure_mode = "closed"` (HTTP 503).
    Unavailable {
        /// Which backend, for humans.
        message: String,
    },
    /// The answer would be larger than `http.max_response_bytes` (it is
    /// replaced by this error; the reads it made were charged).
    ResponseTooLarge {
        /// The configured maximum.
        max: usize,
    },
    /// The operation's text is not GraphQL (nothing of it ran).
    ParseFailed {
        /// The parser's message.
        message: String,
        /// Where, in the text.
        locations: Vec<Pos>,
    },
    /// The operation is not valid: a fragment cycle, an expansion past
    /// `http.max_selections`, or any of async-graphql's validation rules
    /// (nothing of it ran).
    ValidationFailed {
        /// What is wrong.
        message: String,
        /// Where, in the text.
        locations: Vec<Pos>,
    },
}

impl FanoutError {
    /// The contract's `extensions.code` for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BudgetExhausted { .. } => "FANOUT_BUDGET_EXHAUSTED",
            Self::UpstreamTimeout { .. } => "UPSTREAM_TIMEOUT",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::Upstream { .. } => "UPSTREAM_ERROR",
            Self::HostSaturated { .. } => "HOST_SATURATED",
            Self::BadUserInput { .. } => "BAD_USER_INPUT",
            Self::BadRequest { .. } => "BAD_REQUEST",
            Self::BatchTooLarge { .. } => "BATCH_TOO_LARGE",
            Self::PayloadTooLarge { .. } => "PAYLOAD_TOO_LARGE",
            Self::RequestTimeout { .. } => "REQUEST_TIMEOUT",
            Self::EstimateExceedsBudget { .. } => "FANOUT_ESTIMATE_EXCEEDS_BUDGET",
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::Unavailable { .. } => "UNAVAILABLE",
            Self::ResponseTooLarge { .. } => "RESPONSE_TOO_LARGE",
            Self::ParseFailed { .. } => "GRAPHQL_PARSE_FAILED",
            Self::ValidationFailed { .. } => "GRAPHQL_VALIDATION_FAILED",
        }
    }

    /// The HTTP status when this error answers a whole HTTP request.
    ///
    /// Field-level errors travel inside a 200 answer; they map to 200 here.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } | Self::BatchTooLarge { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        }
    }

    /// The contract's `extensions` for this error, `code` included.
    pub fn extensions(&self) -> ErrorExtensionValues {
        let mut ext = ErrorExtensionValues::default();
        ext.set("code", self.code());
        match self {
            Self::BudgetExhausted { limit } => ext.set("limit", *limit),
            Self::UpstreamTimeout { host, timeout_ms } => {
                ext.set("host", host.as_str());
                ext.set("timeoutMs", *timeout_ms);
            }
            Self::Upstream { host, status, .. } => {
                ext.set("host", host.as_str());
                if let Some(status) = status {
                    ext.set("status", *status);
                }
            }
            Self::HostSaturated {
                host,
                max_concurrent,
            } => {
                ext.set("host", host.as_str());
                ext.set("maxConcurrent", *max_concurrent);
            }
            Self::BatchTooLarge { max }
            | Self::PayloadTooLarge { max }
            | Self::ResponseTooLarge { max } => ext.set("max", *max as u64),
            Self::EstimateExceedsBudget { requested, limit } => {
                ext.set("requested", *requested);
                ext.set("limit", *limit);
            }
            Self::RateLimited { retry_after_secs } => ext.set("retryAfter", *retry_after_secs),
            Self::RequestTimeout { timeout_ms } => ext.set("timeoutMs", *timeout_ms),
            Self::DeadlineExceeded
            | Self::BadUserInput { .. }
            | Self::BadRequest { .. }
            | Self::Unavailable { .. }
            | Self::ParseFailed { .. }
            | Self::ValidationFailed { .. } => {}
        }
        ext
    }

    /// This error as a GraphQL error (message + extensions, no path).
    pub fn to_graphql_error(&self) -> async_graphql::Error {
        async_graphql::Error {
            message: self.to_string(),
            source: None,
            extensions: Some(self.extensions()),
        }
    }

    /// This error as async-graphql's error of a whole operation (no path),
    /// with its locations in the query text when it has some.
    pub fn to_server_error(&self) -> ServerError {
        let locations = match self {
            Self::ParseFailed { locations, .. } | Self::ValidationFailed { locations, .. } => {
                locations.clone()
            }
            _ => Vec::new(),
        };
        let mut error = ServerError::new(self.to_string(), None);
        error.locations = locations;
        error.extensions = Some(self.extensions());
        error
    }

    /// The JSON body of a whole-request answer: `{"errors":[{message, extensions}]}`.
    pub fn to_response_body(&self) -> serde_json::Value {
        let extensions = serde_json::to_value(self.extensions()).unwrap_or_default();
        let mut body = serde_json::json!({
            "errors": [{ "message": self.to_string(), "extensions": extensions }]
        });
        if matches!(
            self,
            Self::EstimateExceedsBudget { .. } | Self::ResponseTooLarge { .. }
        ) {
            body["data"] = serde_json::Value::Null;
        }
        body
    }

    /// Whether the read was refused before anything was sent upstream.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::BudgetExhausted { .. } | Self::HostSaturated { .. } | Self::Unavailable { .. }
        )
    }
}

impl fmt::Display for FanoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BudgetExhausted { limit } => {
                write!(
                    f,
                    "fan-out budget exhausted: this request may make {limit} upstream reads"
                )
            }
            Self::UpstreamTimeout { host, timeout_ms } => {
                write!(f, "upstream {host} did not answer within {timeout_ms} ms")
            }
            Self::DeadlineExceeded => {
                write!(f, "the request deadline passed before this read finished")
            }
            Self::Upstream {
                host,
                status: Some(status),
                message,
            } => write!(f, "upstream {host} answered {status}: {message}"),
            Self::Upstream {
                host,
                status: None,
                message,
            } => write!(f, "upstream {host} failed: {message}"),
            Self::HostSaturated {
                host,
                max_concurrent,
            } => write!(
                f,
                "upstream {host} is saturated ({max_concurrent} reads in flight)"
            ),
            Self::BadUserInput { message }
            | Self::BadRequest { message }
            | Self::ParseFailed { message, .. }
            | Self::ValidationFailed { message, .. } => f.write_str(message),
            Self::BatchTooLarge { max } => write!(f, "a batch may hold at most {max} operations"),
            Self::PayloadTooLarge { max } => {
                write!(f, "the request body may be at most {max} bytes")
            }
            Self::ResponseTooLarge { max } => {
                write!(f, "the answer would be larger than {max} bytes")
            }
            Self::RequestTimeout { timeout_ms } => {
                write!(f, "the request body did not arrive within {timeout_ms} ms")
            }
            Self::EstimateExceedsBudget { requested, limit } => write!(
                f,
                "worst case of {requested} upstream reads exceeds the budget of {limit}"
            ),
            Self::RateLimited { retry_after_secs } => {
                write!(f, "rate limited: retry after {retry_after_secs} s")
            }
            Self::Unavailable { message } => write!(f, "unavailable: {message}"),
        }
    }
}

impl std::error::Error for FanoutError {}

/// Gives every error in `response` whose source is a [`FanoutError`] the
/// contract's `extensions` (code included).
///
/// async-graphql converts any `Display` error with `?` and keeps it only as
/// the error's `source`; [`FanoutGraphQL`](crate::FanoutGraphQL) and the
/// [`FanoutExtension`](crate::FanoutExtension) call this on every operation's
/// response, so a resolver can use `?` on a
/// `FanoutError` and still answer with its code.
pub fn attach_codes(response: &mut async_graphql::Response) {
    attach_all_codes(response, None);
}

/// [`attach_codes`], and a code for async-graphql's own errors too, given
/// the operation's text:
///
/// - a variable missing or `null` for a non-null argument (async-graphql
///   reports it while executing, at the field's path) is `BAD_USER_INPUT`;
/// - an error without a path was raised before the operation ran, by
///   async-graphql's validation: `BAD_USER_INPUT` when it is an invalid
///   argument value that came from a variable (variable coercion), else
///   `GRAPHQL_VALIDATION_FAILED`.
pub(crate) fn attach_all_codes(response: &mut async_graphql::Response, query: Option<&str>) {
    code_errors(&mut response.errors, query);
}

/// [`attach_all_codes`] on a list of errors (what async-graphql's
/// validation returns).
pub(crate) fn code_errors(errors: &mut [ServerError], query: Option<&str>) {
    let mut doc = None;
    for error in errors {
        if error.extensions.is_some() {
            continue;
        }
        if let Some(fanout) = error.source::<FanoutError>() {
            error.extensions = Some(fanout.extensions());
            continue;
        }
        let Some(query) = query else { continue };
        let undefined_variable =
            error.message.starts_with("Variable ") && error.message.ends_with(" is not defined.");
        let code = if undefined_variable {
            "BAD_USER_INPUT"
        } else if !error.path.is_empty() {
            continue;
        } else if error.message.starts_with("Invalid value for argument")
            && error.locations.first().is_some_and(|pos| {
                let doc = doc.get_or_insert_with(|| async_graphql::parser::parse_query(query).ok());
                doc.as_ref()
                    .is_some_and(|doc| crate::shape::argument_is_variable(doc, *pos))
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
