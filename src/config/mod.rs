//! Configuration: the contract's TOML keys, their defaults, and their checks.
//!
//! Every key is optional. Unknown keys, wrong types and impossible values are
//! a [`ConfigError`] naming the key ([`ConfigError::key`]: `budget.max_reads`),
//! so a typo stops start-up instead of silently running on a default.
//!
//! One file per section, each with its keys, their defaults and the rules
//! they must keep: `budget.rs` (`[budget]`), `http.rs` (`[http]`),
//! `hosts.rs` (`[hosts."HOST:PORT"]`), `quota.rs` (`[quota]`), `rate_limit.rs` (`[rate_limit]`),
//! `redis.rs` (`[redis]`), `subscriptions.rs` (`[subscriptions]`), `telemetry.rs`
//! (`[telemetry]`), `upstream.rs` (`[upstream]`), `upstreams.rs`
//! (`[upstreams."NAME"]`); `error.rs` the
//! error, how a TOML error finds its key, and the rule they share (`at
//! least 1`). The sections name `error.rs` and nothing else here. This file
//! holds [`Config`] (the whole file), its loading and its
//! [`validate`](Config::validate).
//!
//! Every struct is `#[non_exhaustive]`, so a key added later breaks no user:
//! build one from `Default` (or TOML) and set what you need, with the
//! chainable setter each field has or by assigning the public field.
//!
//! ```
//! use fanout_budget::config::{BudgetConfig, Config, HostConfig};
//!
//! let config = Config::default()
//!     .budget(BudgetConfig::default().max_reads(20))
//!     .host("registry:5000", HostConfig::default().max_concurrent(4).acquire_wait_ms(500));
//! assert_eq!(config, Config::from_toml(
//!     "[budget]\nmax_reads = 20\n[hosts.\"registry:5000\"]\nmax_concurrent = 4\nacquire_wait_ms = 500\n",
//! ).unwrap());
//! let mut config = config;
//! config.budget.max_reads = 0;
//! assert_eq!(config.validate().unwrap_err().key(), Some("budget.max_reads"));
//! ```

/// Declares a configuration section: the struct as written, `#[non_exhaustive]`,
/// each field public and documented with its default after `=`; its
/// `Default`; and per field a chainable setter of the same name, documented
/// as the field is. A setter takes the field's type, or with `=> into` any
/// `impl Into<T>` (a `&str` for a `String`, the value for an `Option`), or
/// with `=> list` any list of `impl Into<String>`.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:expr])*
                pub $field:ident: $ty:ty = $default:expr $(=> $kind:ident)?,
            )*
        }
    ) => {
        $(#[$meta])*
        #[non_exhaustive]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl $name {
            $( section!(@setter [$($kind)?] $field: $ty, $($doc)*); )*
        }
    };
    (@setter [] $field:ident: $ty:ty, $($doc:expr)*) => {
        section!(@doc $field, $($doc)*;
            pub fn $field(mut self, value: $ty) -> Self {
                self.$field = value;
                self
            });
    };
    (@setter [into] $field:ident: $ty:ty, $($doc:expr)*) => {
        section!(@doc $field, $($doc)*;
            pub fn $field(mut self, value: impl Into<$ty>) -> Self {
                self.$field = value.into();
                self
            });
    };
    (@setter [list] $field:ident: $ty:ty, $($doc:expr)*) => {
        section!(@doc $field, $($doc)*;
            pub fn $field(mut self, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
                self.$field = values.into_iter().map(Into::into).collect();
                self
            });
    };
    (@doc $field:ident, $($doc:expr)*; $setter:item) => {
        #[doc = concat!("Sets `", stringify!($field), "`:")]
        #[doc = ""]
        $(#[doc = $doc])*
        #[must_use]
        $setter
    };
}

mod budget;
pub(crate) mod cidr;
mod error;
mod hosts;
mod http;
mod mode;
mod quota;
mod rate_limit;
mod redis;
mod subscriptions;
mod telemetry;
#[cfg(test)]
mod tests;
mod upstream;
mod upstreams;

pub use budget::BudgetConfig;
pub use error::ConfigError;
pub use hosts::HostConfig;
pub use http::{CsrfGet, HttpConfig};
pub use mode::LimitMode;
pub use quota::QuotaConfig;
pub use rate_limit::RateLimitConfig;
#[cfg(feature = "redis")]
pub(crate) use redis::share_use;
pub use redis::{FailureMode, RedisConfig};
pub use subscriptions::SubscriptionsConfig;
pub use telemetry::TelemetryConfig;
pub use upstream::UpstreamConfig;
pub use upstreams::{Secret, UpstreamTable};

use serde::Deserialize;
use std::collections::BTreeMap;

