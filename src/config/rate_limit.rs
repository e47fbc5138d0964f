//! `[rate_limit]`: inbound per-client limiting and internal callers, their
//! keys and their rules.

use super::cidr::Cidr;
use super::error::{at_least_one, ConfigError};
use super::mode::LimitMode;
use serde::Deserialize;
use std::fmt;

section! {
    /// `[rate_limit]`
    #[derive(Clone, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct RateLimitConfig {
        /// Inbound requests per minute per client IP, on `/graphql` only.
        pub requests_per_minute: u32 = 300,
        /// The internal callers' token; empty: no internal callers.
        /// The environment variable `FANOUT_INTERNAL_TOKEN` overrides it.
        pub internal_token: String = String::new() => into,
        /// CIDRs whose `X-Forwarded-For` is believed.
        pub trusted_proxies: Vec<String> = Vec::new() => list,
        /// IPv4 clients are keyed by this prefix length (32: each address).
        pub ipv4_prefix: u8 = 32,
        /// IPv6 clients are keyed by this prefix length (64: one subnet, what
        /// one host is usually given).
        pub ipv6_prefix: u8 = 64,
        /// `"enforce"` answers 429 past the rate; `"measure"` answers every
        /// request and counts those it would have refused
        /// (`fanout_would_refuse_total{limit="rate_limit"}`).
        pub mode: LimitMode = LimitMode::Enforce,
    }
}

impl RateLimitConfig {
    /// A rate of at least 1, proxies that are CIDRs, prefixes no longer
    /// than their addresses.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        at_least_one(
            "rate_limit",
            [("requests_per_minute", self.requests_per_minute.into())],
        )?;
        for cidr in &self.trusted_proxies {
            if Cidr::parse(cidr).is_none() {
                return Err(ConfigError::new(
                    "rate_limit.trusted_proxies",
                    format!("\"{cidr}\" is not a CIDR (e.g. \"10.0.0.0/8\")"),
                ));
            }
        }
        if self.ipv4_prefix > 32 {
            return Err(ConfigError::rule(
                "rate_limit.ipv4_prefix",
                "must be at most 32",
            ));
        }
        if self.ipv6_prefix > 128 {
            return Err(ConfigError::rule(
                "rate_limit.ipv6_prefix",
                "must be at most 128",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for RateLimitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: never print it.
        f.debug_struct("RateLimitConfig")
            .field("requests_per_minute", &self.requests_per_minute)
            .field(
                "internal_token",
                &if self.internal_token.is_empty() {
                    ""
                } else {
                    "<set>"
                },
            )
            .field("trusted_proxies", &self.trusted_proxies)
            .field("ipv4_prefix", &self.ipv4_prefix)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .field("mode", &self.mode)
            .finish()
    }
}
