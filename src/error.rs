//! Errors, and the one place they are mapped to the contract's codes.
//!
//! Three kinds, each as narrow as what can go wrong where it is made:
//!
//! | type | made by | becomes |
//! |---|---|---|
//! | [`ReadError`] | a read (or a resolver refusing its input) | a GraphQL error with `extensions.code`, at the field's path |
//! | [`HostRefusal`] | a [`HostLimiter`](crate::read::HostLimiter) | a [`ReadError`] naming the host |
//! | [`Rejection`] | the HTTP integration, the limiter | a whole HTTP answer: status, `errors[0].extensions.code` |
//!
//! A [`ReadError`] converts into `async_graphql::Error` with its code
//! already in `extensions`, so `?` in a resolver keeps the code under any
//! executor — `FanoutGraphQL`, the extension, or a bare `schema.execute`.
//! It has no `Display` on purpose: async-graphql converts every `Display`
//! type into an error *without* extensions, and that blanket conversion
//! would win over ours. Its text is [`ReadError::message`].
//!
//! Errors of a whole operation (parse, validation, a refused estimate, the
//! deadline cutting it) are made here too (`operation_error`); async-graphql's
//! own errors get their codes where a response is finished (`finish.rs`).

use async_graphql::{ErrorExtensionValues, ErrorExtensions, Pos, ServerError};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use std::fmt;

/// Why a read failed or was refused: one variant per field-level code.
///
/// ```
/// use fanout_budget::ReadError;
///
/// let err = ReadError::BudgetExhausted { limit: 50 };
/// assert_eq!(err.code(), "FANOUT_BUDGET_EXHAUSTED");
/// // `?` in a resolver: the code travels in `extensions`.
/// let gql: async_graphql::Error = err.into();
/// let code = gql.extensions.unwrap().get("code").cloned();
/// assert_eq!(code, Some(async_graphql::Value::from("FANOUT_BUDGET_EXHAUSTED")));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError {
    /// The inbound HTTP request has used all of its upstream reads.
    BudgetExhausted {
        /// The request's read limit.
        limit: u64,
    },
    /// One upstream's share of the request's budget
    /// (`[upstreams."NAME"] max_reads`) is spent: that upstream's reads are
    /// refused, the other upstreams' go on. `FANOUT_BUDGET_EXHAUSTED`, as
    /// [`BudgetExhausted`](Self::BudgetExhausted), its extensions naming
    /// the upstream too.
    UpstreamBudgetExhausted {
        /// The upstream's name (its `[upstreams."NAME"]` table).
        upstream: String,
        /// Its share: the reads one request may send to it.
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
    /// The upstream answered, and the request's own bound on the answers it
    /// keeps (`upstream.max_request_bytes`, `http.max_answer_bytes`,
    /// `http.max_inflight_bytes`) stopped the answer: the request's doing,
    /// not the upstream's. `UPSTREAM_ERROR`, as [`Upstream`](Self::Upstream).
    AnswerBound {
        /// `host:port` of the upstream.
        host: String,
        /// The HTTP status the upstream answered with.
        status: u16,
        /// Which bound, for humans.
        message: String,
    },
    /// The process-wide cap of reads in flight to this host is full.
    HostSaturated {
        /// `host:port` of the upstream.
        host: String,
        /// The host's cap.
        max_concurrent: u32,
    },
    /// The shared host caps are unreachable and `failure_mode = "closed"`.
    Unavailable {
        /// Which backend, for humans.
        message: String,
    },
    /// The upstream wants credentials it was not given, or refused the
    /// ones it was given (`read/auth.rs`).
    Unauthorized {
        /// `host:port` of the upstream.
        host: String,
        /// What was missing or refused, for humans (never a credential).
        message: String,
    },
    /// The credentials were accepted but do not grant this resource.
    Forbidden {
        /// `host:port` of the upstream.
        host: String,
        /// What was refused, for humans.
        message: String,
    },
    /// The upstream said its own quota is spent (`read/quota.rs`): no read
    /// is sent to it until `retry_after_ms` from now.
    QuotaExhausted {
        /// `host:port` of the upstream.
        host: String,
        /// Milliseconds until the upstream said its quota is back.
        retry_after_ms: u64,
    },
    /// An argument is invalid (e.g. `first` outside `1..=100`): refused
    /// before anything is read.
    BadUserInput {
        /// What is wrong with the input.
        message: String,
    },
}

