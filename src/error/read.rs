//! Errors of one read: [`ReadError`] (a field-level code each), and a
//! host limiter's [`HostRefusal`], which becomes one.

use async_graphql::{ErrorExtensionValues, ErrorExtensions};
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
    /// The request passed through more services than `budget.max_hops`
    /// allows (its caller's `Fanout-Budget` said so): no read of it is
    /// sent, whichever way it is asked for.
    TooManyHops {
        /// The services it passed through.
        hops: u64,
        /// `budget.max_hops`.
        max: u32,
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
            Self::TooManyHops { .. } => "FANOUT_TOO_MANY_HOPS",
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
            Self::TooManyHops { hops, max } => format!(
                "this request has passed through {hops} services, past the {max} allowed \
                 (budget.max_hops): a cycle of services, or a chain too long"
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
            Self::TooManyHops { hops, max } => {
                ext.set("hops", *hops);
                ext.set("max", *max);
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
                | Self::TooManyHops { .. }
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