section! {
    /// The whole configuration file.
    ///
    /// ```
    /// use fanout_budget::Config;
    ///
    /// let config = Config::from_toml("[budget]\nmax_reads = 20\n").unwrap();
    /// assert_eq!(config.budget.max_reads, 20);
    /// let typo = Config::from_toml("[budget]\nmax_read = 20\n").unwrap_err();
    /// assert!(typo.to_string().contains("max_read"), "{typo}");
    /// assert_eq!(typo.key(), Some("budget.max_read"));
    /// assert_eq!(typo.line(), Some(2));
    /// ```
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct Config {
        /// `[budget]`: the per-request read budget.
        pub budget: BudgetConfig = BudgetConfig::default(),
        /// `[http]`: limits on the inbound HTTP request.
        pub http: HttpConfig = HttpConfig::default(),
        /// `[hosts."HOST:PORT"]`: process-wide caps per upstream host
        /// (one host at a time: [`host`](Self::host)).
        pub hosts: BTreeMap<String, HostConfig> = BTreeMap::new(),
        /// `[rate_limit]`: inbound per-IP limiting and internal callers.
        pub rate_limit: RateLimitConfig = RateLimitConfig::default(),
        /// `[quota]`: upstream reads per client over time (off by default).
        pub quota: QuotaConfig = QuotaConfig::default(),
        /// `[redis]`: shared state across replicas.
        pub redis: RedisConfig = RedisConfig::default(),
        /// `[upstream]`: limits on what one upstream response may cost.
        pub upstream: UpstreamConfig = UpstreamConfig::default(),
        /// `[upstreams."NAME"]`: the upstreams read by name, with their
        /// credentials (one at a time: [`upstream_named`](Self::upstream_named)).
        pub upstreams: BTreeMap<String, UpstreamTable> = BTreeMap::new(),
        /// `[subscriptions]`: subscriptions over WebSocket, one budget per
        /// connection that refills over time.
        pub subscriptions: SubscriptionsConfig = SubscriptionsConfig::default(),
        /// `[telemetry]`: traces exported over OTLP (off by default; exported
        /// only by a build with the `otel` feature).
        pub telemetry: TelemetryConfig = TelemetryConfig::default(),
    }
}

impl Config {
    /// Sets the table of one host, `HOST:PORT` (`[hosts."HOST:PORT"]`),
    /// replacing any it had.
    #[must_use]
    pub fn host(mut self, host: impl Into<String>, table: HostConfig) -> Self {
        self.hosts.insert(host.into(), table);
        self
    }

    /// Sets the table of one upstream named `name` (`[upstreams."NAME"]`),
    /// replacing any it had.
    #[must_use]
    pub fn upstream_named(mut self, name: impl Into<String>, table: UpstreamTable) -> Self {
        self.upstreams.insert(name.into(), table);
        self
    }

    /// Parses TOML, then [`validate`](Self::validate)s it.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config = Self::from_toml_unchecked(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML (unknown keys and wrong types refused, naming the key)
    /// without the rules of [`validate`](Self::validate): for a caller
    /// that changes the configuration before validating it (the gateway
    /// moves credentials out of upstream URLs first).
    pub fn from_toml_unchecked(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::from_toml(text, &e))
    }

    /// Applies the environment's overrides (`FANOUT_INTERNAL_TOKEN`).
    pub fn with_env(mut self) -> Self {
        if let Ok(token) = std::env::var("FANOUT_INTERNAL_TOKEN") {
            self.rate_limit.internal_token = token;
        }
        self
    }

    /// Rejects impossible values; the error names the key
    /// ([`ConfigError::key`]). Each section's rules are checked in its file.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.budget.check()?;
        self.http.check()?;
        for (host, table) in &self.hosts {
            table.check(host)?;
        }
        self.rate_limit.check()?;
        self.quota.check()?;
        self.redis.check()?;
        self.subscriptions.check()?;
        self.telemetry.check()?;
        for (name, table) in &self.upstreams {
            table.check(name)?;
        }
        upstreams::check_origins(&self.upstreams)?;
        // A read to a service on the engine gives it its time less the
        // 100 ms it may take to answer past it: a read timeout of 100 ms or
        // less would give it none (`read/propagate.rs`).
        let propagates = self.hosts.values().any(|h| h.propagate)
            || self.upstreams.values().any(|t| t.propagate);
        if propagates && self.budget.read_timeout_ms <= 100 {
            return Err(ConfigError::new(
                "budget.read_timeout_ms",
                "must be above 100 when a host propagates the budget: a service \
                 on the engine is given the read's time less the 100 ms it may \
                 take to answer",
            ));
        }
        if let Some((second, _)) = self.upstreams.iter().filter(|(_, t)| t.primary).nth(1) {
            return Err(ConfigError::new(
                format!("upstreams.{}.primary", error::key_segment(second)),
                "at most one upstream is primary",
            ));
        }
        Ok(())
    }
}