impl ReadError {
    /// The contract's `extensions.code`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BudgetExhausted { .. } | Self::UpstreamBudgetExhausted { .. } => {
                "FANOUT_BUDGET_EXHAUSTED"
            }
            Self::UpstreamTimeout { .. } => "UPSTREAM_TIMEOUT",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::Upstream { .. } | Self::AnswerBound { .. } => "UPSTREAM_ERROR",
            Self::HostSaturated { .. } => "HOST_SATURATED",
            Self::Unavailable { .. } => "UNAVAILABLE",
            Self::Unauthorized { .. } => "UPSTREAM_UNAUTHORIZED",
            Self::Forbidden { .. } => "UPSTREAM_FORBIDDEN",
            Self::QuotaExhausted { .. } => "UPSTREAM_QUOTA_EXHAUSTED",
            Self::BadUserInput { .. } => "BAD_USER_INPUT",
        }
    }

    /// The error's text, for humans.
    pub fn message(&self) -> String {
        match self {
            Self::BudgetExhausted { limit } => {
                format!("fan-out budget exhausted: this request may make {limit} upstream reads")
            }
            Self::UpstreamBudgetExhausted { upstream, limit } => format!(
                "fan-out budget exhausted for upstream {upstream}: this request may make {limit} reads to it"
            ),
            Self::UpstreamTimeout { host, timeout_ms } => {
                format!("upstream {host} did not answer within {timeout_ms} ms")
            }
            Self::DeadlineExceeded => {
                "the request deadline passed before this read finished".into()
            }
            Self::Upstream {
                host,
                status: Some(status),
                message,
            } => format!("upstream {host} answered {status}: {message}"),
            Self::Upstream {
                host,
                status: None,
                message,
            } => format!("upstream {host} failed: {message}"),
            Self::AnswerBound {
                host,
                status,
                message,
            } => format!("upstream {host} answered {status}: {message}"),
            Self::HostSaturated {
                host,
                max_concurrent,
            } => format!("upstream {host} is saturated ({max_concurrent} reads in flight)"),
            Self::Unavailable { message } => format!("unavailable: {message}"),
            Self::Unauthorized { host, message } => {
                format!("upstream {host} refused the request's credentials: {message}")
            }
            Self::Forbidden { host, message } => {
                format!("upstream {host} does not grant this: {message}")
            }
            Self::QuotaExhausted {
                host,
                retry_after_ms,
            } => format!(
                "upstream {host} said its quota is spent; no read is sent to it for {retry_after_ms} ms"
            ),
            Self::BadUserInput { message } => message.clone(),
        }
    }

    /// The error, for a log line or an error chain: `tracing::warn!(error =
    /// %err.display())`, `anyhow::anyhow!("{}", err.display())` (the type
    /// itself has no `Display`; see the module docs).
    pub fn display(&self) -> impl fmt::Display + '_ {
        struct Shown<'a>(&'a ReadError);
        impl fmt::Display for Shown<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{} ({})", self.0.message(), self.0.code())
            }
        }
        Shown(self)
    }

    /// The contract's `extensions` for this error, `code` included.
    pub fn extensions(&self) -> ErrorExtensionValues {
        let mut ext = ErrorExtensionValues::default();
        ext.set("code", self.code());
        match self {
            Self::BudgetExhausted { limit } => ext.set("limit", *limit),
            Self::UpstreamBudgetExhausted { upstream, limit } => {
                ext.set("limit", *limit);
                ext.set("upstream", upstream.as_str());
            }
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
            Self::AnswerBound { host, status, .. } => {
                ext.set("host", host.as_str());
                ext.set("status", *status);
            }
            Self::HostSaturated {
                host,
                max_concurrent,
            } => {
                ext.set("host", host.as_str());
                ext.set("maxConcurrent", *max_concurrent);
            }
            Self::Unauthorized { host, .. } | Self::Forbidden { host, .. } => {
                ext.set("host", host.as_str());
            }
            Self::QuotaExhausted {
                host,
                retry_after_ms,
            } => {
                ext.set("host", host.as_str());
                ext.set("retryAfterMs", *retry_after_ms);
            }
            Self::DeadlineExceeded | Self::Unavailable { .. } | Self::BadUserInput { .. } => {}
        }
        ext
    }

    /// Whether the read was refused before anything was sent upstream.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::BudgetExhausted { .. }
                | Self::UpstreamBudgetExhausted { .. }
                | Self::HostSaturated { .. }
                | Self::Unavailable { .. }
                | Self::QuotaExhausted { .. }
        )
    }
}

