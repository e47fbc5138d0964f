//! A whole HTTP request refused: [`Rejection`], its status and code.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use std::fmt;

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