impl ErrorExtensions for ReadError {
    fn extend(&self) -> async_graphql::Error {
        async_graphql::Error {
            message: self.message(),
            source: Some(std::sync::Arc::new(self.clone())),
            extensions: Some(self.extensions()),
        }
    }
}

impl From<ReadError> for async_graphql::Error {
    fn from(err: ReadError) -> Self {
        err.extend()
    }
}

/// A [`HostLimiter`](crate::read::HostLimiter)'s refusal of a host slot (the read
/// path names the host when it makes the [`ReadError`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRefusal {
    /// The host's cap is full (or 0), and no slot came in time.
    Saturated {
        /// The host's cap.
        max_concurrent: u32,
    },
    /// The shared limiter is unreachable and `failure_mode = "closed"`.
    Unavailable {
        /// Which backend, for humans.
        message: String,
    },
}

impl HostRefusal {
    /// The contract's code of the read error it becomes.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Saturated { .. } => "HOST_SATURATED",
            Self::Unavailable { .. } => "UNAVAILABLE",
        }
    }

    /// The read error for a read to `host`.
    pub(crate) fn for_host(self, host: &str) -> ReadError {
        match self {
            Self::Saturated { max_concurrent } => ReadError::HostSaturated {
                host: host.to_string(),
                max_concurrent,
            },
            Self::Unavailable { message } => ReadError::Unavailable { message },
        }
    }
}

/// A whole HTTP request refused: its status, its code, one error.
///
/// ```
/// use fanout_budget::error::Rejection;
/// use http::StatusCode;
///
/// let refused = Rejection::BatchTooLarge { max: 20 };
/// assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(refused.code(), "BATCH_TOO_LARGE");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// Malformed JSON, an empty batch, or not a GraphQL request (400).
    BadRequest {
        /// What is wrong with the request.
        message: String,
    },
    /// The batch has more operations than `max_batch_operations` (400).
    BatchTooLarge {
        /// The configured maximum.
        max: usize,
    },
    /// The body is larger than `max_body_bytes` (413).
    PayloadTooLarge {
        /// The configured maximum.
        max: usize,
    },
    /// The body did not arrive within `min(body_read_timeout_ms, time left
    /// before the deadline)` (408).
    RequestTimeout {
        /// The bound the body had to arrive within.
        timeout_ms: u64,
    },
    /// The caller's inbound rate is exhausted (429, `Retry-After`).
    RateLimited {
        /// Whole seconds until a request would be admitted (at least 1).
        retry_after_secs: u64,
    },
    /// The client's read quota (`[quota]`) cannot cover the request's
    /// reservation (429, `Retry-After`, `RateLimit-Policy` / `RateLimit` of
    /// the quota).
    QuotaExhausted {
        /// The quota's name in the `RateLimit` fields (`reads`, `internal-reads`).
        policy: &'static str,
        /// The reads a full quota holds (its burst), as `RateLimit-Policy`'s `q`.
        quota: u64,
        /// Seconds a full quota takes to refill, as `RateLimit-Policy`'s `w`.
        period_secs: u64,
        /// The most reads the quota holds (its burst).
        limit: u64,
        /// Reads that fit now (fewer than the reservation).
        remaining: u64,
        /// Milliseconds until the reservation would fit (at least 1).
        retry_after_ms: u64,
    },
    /// A shared-state backend is down and `failure_mode = "closed"` (503).
    Unavailable {
        /// Which backend, for humans.
        message: String,
    },
    /// The answer would be larger than `http.max_response_bytes` when
    /// written, or held more than `http.max_answer_bytes` while it was built
    /// (200, `data: null`; the reads it made were charged).
    ResponseTooLarge {
        /// The bound it passed.
        max: usize,
    },
    /// The requests in flight hold `http.max_inflight_bytes`; this one
    /// needed more and was stopped (503, `Retry-After: 1`).
    Overloaded {
        /// The process's bound.
        max: usize,
    },
    /// The query texts the batch runs, persisted ones included, are longer
    /// than `http.max_body_bytes` together (413): a hash-only persisted
    /// query runs a text its body does not carry.
    QueryTooLarge {
        /// The configured maximum.
        max: usize,
    },
    /// The method cannot carry this request (405, `Allow`): a mutation over
    /// `GET`, or a method the endpoint does not serve.
    MethodNotAllowed {
        /// The methods that can.
        allow: &'static str,
        /// What is wrong with the request.
        message: String,
    },
    /// Nothing the `Accept` header offers can be answered (406).
    NotAcceptable,
    /// The body's `Content-Type` is not `application/json` (415).
    UnsupportedMediaType {
        /// The content type sent.
        content_type: String,
    },
    /// The app is wired so that a bound cannot hold (500), e.g. the rate
    /// limiter without the TCP peer, which would put every client in one
    /// bucket.
    Misconfigured {
        /// What is wrong, and how to fix it.
        message: String,
    },
}

impl Rejection {
    /// The contract's `extensions.code`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest { .. }
            | Self::MethodNotAllowed { .. }
            | Self::NotAcceptable
            | Self::UnsupportedMediaType { .. } => "BAD_REQUEST",
            Self::BatchTooLarge { .. } => "BATCH_TOO_LARGE",
            Self::PayloadTooLarge { .. } | Self::QueryTooLarge { .. } => "PAYLOAD_TOO_LARGE",
            Self::Overloaded { .. } => "OVERLOADED",
            Self::RequestTimeout { .. } => "REQUEST_TIMEOUT",
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::QuotaExhausted { .. } => "QUOTA_EXHAUSTED",
            Self::Unavailable { .. } => "UNAVAILABLE",
            Self::ResponseTooLarge { .. } => "RESPONSE_TOO_LARGE",
            Self::Misconfigured { .. } => "INTERNAL_SERVER_ERROR",
        }
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } | Self::BatchTooLarge { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } | Self::QueryTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::RateLimited { .. } | Self::QuotaExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::ResponseTooLarge { .. } => StatusCode::OK,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Self::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Misconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body: `{"errors":[{message, extensions}]}`.
    pub fn body(&self) -> serde_json::Value {
        let mut ext = serde_json::json!({ "code": self.code() });
        match self {
            Self::BatchTooLarge { max }
            | Self::PayloadTooLarge { max }
            | Self::QueryTooLarge { max }
            | Self::Overloaded { max }
            | Self::ResponseTooLarge { max } => ext["max"] = (*max as u64).into(),
            Self::RequestTimeout { timeout_ms } => ext["timeoutMs"] = (*timeout_ms).into(),
            Self::RateLimited { retry_after_secs } => {
                ext["retryAfter"] = (*retry_after_secs).into()
            }
            Self::QuotaExhausted {
                limit,
                remaining,
                retry_after_ms,
                ..
            } => {
                ext["limit"] = (*limit).into();
                ext["remaining"] = (*remaining).into();
                ext["retryAfterMs"] = (*retry_after_ms).into();
            }
            Self::BadRequest { .. }
            | Self::Unavailable { .. }
            | Self::Misconfigured { .. }
            | Self::MethodNotAllowed { .. }
            | Self::NotAcceptable
            | Self::UnsupportedMediaType { .. } => {}
        }
        let mut body = serde_json::json!({
            "errors": [{ "message": self.to_string(), "extensions": ext }]
        });
        if matches!(self, Self::ResponseTooLarge { .. }) {
            body["data"] = serde_json::Value::Null;
        }
        body
    }

    /// The answer for a request whose body was never read (429, 413, 408,
    /// a 400 decided from the headers, 503): `Connection: close`, so hyper
    /// ends the connection after it instead of draining a body it refused,
    /// and the client does not send its next request into that body.
    pub fn unread(&self) -> Response {
        let mut response = self.clone().into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if let Self::MethodNotAllowed { allow, .. } = self {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if let Self::RateLimited { retry_after_secs } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after_secs.into());
        }
        if let Self::QuotaExhausted {
            policy,
            quota,
            period_secs,
            remaining,
            retry_after_ms,
            ..
        } = self
        {
            let secs = retry_after_ms.div_ceil(1000).max(1);
            let headers = response.headers_mut();
            headers.insert(header::RETRY_AFTER, secs.into());
            let fields = [
                (
                    "ratelimit-policy",
                    format!("\"{policy}\";q={quota};w={period_secs}"),
                ),
                ("ratelimit", format!("\"{policy}\";r={remaining};t={secs}")),
            ];
            for (name, value) in fields {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.append(name, value);
                }
            }
        }
        if let Self::Overloaded { .. } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadRequest { message } => f.write_str(message),
            Self::BatchTooLarge { max } => write!(f, "a batch may hold at most {max} operations"),
            Self::PayloadTooLarge { max } => {
                write!(f, "the request body may be at most {max} bytes")
            }
            Self::RequestTimeout { timeout_ms } => {
                write!(f, "the request body did not arrive within {timeout_ms} ms")
            }
            Self::RateLimited { retry_after_secs } => {
                write!(f, "rate limited: retry after {retry_after_secs} s")
            }
            Self::QuotaExhausted {
                policy,
                remaining,
                retry_after_ms,
                ..
            } => write!(
                f,
                "the client's read quota ({policy}) has {remaining} reads left, fewer than the \
                 request reserves: retry after {retry_after_ms} ms"
            ),
            Self::Unavailable { message } => write!(f, "unavailable: {message}"),
            Self::ResponseTooLarge { max } => {
                write!(f, "the answer would be larger than {max} bytes")
            }
            Self::Overloaded { max } => write!(
                f,
                "the requests in flight hold all the memory they may ({max} bytes): retry later"
            ),
            Self::QueryTooLarge { max } => write!(
                f,
                "the query texts of the request, persisted ones included, may be at most {max} bytes"
            ),
            Self::Misconfigured { message } | Self::MethodNotAllowed { message, .. } => {
                f.write_str(message)
            }
            Self::NotAcceptable => f.write_str(
                "the Accept header offers nothing this endpoint answers \
                 (application/graphql-response+json or application/json)",
            ),
            Self::UnsupportedMediaType { content_type } => write!(
                f,
                "a GraphQL POST body must be application/json, not {content_type}"
            ),
        }
    }
}

impl std::error::Error for Rejection {}

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
            let message = format!(
                "this request has passed through {hops} services, past the {max} allowed \
                 (budget.max_hops): a cycle of services, or a chain too long"
            );
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

/// A shared-state backend (Redis) did not answer: unreachable, too slow,
/// or skipped while its breaker is open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// What went wrong, for humans.
    pub message: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unavailable: {}", self.message)
    }
}

impl std::error::Error for Unavailable {}
